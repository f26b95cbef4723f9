//! `pipefill train --checkpoint/--resume`: a run interrupted after step k (stopped, or killed
//! mid-run) and resumed has, for every step after k, the loss of an uninterrupted run bit for bit;
//! a checkpoint that does not fit the run, or whose files are damaged, is refused with exit code 2;
//! a checkpoint whose save was cut short (no manifest) is never picked up.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{pipefill_in, scratch};

/// A small model, JSON out (every flag takes a value).
const SMALL: [&str; 12] = [
    "--layers",
    "4",
    "--hidden",
    "32",
    "--batch",
    "32",
    "--microbatches",
    "4",
    "--svg",
    "t.svg",
    "--format",
    "json",
];

/// `train`, then [`SMALL`] with each flag of `extra` (flag-value pairs) replacing its default.
fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut pairs: Vec<[&str; 2]> = SMALL.chunks(2).map(|c| [c[0], c[1]]).collect();
    for c in extra.chunks(2) {
        let value = c.get(1).copied().unwrap_or_default();
        match pairs.iter_mut().find(|p| p[0] == c[0]) {
            Some(p) => p[1] = value,
            None => pairs.push([c[0], value]),
        }
    }
    std::iter::once("train")
        .chain(pairs.into_iter().flatten())
        .collect()
}

/// `pipefill train SMALL EXTRA` in `dir`: exit code, parsed JSON (null if none), stderr.
fn train(dir: &Path, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let (code, out, err) = pipefill_in(Some(dir), &args(extra));
    (
        code,
        serde_json::from_str(&out).unwrap_or(serde_json::Value::Null),
        err,
    )
}

/// The losses of a successful run, as bits (for exact comparison).
fn losses(v: &serde_json::Value) -> Vec<u32> {
    let l: Vec<f32> = serde_json::from_value(v["losses"].clone()).expect("losses");
    l.iter().map(|x| x.to_bits()).collect()
}

/// `train` that must succeed; its losses.
fn train_ok(dir: &Path, extra: &[&str]) -> (Vec<u32>, serde_json::Value) {
    let (code, v, err) = train(dir, extra);
    assert_eq!(code, 0, "{extra:?}: {err}");
    (losses(&v), v)
}

/// The complete checkpoints (folders with a manifest) in `dir`, by step.
fn complete_steps(dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.path().join("manifest.json").exists())
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    steps.sort_unstable();
    steps
}

fn step_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:08}"))
}

