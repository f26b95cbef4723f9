//! `pipefill bench overlap`: kernel-level overlap on one GPU, measured
//! ([`crate::cuda::overlap`]).
//!
//! ```text
//! pipefill bench overlap [--hidden 512,1024,2048,4096] [--rows 256] [--layers 2] [--repeats 5] [--json]
//! ```
//!
//! For each size, one stage's `F` kernels on one stream and another stage's `B` kernels (`I` then
//! `W`) on a second stream, alone and together (device time from CUDA events, median of the
//! repeats). Prints the pair's time against `F + B` (no overlap) and against `max(F, B)` (perfect
//! overlap), and the `overlap_share` it implies, which `simulate --overlap-share` and the cost
//! file's `overlap_share` take. Without a GPU it prints `skipped: no CUDA device ...` and succeeds
//! (with `PIPEFILL_REQUIRE_GPU=1` it fails instead).

use crate::cli::CliError;
use crate::cuda::overlap::{measure_overlap, OverlapResult, OverlapSize};
use crate::cuda::skip::{gpu_required, REQUIRE_GPU_VAR, SKIP_LINE};
use crate::cuda::{Gpu, Precision};

/// Flags of `pipefill bench overlap`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Layer widths to measure, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "512,1024,2048,4096")]
    pub hidden: String,
    /// Rows per microbatch, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "256")]
    pub rows: String,
    /// Layers per stage.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Timed rounds per size (the median is kept; one untimed round first).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Arithmetic of the layers' matrix products: tf32 (tensor cores), fp32 (exact, SIMT kernels)
    /// or bf16 (tensor cores).
    #[arg(long, value_name = "tf32|fp32|bf16", default_value = "tf32")]
    pub precision: Precision,
}

/// A comma-separated list of sizes >= 1 given to `flag`.
fn list(flag: &str, text: &str) -> Result<Vec<usize>, CliError> {
    text.split(',')
        .map(|x| match x.trim().parse::<usize>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(CliError::Usage(format!(
                "{flag} {text}: `{}` is not a whole number >= 1; give numbers separated by commas \
                 (e.g. `{flag} 1024,2048`)",
                x.trim()
            ))),
        })
        .collect()
}

/// The sizes the flags ask for (checked: exit code 2 on a bad value).
pub fn sizes(args: &Args) -> Result<Vec<OverlapSize>, CliError> {
    if args.layers == 0 || args.repeats == 0 {
        return Err(CliError::Usage(
            "--layers and --repeats must be at least 1".into(),
        ));
    }
    let rows = list("--rows", &args.rows)?;
    let hidden = list("--hidden", &args.hidden)?;
    Ok(hidden
        .iter()
        .flat_map(|&h| {
            rows.iter().map(move |&r| OverlapSize {
                hidden: h,
                rows: r,
                layers: args.layers,
                precision: args.precision,
            })
        })
        .collect())
}

/// Runs `pipefill bench overlap`.
pub fn run(args: Args) -> Result<(), CliError> {
    let sizes = sizes(&args)?;
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(e) if e.is_unavailable() => {
            if gpu_required(std::env::var(REQUIRE_GPU_VAR).ok().as_deref()) {
                return Err(CliError::Failed(format!(
                    "bench overlap: {e}, and {REQUIRE_GPU_VAR}=1 asks for a GPU"
                )));
            }
            println!("{SKIP_LINE}\n  (bench overlap: {e})");
            return Ok(());
        }
        Err(e) => return Err(CliError::Failed(format!("bench overlap: {e}"))),
    };
    let mut results = Vec::with_capacity(sizes.len());
    for size in sizes {
        let r = measure_overlap(&gpu, size, args.repeats)
            .map_err(|e| CliError::Failed(format!("bench overlap at {size:?}: {e}")))?;
        results.push(r);
    }
    if args.json {
        println!("{}", json(&results));
    } else {
        print!("{}", table(&results));
    }
    Ok(())
}

/// The median of the measured shares (what to pass as `--overlap-share`).
pub fn typical_share(results: &[OverlapResult]) -> f64 {
    let mut s: Vec<f64> = results.iter().map(OverlapResult::share).collect();
    pipefill_host::profile::median(&mut s)
}

/// The results as a text table, with the share to use.
pub fn table(results: &[OverlapResult]) -> String {
    let ms = |s: f64| s * 1e3;
    let mut out = format!(
        "{:>6} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7}\n",
        "hidden",
        "rows",
        "layers",
        "F ms",
        "B ms",
        "F+B ms",
        "max ms",
        "pair ms",
        "pair/sum",
        "pair/max",
        "share"
    );
    for r in results {
        let (sum, max) = (r.forward + r.backward, r.forward.max(r.backward));
        out += &format!(
            "{:>6} {:>6} {:>6} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>8.3} {:>8.3} {:>7.3}\n",
            r.size.hidden,
            r.size.rows,
            r.size.layers,
            ms(r.forward),
            ms(r.backward),
            ms(sum),
            ms(max),
            ms(r.pair),
            r.pair / sum,
            r.pair / max,
            r.share()
        );
    }
    out += &format!(
        "overlap_share (median over sizes): {:.3}; use it with `pipefill simulate --overlap-share X` \
         or as the cost file's `overlap_share`\n",
        typical_share(results)
    );
    out
}

/// The results as one JSON object.
pub fn json(results: &[OverlapResult]) -> String {
    let rows: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            serde_json::json!({
                "hidden": r.size.hidden,
                "rows": r.size.rows,
                "layers": r.size.layers,
                "forward_s": r.forward,
                "backward_s": r.backward,
                "pair_s": r.pair,
                "overlap_share": r.share(),
            })
        })
        .collect();
    serde_json::json!({ "sizes": rows, "overlap_share": typical_share(results) }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(hidden: &str, rows: &str) -> Args {
        Args {
            hidden: hidden.into(),
            rows: rows.into(),
            layers: 2,
            repeats: 3,
            json: false,
            precision: Precision::Bf16,
        }
    }

    #[test]
    fn sizes_are_every_width_at_every_row_count() {
        let s = sizes(&args("8,16", "4")).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!((s[1].hidden, s[1].rows, s[1].layers), (16, 4, 2));
        assert_eq!(s[1].precision, Precision::Bf16);
        assert!(matches!(sizes(&args("8,x", "4")), Err(CliError::Usage(m)) if m.contains("`x`")));
        assert!(matches!(sizes(&args("8", "0")), Err(CliError::Usage(_))));
    }

    #[test]
    fn the_table_shows_the_share_of_each_size_and_their_median() {
        let r = OverlapResult {
            size: OverlapSize {
                hidden: 8,
                rows: 4,
                layers: 1,
                precision: Precision::Tf32,
            },
            forward: 0.002,
            backward: 0.001,
            pair: 0.0025,
        };
        let t = table(&[r]);
        assert!(t.contains("0.500"), "{t}");
        assert!(
            t.contains("overlap_share (median over sizes): 0.500"),
            "{t}"
        );
        let j: serde_json::Value = serde_json::from_str(&json(&[r])).unwrap();
        assert_eq!(j["overlap_share"], 0.5);
    }
}
