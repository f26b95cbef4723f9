//! The run half of `scripts/gpu-check.sh`, rehearsed on this machine (no GPU): in a bundle holding
//! only the script, the binary and the PTX, `gpu-check.sh run` must end within a minute, state its
//! budget, put the environment lines before the step table, give every step a cap of at most 180 s,
//! stop after the failed module load, and report no step as `ok`; its exit status is non-zero.
//! On a machine with a GPU the rehearsal says so and checks only the summary's shape.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), to.display()));
}

#[test]
fn the_run_half_without_a_gpu_is_quick_capped_and_never_ok() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bundle = std::env::temp_dir().join(format!("pipefill-gpu-bundle-{}", std::process::id()));
    std::fs::create_dir_all(&bundle).unwrap();
    copy(
        &root.join("scripts/gpu-check.sh"),
        &bundle.join("gpu-check.sh"),
    );
    copy(
        Path::new(env!("CARGO_BIN_EXE_pipefill")),
        &bundle.join("pipefill"),
    );
    std::fs::write(bundle.join("kernels.ptx"), pipefill::ptx::PTX.unwrap_or("")).unwrap();
    let out = bundle.join("out");
    let started = Instant::now();
    let run = Command::new("bash")
        .arg(bundle.join("gpu-check.sh"))
        .arg("run")
        .env("OUT", &out)
        .env_remove("PIPEFILL_CUBIN")
        .output()
        .expect("run gpu-check.sh");
    let took = started.elapsed();
    let summary = std::fs::read_to_string(out.join("summary.md")).expect("a summary.md");
    let gpu_here = pipefill::cuda::probe().is_ok();
    std::fs::remove_dir_all(&bundle).ok();
    println!("{summary}");

    assert!(
        summary.contains("- budget: 300 s"),
        "no budget line:\n{summary}"
    );
    let table = summary
        .find("| step | result | seconds | cap |")
        .expect("the step table");
    for line in [
        "- card:",
        "- driver:",
        "- compute mode:",
        "- mig:",
        "- nccl:",
        "- libraries:",
    ] {
        let at = summary
            .find(line)
            .unwrap_or_else(|| panic!("no `{line}` line:\n{summary}"));
        assert!(at < table, "`{line}` comes after the table");
    }
    let rows: Vec<Vec<&str>> = summary[table..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with("| "))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    assert!(rows.len() >= 10, "too few steps:\n{summary}");
    for row in &rows {
        assert_eq!(row.len(), 4, "a row of four cells: {row:?}");
        let cap: u64 = row[3].parse().expect("a cap in seconds");
        assert!(cap <= 180, "{}: cap {cap} s", row[0]);
    }
    assert_eq!(rows[0][0], "env", "the environment step first");
    assert_eq!(rows[1][0], "module-load", "the module load second");
    if gpu_here {
        println!("a GPU is present here: only the summary's shape was checked");
        return;
    }
    assert!(
        took < Duration::from_secs(60),
        "the rehearsal took {took:?}"
    );
    assert!(!run.status.success(), "exit 0 without a GPU");
    for row in &rows {
        assert_ne!(
            row[1], "ok",
            "{} reads ok without a GPU:\n{summary}",
            row[0]
        );
    }
    assert!(
        rows[1][1].starts_with("FAILED"),
        "module-load: {}",
        rows[1][1]
    );
    for row in &rows[2..] {
        assert!(
            row[1].starts_with("not run") || row[1].starts_with("NOT VERIFIED"),
            "{} after a failed module load: {}",
            row[0],
            row[1]
        );
    }
}
