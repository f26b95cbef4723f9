//! Shared helpers of the command-line tests: run the built `pipefill` binary, make scratch folders.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `pipefill ARGS` in `dir` (or the test's folder) and returns exit code, stdout and stderr.
pub fn pipefill_in(dir: Option<&Path>, args: &[&str]) -> (i32, String, String) {
    // `PIPEFILL_BIN` when set (`scripts/gpu-check.sh run` sets it: the bundle's copy, since the
    // build machine's path does not exist on the GPU machine), else the one cargo built.
    let bin = std::env::var_os("PIPEFILL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pipefill")));
    let mut cmd = Command::new(bin);
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    let out = cmd.args(args).output().expect("run pipefill");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `pipefill ARGS` and returns exit code, stdout and stderr.
pub fn pipefill(args: &[&str]) -> (i32, String, String) {
    pipefill_in(None, args)
}

/// A scratch folder for this test process, `pipefill-<tag>-<pid>` under the temp dir (created).
#[allow(dead_code)]
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pipefill-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("create a scratch folder");
    d
}

/// Asserts that each `pipefill ARGS` exits with code 2 and names `needle` in its error.
#[allow(dead_code)]
pub fn assert_refused<'a>(cases: impl IntoIterator<Item = (Vec<&'a str>, &'a str)>) {
    for (args, needle) in cases {
        let (code, _, err) = pipefill(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected `{needle}` in: {err}"
        );
    }
}

/// A small two-rank `train` run (four layers: room for `V = 2`; four microbatches: DualPipeV needs
/// `M >= 2P`; equal layer counts, so every launcher splits alike), JSON on stdout. Tests append
/// their own flags.
#[allow(dead_code)]
pub const SMALL_TRAIN: [&str; 15] = [
    "train",
    "--ranks",
    "2",
    "--layers",
    "4",
    "--hidden",
    "32",
    "--batch",
    "32",
    "--microbatches",
    "4",
    "--plan",
    "uniform",
    "--format",
    "json",
];

/// `SMALL_TRAIN` followed by `extra`.
#[allow(dead_code)]
pub fn small_train<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    SMALL_TRAIN
        .iter()
        .copied()
        .chain(extra.iter().copied())
        .collect()
}

/// The per-step losses of a run's JSON output; the run must have exited 0.
#[allow(dead_code)]
pub fn losses((code, out, err): (i32, String, String)) -> Vec<f32> {
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    serde_json::from_value(v["losses"].clone()).expect("losses")
}

/// The command `mpirun --oversubscribe -n N pipefill ARGS` in `dir`, not started. Root is allowed
/// (CI runs as root).
#[allow(dead_code)]
pub fn mpirun_command(dir: &Path, n: usize, args: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.current_dir(dir)
        .args(["--oversubscribe", "-n", &n.to_string()])
        .arg(env!("CARGO_BIN_EXE_pipefill"))
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

/// [`mpirun_command`] run to its end: exit code, stdout, stderr.
#[allow(dead_code)]
pub fn mpirun(dir: &Path, n: usize, args: &[&str]) -> (i32, String, String) {
    let out = mpirun_command(dir, n, args)
        .output()
        .expect("run mpirun (install OpenMPI: see .ci/run)");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The distinct `(ranks, data_parallel)` splits of `plan --format json` rows, sorted.
#[allow(dead_code)]
pub fn splits<'a>(plans: impl IntoIterator<Item = &'a serde_json::Value>) -> Vec<(u64, u64)> {
    let field = |p: &serde_json::Value, k: &str| p[k].as_u64().expect("a count");
    let mut s: Vec<(u64, u64)> = plans
        .into_iter()
        .map(|p| (field(p, "ranks"), field(p, "data_parallel")))
        .collect();
    s.sort();
    s.dedup();
    s
}
