//! `pipefill train --launcher mpi` (feature `mpi`): under `mpirun -n 2` every schedule family trains
//! with the losses of the threaded run; two data-parallel replicas of two ranks over four processes
//! train with the losses of the threaded runs; a world of another size is refused; a checkpoint
//! saved by the processes resumes in either launcher with an uninterrupted run's losses; a rank
//! that is killed, or fails with an error, ends the whole job within seconds. Needs OpenMPI's
//! `mpirun` on the path (`.ci/run` installs it).
#![cfg(feature = "mpi")]

mod common;

use std::io::Read;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use common::{losses, mpirun, mpirun_command, pipefill_in, scratch, small_train};

/// The small run with an SVG written (the MPI launcher writes it from process 0), then `extra`.
fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    small_train(&[&["--svg", "t.svg"], extra].concat())
}

/// `|a - b| <= 1e-6` step by step, and as many steps.
fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_within(a, b, 1e-6, what);
}

/// `|a - b| <= tol` step by step, and as many steps.
fn assert_within(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: {a:?} vs {b:?}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "{what}: step {i}: {x} vs {y}");
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

#[test]
fn a_job_stopped_mid_run_resumes_from_its_last_checkpoint() {
    let dir = scratch("mpi-kill");
    let shape = [
        "--schedule",
        "1f1b",
        "--layers",
        "6",
        "--hidden",
        "128",
        "--batch",
        "128",
        "--steps",
        "600",
    ];
    let mut args: Vec<&str> = with(&[]);
    // The small run's model flags give way to the larger model (clap takes each flag once).
    for flag in ["--layers", "--hidden", "--batch"] {
        let i = args
            .iter()
            .position(|a| *a == flag)
            .expect("flag in the small run");
        args.drain(i..i + 2);
    }
    args.extend_from_slice(&shape);
    let full = losses(pipefill_in(Some(&dir), &args));
    let save = [
        &args[..],
        &[
            "--launcher",
            "mpi",
            "--checkpoint",
            "ck",
            "--checkpoint-every",
            "5",
        ],
    ]
    .concat();
    let mut job = mpirun_command(&dir, 2, &save)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn mpirun");
    let first = dir.join("ck/step-00000005/manifest.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !first.exists() {
        assert!(Instant::now() < deadline, "no checkpoint after 120 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    // SIGTERM: mpirun passes it to its processes and ends them (SIGKILL would orphan them).
    // SAFETY: `kill` on the pid of a child this test started and has not yet waited for.
    unsafe {
        libc::kill(job.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = job.try_wait().expect("wait for mpirun") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "mpirun still running 60 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "the job finished before it was stopped");
    let last = (5..600)
        .rev()
        .find(|s| dir.join(format!("ck/step-{s:08}/manifest.json")).exists())
        .expect("a complete checkpoint before the last step");
    // mpirun passes SIGTERM on with some delay: a job that got as far as its final checkpoint
    // before it stopped must still resume from a mid-run one, so later checkpoints go.
    for s in last + 1..=600 {
        std::fs::remove_dir_all(dir.join(format!("ck/step-{s:08}"))).ok();
    }
    let resume = [
        &args[..],
        &["--launcher", "mpi", "--resume", "ck", "--checkpoint", "ck"],
    ]
    .concat();
    let tail = losses(mpirun(&dir, 2, &resume));
    assert_close(&tail, &full[last..], &format!("resumed after step {last}"));
    std::fs::remove_dir_all(&dir).ok();
}

/// All of `job`'s stderr (piped), read to its end.
fn read_stderr(job: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut e) = job.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    err
}

/// The processes whose parent is `parent` (from `/proc/*/stat`).
fn children(parent: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`; comm may hold spaces, so split after its `)`.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

#[test]
fn a_killed_rank_ends_the_whole_job_within_seconds() {
    let dir = scratch("mpi-fault");
    let args = with(&["--launcher", "mpi", "--steps", "100000"]);
    let mut job = mpirun_command(&dir, 2, &args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn mpirun");
    // Both ranks started and past the plan: wait for two children, then a moment of training.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ranks = loop {
        let c = children(job.id());
        if c.len() == 2 {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "mpirun started {} processes",
            c.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: `kill` on a child of the mpirun this test started.
    unsafe {
        libc::kill(ranks[1], libc::SIGKILL);
    }
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = job.try_wait().expect("wait for mpirun") {
            break s;
        }
        if killed.elapsed() > Duration::from_secs(30) {
            let _ = job.kill();
            for pid in children(job.id()) {
                // SAFETY: as above.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            panic!("the job still runs 30 s after one rank was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = read_stderr(&mut job);
    assert!(!status.success(), "{err}");
    // mpirun names the rank that died and takes the other one down with it.
    assert!(
        err.contains("process rank") && err.contains("signal 9"),
        "{err}"
    );
    let gone = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{}", ranks[0])).exists() {
        assert!(
            Instant::now() < gone,
            "the other rank outlived the job: {err}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn two_replicas_of_two_ranks_over_four_processes_train_like_the_threaded_runs() {
    let dir = scratch("mpi-dp");
    // SGD too: AdamW's update barely sees a gradient scaled by D (a sum for a mean); SGD's does.
    for (family, optimizer) in [
        ("1f1b", "adamw"),
        ("zb-h1", "adamw"),
        ("interleaved-1f1b", "adamw"),
        ("1f1b", "sgd"),
    ] {
        let opt = ["--optimizer", optimizer, "--lr", "0.05"];
        let args = with(&[&["--schedule", family, "--steps", "4"][..], &opt].concat());
        let one = losses(pipefill_in(Some(&dir), &args));
        let dp = [&args[..], &["--data-parallel", "2"]].concat();
        let threads = losses(pipefill_in(Some(&dir), &dp));
        let mpi = losses(mpirun(&dir, 4, &[&dp[..], &["--launcher", "mpi"]].concat()));
        assert_within(
            &mpi,
            &one,
            1e-5,
            &format!("{family} {optimizer}: P2 x D2 under mpirun vs --ranks 2"),
        );
        assert_within(
            &mpi,
            &threads,
            1e-5,
            &format!("{family} {optimizer}: vs threaded --data-parallel 2"),
        );
    }
    let (code, out, err) = mpirun(
        &dir,
        3,
        &with(&["--launcher", "mpi", "--data-parallel", "2"]),
    );
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("3 processes for 2 ranks x 2 replicas") && err.contains("mpirun -n 4"),
        "{err}"
    );
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_checkpoint_of_replicas_under_mpirun_resumes_in_either_launcher() {
    let dir = scratch("mpi-dp-checkpoint");
    let s = ["--schedule", "1f1b", "--data-parallel", "2"];
    let full = losses(pipefill_in(
        Some(&dir),
        &with(&[&s[..], &["--steps", "5"]].concat()),
    ));
    let save = [
        &s[..],
        &["--steps", "2", "--launcher", "mpi", "--checkpoint", "ck"],
    ]
    .concat();
    let head = losses(mpirun(&dir, 4, &with(&save)));
    assert_within(&head, &full[..2], 1e-5, "the first steps under mpirun");
    // Replica 0 saved: one file per rank, not per process.
    let files = std::fs::read_dir(dir.join("ck/step-00000002"))
        .expect("the checkpoint folder")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("rank-"))
        .count();
    assert_eq!(files, 2);
    let resume = [&s[..], &["--steps", "5", "--resume", "ck"]].concat();
    let threads = losses(pipefill_in(Some(&dir), &with(&resume)));
    assert_within(&threads, &full[2..], 1e-5, "resumed in threads");
    let mpi = losses(mpirun(
        &dir,
        4,
        &with(&[&resume[..], &["--launcher", "mpi"]].concat()),
    ));
    assert_within(&mpi, &full[2..], 1e-5, "resumed under mpirun");
    std::fs::remove_dir_all(&dir).ok();
}

/// Waits up to `limit` for `job` to end, noting every process it started; kills them all and
/// fails if it does not end. Returns its exit status and stderr once none of its processes is
/// left.
fn end_within(mut job: std::process::Child, limit: Duration) -> (std::process::ExitStatus, String) {
    let start = Instant::now();
    let mut seen: Vec<i32> = Vec::new();
    let status = loop {
        for pid in children(job.id()) {
            if !seen.contains(&pid) {
                seen.push(pid);
            }
        }
        if let Some(s) = job.try_wait().expect("wait for mpirun") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = job.kill();
            for &pid in &seen {
                // SAFETY: `kill` on a child of the mpirun this test started.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            panic!("the job still runs {limit:?} after it started");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let err = read_stderr(&mut job);
    let gone = Instant::now() + Duration::from_secs(10);
    for pid in seen {
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(
                Instant::now() < gone,
                "process {pid} outlived the job: {err}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    (status, err)
}

#[test]
fn a_rank_that_fails_with_an_error_ends_the_whole_job_within_seconds() {
    // Rank 1's checkpoint file cannot be written: its name is taken by a folder. Only that
    // process fails (an I/O error, exit code 1), mid-run, while the other ranks wait on it (for
    // its file's checksum, its activations, or, in the other replica, the gradient all-reduce).
    for (replicas, name) in [(1, "rank 1:"), (2, "rank 1 of replica 0 (process 1):")] {
        let dir = scratch(&format!("mpi-error-{replicas}"));
        std::fs::create_dir_all(dir.join("ck/step-00000002/rank-1.bin/x")).expect("a folder");
        let d = replicas.to_string();
        let args = with(&[
            "--launcher",
            "mpi",
            "--data-parallel",
            &d,
            "--steps",
            "100000",
            "--checkpoint",
            "ck",
            "--checkpoint-every",
            "2",
        ]);
        let job = mpirun_command(&dir, 2 * replicas, &args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn mpirun");
        let (status, err) = end_within(job, Duration::from_secs(60));
        assert!(!status.success(), "{err}");
        assert!(
            err.contains(&format!("error: {name} --checkpoint `ck`: saving step 2"))
                && err.contains("rank-1.bin"),
            "{err}"
        );
        assert_eq!(err.matches("error:").count(), 1, "{err}");
        assert!(!dir.join("ck/step-00000002/manifest.json").exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// `mpirun -n 2 pipefill train --backend cuda --launcher mpi` on a machine without a CUDA driver:
/// the job ends with exit 2 and one `no CUDA driver found` error (the flags are checked by every
/// process, the lowest rank reports), within a deadline, no process left waiting; with
/// `--data-parallel 2` on 4 processes, and with `--graph` (each process would capture its rank's
/// step), too: the flags are taken, only the driver is missing. On a machine with a GPU this test
/// has nothing to check (the GPU runs are `tests/gpu_nccl.rs` and `scripts/gpu-check.sh`).
#[test]
fn gpu_ranks_without_a_cuda_driver_exit_2_in_every_process_without_hanging() {
    if pipefill::cuda::driver_present() {
        println!("a CUDA driver is present: the no-driver refusal cannot be shown here");
        return;
    }
    let dir = scratch("mpi-cuda-no-driver");
    let cuda = ["--backend", "cuda", "--launcher", "mpi", "--steps", "2"];
    no_driver(&dir, 2, &with(&cuda));
    no_driver(
        &dir,
        4,
        &with(&[&cuda[..], &["--data-parallel", "2"]].concat()),
    );
    let graph = [
        "--backend",
        "cuda",
        "--launcher",
        "mpi",
        "--graph",
        "--steps",
        "4",
    ];
    no_driver(&dir, 2, &with(&graph));
}

/// `mpirun -n procs pipefill args` ends with exit 2 and one `no CUDA driver found` error.
fn no_driver(dir: &std::path::Path, procs: usize, args: &[&str]) {
    let start = Instant::now();
    let mut job = mpirun_command(dir, procs, args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run mpirun");
    let deadline = Duration::from_secs(60);
    let code = loop {
        if let Some(status) = job.try_wait().expect("wait for mpirun") {
            break status.code().unwrap_or(-1);
        }
        if start.elapsed() > deadline {
            let _ = job.kill();
            panic!("mpirun did not end within {deadline:?}: a process hangs");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = job.wait_with_output().expect("mpirun's output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no CUDA driver found"), "{err}");
    assert_eq!(err.matches("error:").count(), 1, "one error line: {err}");
}