#[test]
fn stopped_and_resumed_runs_match_an_uninterrupted_one_bit_for_bit() {
    let dir = scratch("ckpt-resume");
    for (family, layers) in [("1f1b", "4"), ("interleaved-1f1b", "4"), ("zbv", "4")] {
        let fam = ["--schedule", family, "--layers", layers];
        let (full, v) = train_ok(&dir, &[&fam[..], &["--steps", "7"]].concat());
        assert_eq!(full.len(), 7);
        let ck = dir.join(format!("ck-{family}"));
        let ck = ck.to_str().unwrap();
        let first = [&fam[..], &["--steps", "3", "--checkpoint", ck]].concat();
        let (head, _) = train_ok(&dir, &[&first[..], &["--checkpoint-every", "2"]].concat());
        assert_eq!(head, full[..3], "{family}: the first steps differ");
        assert_eq!(complete_steps(Path::new(ck)), vec![2, 3], "{family}");
        let resume = [
            &fam[..],
            &["--steps", "7", "--resume", ck, "--checkpoint", ck],
        ]
        .concat();
        let (tail, r) = train_ok(&dir, &resume);
        assert_eq!(r["first_step"], 3, "{family}");
        assert_eq!(tail, full[3..], "{family}: resumed losses differ");
        assert_eq!(r["layers_per_stage"], v["layers_per_stage"], "{family}");
        assert_eq!(complete_steps(Path::new(ck)), vec![2, 3, 7], "{family}");
    }
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_killed_run_resumes_from_its_last_checkpoint_bit_for_bit() {
    let dir = scratch("ckpt-kill");
    let steps = 400;
    let every = 5;
    let model = ["--layers", "6", "--hidden", "128", "--batch", "128"];
    let shape = [&model[..], &["--schedule", "1f1b", "--steps", "400"]].concat();
    let (full, _) = train_ok(&dir, &shape);
    let ck = dir.join("ck");
    let save = [
        &shape[..],
        &["--checkpoint", "ck", "--checkpoint-every", "5"],
    ]
    .concat();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pipefill"))
        .current_dir(&dir)
        .args(args(&save))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn pipefill");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !step_dir(&ck, every).join("manifest.json").exists() {
        assert!(
            Instant::now() < deadline,
            "no checkpoint after 120 s: {:?}",
            child.try_wait()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().expect("kill the run");
    let status = child.wait().expect("wait for the killed run");
    assert!(!status.success(), "the run finished before it was killed");
    let done = complete_steps(&ck);
    let last = *done.last().expect("a complete checkpoint");
    assert!(
        (every..steps as u64).contains(&last),
        "checkpoints {done:?}: the run was not killed mid-run"
    );
    let resume = [&shape[..], &["--resume", "ck", "--checkpoint", "ck"]].concat();
    let (tail, v) = train_ok(&dir, &resume);
    assert_eq!(v["first_step"], last);
    assert_eq!(tail, full[last as usize..], "resumed after step {last}");
    fs::remove_dir_all(&dir).ok();
}

/// `train` must fail with exit code 2 and every needle in its error.
fn refused(dir: &Path, extra: &[&str], needles: &[&str]) {
    let (code, _, err) = train(dir, extra);
    assert_eq!(code, 2, "{extra:?}: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    for n in needles {
        assert!(err.contains(n), "{extra:?}: expected `{n}` in: {err}");
    }
}

#[test]
fn checkpoints_of_another_run_are_refused() {
    let dir = scratch("ckpt-mismatch");
    train_ok(
        &dir,
        &["--steps", "2", "--schedule", "1f1b", "--checkpoint", "ck"],
    );
    let r = ["--steps", "4", "--resume", "ck"];
    let cases: [(&[&str], &[&str]); 8] = [
        (&["--layers", "5"], &["model", "--layers"]),
        (&["--hidden", "16"], &["model"]),
        (&["--batch", "64"], &["batch is 32", "--batch"]),
        (
            &["--ranks", "4"],
            &["number of ranks is 2, this run's is 4", "--ranks"],
        ),
        (
            &["--microbatches", "8"],
            &["microbatches", "--microbatches"],
        ),
        (
            &["--schedule", "gpipe"],
            &["schedule is 1f1b", "--schedule"],
        ),
        (&["--seed", "3"], &["seed is 0, this run's is 3", "--seed"]),
        (
            &["--optimizer", "sgd"],
            &["optimizer is adamw", "--optimizer"],
        ),
    ];
    for (extra, needles) in cases {
        refused(&dir, &[&r[..], extra].concat(), needles);
    }
    refused(
        &dir,
        &[&r[..], &["--lr", "0.01"]].concat(),
        &["learning rate"],
    );
    // Stored in another precision, the activations would round differently and the run diverge.
    refused(
        &dir,
        &[&r[..], &["--activations", "bf16"]].concat(),
        &[
            "activation storage is f32, this run's is bf16",
            "--activations",
        ],
    );
    refused(
        &dir,
        &["--steps", "2", "--resume", "ck"],
        &["--steps 2", "trained 2 steps"],
    );
    // A new run may not write into a folder that holds another run's checkpoints.
    refused(
        &dir,
        &["--steps", "2", "--checkpoint", "ck"],
        &["already holds", "--resume"],
    );
    refused(
        &dir,
        &["--steps", "2", "--resume", "nothing-here"],
        &["no complete checkpoint"],
    );
    refused(
        &dir,
        &[
            "--steps",
            "2",
            "--checkpoint",
            "c2",
            "--checkpoint-every",
            "0",
        ],
        &["--checkpoint-every must be at least 1"],
    );
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_checkpoint_with_another_partition_is_refused() {
    let dir = scratch("ckpt-partition");
    // One heavy first layer: the best split for two ranks is [1, 3], not the uniform [2, 2].
    fs::write(
        dir.join("heavy.toml"),
        "input = 4096\nbatch = 64\nlayers = [{ width = 8, activation = \"gelu\" }, \
         { width = 8, activation = \"gelu\" }, { width = 8, activation = \"gelu\" }, { width = 8 }]\n",
    )
    .unwrap();
    let m = ["--model", "heavy.toml", "--schedule", "1f1b"];
    let (_, v) = train_ok(
        &dir,
        &[&m[..], &["--steps", "1", "--checkpoint", "ck"]].concat(),
    );
    assert_eq!(v["layers_per_stage"], serde_json::json!([1, 3]), "{v}");
    let r = [&m[..], &["--steps", "2", "--resume", "ck"]].concat();
    refused(
        &dir,
        &[&r[..], &["--plan", "uniform"]].concat(),
        &[
            "partition (layers per stage) is [1, 3], this run's is [2, 2]",
            "--plan",
        ],
    );
    // With --plan auto (the default) the checkpoint's partition is kept.
    let (_, v) = train_ok(&dir, &r);
    assert_eq!(v["layers_per_stage"], serde_json::json!([1, 3]));
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn half_written_checkpoints_are_skipped_and_damaged_ones_refused() {
    let dir = scratch("ckpt-damaged");
    let s = ["--schedule", "1f1b"];
    let (full, _) = train_ok(&dir, &[&s[..], &["--steps", "6"]].concat());
    let save = [
        "--steps",
        "4",
        "--checkpoint",
        "ck",
        "--checkpoint-every",
        "2",
    ];
    train_ok(&dir, &[&s[..], &save].concat());
    let ck = dir.join("ck");
    // A save cut short: step 4's manifest never written, step 6 only one temporary rank file.
    fs::remove_file(step_dir(&ck, 4).join("manifest.json")).unwrap();
    fs::create_dir_all(step_dir(&ck, 6)).unwrap();
    fs::write(step_dir(&ck, 6).join(".rank-0.bin.tmp"), b"PFCK").unwrap();
    let resume = [&s[..], &["--steps", "6", "--resume", "ck"]].concat();
    let (tail, v) = train_ok(&dir, &resume);
    assert_eq!(v["first_step"], 2);
    assert_eq!(tail, full[2..]);
    // Damaged files of the latest complete checkpoint are refused, never silently replaced.
    let rank1 = step_dir(&ck, 2).join("rank-1.bin");
    let good = fs::read(&rank1).unwrap();
    fs::write(&rank1, &good[..good.len() / 2]).unwrap();
    refused(
        &dir,
        &resume,
        &["rank-1.bin", "corrupt", "bytes, its manifest says"],
    );
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x10;
    fs::write(&rank1, &flipped).unwrap();
    refused(&dir, &resume, &["rank-1.bin", "checksum"]);
    fs::write(&rank1, &good).unwrap();
    let manifest = step_dir(&ck, 2).join("manifest.json");
    let text = fs::read_to_string(&manifest).unwrap();
    fs::write(&manifest, &text[..text.len() / 2]).unwrap();
    refused(&dir, &resume, &["manifest.json", "corrupt"]);
    // Manifests that parse but do not hold together: refused naming the file, the field and the
    // fix (they used to fail later with exit code 1).
    let damaged = |edit: fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        edit(&mut v);
        fs::write(&manifest, v.to_string()).unwrap();
    };
    damaged(|v| {
        v["plan"]["cost"]["stages"].as_array_mut().unwrap().pop();
    });
    let fix = "delete that step folder";
    refused(&dir, &resume, &["manifest.json", "plan.cost.stages", fix]);
    damaged(|v| v["plan"]["layers_per_stage"] = serde_json::json!([0, 4]));
    refused(
        &dir,
        &resume,
        &["manifest.json", "plan.layers_per_stage", fix],
    );
    damaged(|v| v["step"] = serde_json::json!(format!("{}", "9".repeat(5000))));
    refused(
        &dir,
        &resume,
        &["manifest.json", "at line 1", "... (5000 bytes)", fix],
    );
    fs::write(&manifest, &text).unwrap();
    train_ok(&dir, &resume);
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_folder_another_run_is_writing_is_refused_and_free_again_after() {
    let dir = scratch("ckpt-lock");
    let ck = dir.join("ck");
    // Another process's lock, as a concurrent `train --checkpoint ck` holds it.
    let held = pipefill::checkpoint::store::FolderLock::take(&ck).unwrap();
    let extra = ["--steps", "2", "--checkpoint", "ck"];
    refused(
        &dir,
        &extra,
        &["in use", "--checkpoint", "another --checkpoint folder"],
    );
    assert!(complete_steps(&ck).is_empty(), "wrote into a folder in use");
    drop(held);
    train_ok(&dir, &extra);
    assert_eq!(complete_steps(&ck), vec![2]);
    fs::remove_dir_all(&dir).ok();
}

/// Whether some process holds an `flock` on `file` (Linux: `/proc/locks` lists each lock with the
/// inode of its file), found without taking the lock.
#[cfg(feature = "mpi")]
fn locked_by_someone(file: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(inode) = fs::metadata(file).map(|m| m.ino()) else {
        return false;
    };
    let locks = fs::read_to_string("/proc/locks").unwrap_or_default();
    // `1: FLOCK  ADVISORY  WRITE 887 fe:00:5605192 0 EOF`: the file is `MAJOR:MINOR:INODE`.
    locks.lines().filter(|l| l.contains("FLOCK")).any(|l| {
        l.split_whitespace()
            .filter(|w| w.matches(':').count() == 2)
            .any(|w| w.rsplit(':').next().and_then(|i| i.parse().ok()) == Some(inode))
    })
}

#[cfg(feature = "mpi")]
#[test]
fn under_mpirun_a_folder_has_one_writer_too() {
    let dir = scratch("ckpt-mpi-lock");
    let ck = dir.join("ck");
    let mpi = ["--ranks", "2", "--launcher", "mpi", "--checkpoint", "ck"];
    // A folder another run holds: the job is refused once, exit 2, nothing written.
    let held = pipefill::checkpoint::store::FolderLock::take(&ck).unwrap();
    let (code, _, err) = common::mpirun(&dir, 2, &args(&[&mpi[..], &["--steps", "2"]].concat()));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("in use") && err.contains("`ck`"), "{err}");
    assert_eq!(err.matches("error:").count(), 1, "one report: {err}");
    assert!(complete_steps(&ck).is_empty(), "wrote into a folder in use");
    drop(held);
    // A running job holds the lock from its start: another run on the folder is refused.
    let long = args(&[&mpi[..], &["--steps", "200000"]].concat());
    let mut job = common::mpirun_command(&dir, 2, &long)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn mpirun");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !locked_by_someone(&ck.join(".lock")) {
        assert!(job.try_wait().unwrap().is_none(), "the job ended early");
        assert!(Instant::now() < deadline, "the job took no lock in 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    refused(
        &dir,
        &["--steps", "2", "--checkpoint", "ck"],
        &["in use", "`ck`"],
    );
    let (code, _, err) = common::mpirun(&dir, 2, &args(&[&mpi[..], &["--steps", "2"]].concat()));
    assert_eq!(code, 2, "a second MPI job: {err}");
    assert!(err.contains("in use"), "{err}");
    // SIGTERM: mpirun passes it on and ends its processes; the lock goes with them.
    // SAFETY: `kill` on the pid of a child this test started and has not yet waited for.
    unsafe {
        libc::kill(job.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "mpirun still running 60 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while locked_by_someone(&ck.join(".lock")) {
        assert!(
            Instant::now() < deadline,
            "the lock outlived the job by 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        complete_steps(&ck).is_empty(),
        "the stopped job saved nothing"
    );
    fs::remove_dir_all(&dir).ok();
}
