//! Where figures live between runs: criterion's output directory, and in it one JSON file per custom
//! bench and baseline, `<criterion home>/pipefill-bench/<bench>/<baseline>.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::measure::Measurement;

/// Criterion's output directory, found as criterion finds it: `$CRITERION_HOME`, else
/// `$CARGO_TARGET_DIR/criterion`, else the target directory `cargo metadata` names (cargo sets
/// `$CARGO` for the benches it runs), else `target/criterion`.
pub fn criterion_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir).join("criterion");
    }
    metadata_target_dir()
        .map(|d| d.join("criterion"))
        .unwrap_or_else(|| PathBuf::from("target/criterion"))
}

fn metadata_target_dir() -> Option<PathBuf> {
    let cargo = std::env::var_os("CARGO")?;
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v.get("target_directory")?.as_str().map(PathBuf::from)
}

/// The saved figures of one bench under one baseline name.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Saved {
    /// By measurement name.
    pub measurements: BTreeMap<String, Measurement>,
}

/// The file of `bench`'s baseline `name` under `home`.
pub fn baseline_path(home: &Path, bench: &str, name: &str) -> PathBuf {
    home.join("pipefill-bench")
        .join(bench)
        .join(format!("{name}.json"))
}

/// Loads a saved baseline: `Ok(None)` when the file does not exist.
pub fn load(path: &Path) -> Result<Option<Saved>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        format!(
            "{} is not a saved baseline ({e}): delete it and save the baseline again",
            path.display()
        )
    })
}

/// Saves `measurements` under `path`, keeping the figures of the file that this run did not
/// measure (a filtered run updates only what it ran).
pub fn save(path: &Path, measurements: &[Measurement]) -> Result<(), String> {
    let mut saved = load(path)?.unwrap_or_default();
    for m in measurements {
        saved.measurements.insert(m.name.clone(), m.clone());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&saved).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))
}
