//! `pipefill train --launcher mpi` (feature `mpi`): under `mpirun -n 2` every schedule family trains
//! with the losses of the threaded run; a world of another size is refused; a checkpoint saved by
//! the processes resumes in either launcher with an uninterrupted run's losses. Needs OpenMPI's
//! `mpirun` on the path (`.ci/run` installs it).
#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::process::Command;

use common::{pipefill_in, scratch};

/// Two ranks, four layers (room for `V = 2`), four microbatches (DualPipeV needs `M >= 2P`), equal
/// layer counts (so both launchers split alike), JSON out.
const RUN: [&str; 17] = [
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
    "--svg",
    "t.svg",
    "--format",
    "json",
];

/// `mpirun -n N pipefill ARGS` in `dir`: exit code, stdout, stderr. Root is allowed (CI runs as
/// root).
fn mpirun(dir: &Path, n: usize, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("mpirun")
        .current_dir(dir)
        .args(["--oversubscribe", "-n", &n.to_string()])
        .arg(env!("CARGO_BIN_EXE_pipefill"))
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .expect("run mpirun (install OpenMPI: see .ci/run)");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The losses of a run's JSON output (exit code 0 required).
fn losses((code, out, err): (i32, String, String)) -> Vec<f32> {
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    serde_json::from_value(v["losses"].clone()).expect("losses")
}

fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    RUN.iter().copied().chain(extra.iter().copied()).collect()
}

/// `|a - b| <= 1e-6` step by step, and as many steps.
fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: {a:?} vs {b:?}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-6, "{what}: step {i}: {x} vs {y}");
    }
}

#[test]
fn every_family_under_mpirun_has_the_losses_of_the_threaded_run() {
    let dir = scratch("mpi-families");
    let families = [
        "gpipe",
        "1f1b",
        "interleaved-1f1b",
        "looped-bfs",
        "zb-h1",
        "zb-h2",
        "interleaved-zb",
        "zbv",
        "dualpipev",
    ];
    for family in families {
        let args = with(&["--schedule", family, "--steps", "3"]);
        let threads = losses(pipefill_in(Some(&dir), &args));
        let mpi_args = [&args[..], &["--launcher", "mpi"]].concat();
        let mpi = losses(mpirun(&dir, 2, &mpi_args));
        assert_close(&mpi, &threads, family);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_world_of_another_size_is_refused() {
    let dir = scratch("mpi-size");
    let (code, out, err) = mpirun(&dir, 3, &with(&["--launcher", "mpi"]));
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("the MPI world has 3 processes for 2 ranks") && err.contains("mpirun -n 2"),
        "{err}"
    );
    assert_eq!(
        err.matches("error:").count(),
        1,
        "one report, not one per process: {err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_checkpoint_saved_under_mpirun_resumes_in_either_launcher() {
    let dir = scratch("mpi-checkpoint");
    let s = ["--schedule", "zbv"];
    let full = losses(pipefill_in(
        Some(&dir),
        &with(&[&s[..], &["--steps", "5"]].concat()),
    ));
    let save = [
        &s[..],
        &["--steps", "2", "--launcher", "mpi", "--checkpoint", "ck"],
    ]
    .concat();
    let head = losses(mpirun(&dir, 2, &with(&save)));
    assert_close(&head, &full[..2], "the first steps under mpirun");
    let resume = [&s[..], &["--steps", "5", "--resume", "ck"]].concat();
    let threads = losses(pipefill_in(Some(&dir), &with(&resume)));
    assert_close(&threads, &full[2..], "resumed in threads");
    let mpi = losses(mpirun(
        &dir,
        2,
        &with(&[&resume[..], &["--launcher", "mpi"]].concat()),
    ));
    assert_close(&mpi, &full[2..], "resumed under mpirun");
    std::fs::remove_dir_all(&dir).ok();
}
