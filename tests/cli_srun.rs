//! `srun` as the launcher (feature `mpi`): under Slurm, `srun --mpi=pmix -n 4 pipefill train
//! --launcher mpi --ranks 2 --data-parallel 2` trains with the losses of the threaded run, and a
//! world of another size is refused once, with exit code 2.
//!
//! Needs a running Slurm controller (`scripts/slurm-local.sh start` makes a one-node cluster here;
//! `.ci/run` does that). Without one the tests print that they skipped and why; with
//! `PIPEFILL_REQUIRE_SRUN=1` (set by `.ci/run`) they fail instead.
#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::process::Command;

use common::{losses, pipefill_in, scratch, small_train};

/// The schedule and length of the runs (appended to `common::SMALL_TRAIN`).
const ZBV: [&str; 4] = ["--schedule", "zbv", "--steps", "3"];

/// Whether `srun` can start jobs here; `None` (after printing why) when the tests should skip.
fn slurm() -> Option<()> {
    let why = match Command::new("sinfo").args(["-h", "-o", "%T"]).output() {
        Err(e) => format!("no `sinfo` on the path ({e})"),
        Ok(o) if !o.status.success() => format!(
            "no Slurm controller answers ({})",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Ok(o) if String::from_utf8_lossy(&o.stdout).contains("idle") => return Some(()),
        Ok(o) => format!(
            "no idle node (sinfo: {})",
            String::from_utf8_lossy(&o.stdout).trim()
        ),
    };
    if std::env::var("PIPEFILL_REQUIRE_SRUN").as_deref() == Ok("1") {
        panic!("PIPEFILL_REQUIRE_SRUN=1 but {why}: run scripts/slurm-local.sh start");
    }
    eprintln!(
        "skipped: {why} (scripts/slurm-local.sh start makes a one-node cluster; set \
         PIPEFILL_REQUIRE_SRUN=1 to fail instead)"
    );
    None
}

/// `srun --mpi=pmix -n N pipefill ARGS` in `dir`: exit code, stdout, stderr.
fn srun(dir: &Path, n: usize, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("srun")
        .current_dir(dir)
        .args(["--mpi=pmix", "--overcommit", "-n", &n.to_string()])
        .arg(env!("CARGO_BIN_EXE_pipefill"))
        .args(args)
        .output()
        .expect("run srun");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn two_replicas_of_two_ranks_under_srun_have_the_losses_of_the_threaded_run() {
    if slurm().is_none() {
        return;
    }
    let dir = scratch("srun-dp");
    let run = small_train(&ZBV);
    let threads = losses(pipefill_in(Some(&dir), &run));
    let args = [&run[..], &["--launcher", "mpi", "--data-parallel", "2"]].concat();
    let under_srun = losses(srun(&dir, 4, &args));
    assert_eq!(
        under_srun.len(),
        threads.len(),
        "{under_srun:?} vs {threads:?}"
    );
    for (i, (a, b)) in under_srun.iter().zip(&threads).enumerate() {
        // The replicas' mean gradient is summed in another order than one replica's: 1e-5 (the
        // issue's tolerance for PP x DP against one replica).
        assert!((a - b).abs() <= 1e-5, "step {i}: srun {a} vs threads {b}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_world_of_another_size_under_srun_is_refused_once() {
    if slurm().is_none() {
        return;
    }
    let dir = scratch("srun-size");
    let args = small_train(&[&ZBV[..], &["--launcher", "mpi"]].concat());
    let (code, out, err) = srun(&dir, 3, &args);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("the MPI world has 3 processes for 2 ranks") && err.contains("`srun -n 2`"),
        "{err}"
    );
    // srun adds its own `srun: error: ... Exited with exit code 2` line; pipefill reports once.
    let ours = err.lines().filter(|l| l.starts_with("error:")).count();
    assert_eq!(ours, 1, "one report from pipefill: {err}");
    std::fs::remove_dir_all(&dir).ok();
}
