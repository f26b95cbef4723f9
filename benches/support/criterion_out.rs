//! Reading back what criterion wrote during this run: every benchmark it measured leaves
//! `<home>/<id>/new/benchmark.json` (its full id) and `new/estimates.json` (median and mean, in
//! nanoseconds); with `--save-baseline NAME` it also copies `new/` to `NAME/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// `new/benchmark.json` files under `home` and when each was last written.
pub type Snapshot = BTreeMap<PathBuf, SystemTime>;

/// Every `new/benchmark.json` under `home` (criterion ids are at most four directories deep).
pub fn snapshot(home: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    walk(home, 0, &mut out);
    out
}

fn walk(dir: &Path, depth: usize, out: &mut Snapshot) {
    if depth > 6 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if e.file_name() == "new" {
            let file = path.join("benchmark.json");
            if let Ok(modified) = std::fs::metadata(&file).and_then(|m| m.modified()) {
                out.insert(file, modified);
            }
        } else if e.file_name() != "report" && e.file_name() != "pipefill-bench" {
            walk(&path, depth + 1, out);
        }
    }
}

/// One benchmark criterion measured in this run.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// Criterion's full id, e.g. `sim/simulate/interleaved-1f1b_P8_M64_V2_2048actions`.
    pub id: String,
    /// Median time per iteration, nanoseconds.
    pub median_ns: f64,
    /// The directory holding `new/`, where saved baselines sit beside it.
    pub dir: PathBuf,
}

/// The benchmarks whose `new/benchmark.json` appeared or changed since `before`, in id order.
pub fn written_since(home: &Path, before: &Snapshot) -> Vec<Measured> {
    let mut out: Vec<Measured> = snapshot(home)
        .into_iter()
        .filter(|(path, t)| before.get(path) != Some(t))
        .filter_map(|(path, _)| {
            let new_dir = path.parent()?;
            let id = read_json(&path)?.get("full_id")?.as_str()?.to_string();
            let median_ns = median_ns(&new_dir.join("estimates.json"))?;
            Some(Measured {
                id,
                median_ns,
                dir: new_dir.parent()?.to_path_buf(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// The median point estimate (ns) of a criterion `estimates.json`.
pub fn median_ns(estimates: &Path) -> Option<f64> {
    read_json(estimates)?
        .get("median")?
        .get("point_estimate")?
        .as_f64()
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}
