//! The command line's CUDA paths: on a machine without CUDA, `train --backend cuda` and
//! `profile --backend cuda` exit 2 saying what is missing and `--backend auto` falls back to the
//! CPU saying so; on a GPU (or with `PIPEFILL_REQUIRE_GPU=1`) they run and write a cost file.

mod common;

use std::path::PathBuf;

use common::pipefill;
use pipefill::cuda::{gpu_or_skip, probe};

/// A scratch folder for this test process (created).
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pipefill-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("create a scratch folder");
    d
}

const SMALL: [&str; 8] = [
    "--layers",
    "4",
    "--hidden",
    "32",
    "--batch",
    "64",
    "--microbatches",
    "4",
];

fn args<'a>(head: &[&'a str]) -> Vec<&'a str> {
    head.iter().copied().chain(SMALL).collect()
}

#[test]
fn cuda_backends_without_a_device_exit_2_with_the_reason() {
    if probe().is_ok() {
        println!("a CUDA device is present: the no-device behaviour is not tested here");
        return;
    }
    let dir = scratch("gpu-cli-none");
    let out = dir.join("costs.json");
    let out = out.to_str().unwrap();
    for cmd in [
        args(&["train", "--backend", "cuda", "--steps", "1"]),
        args(&["profile", "--backend", "cuda", "--out", out]),
    ] {
        let (code, _, err) = pipefill(&cmd);
        assert_eq!(code, 2, "{cmd:?}: {err}");
        assert!(
            err.contains("--backend cuda: no CUDA driver found")
                || err.contains("--backend cuda: no CUDA device"),
            "{cmd:?}: {err}"
        );
    }
    let svg = dir.join("t.svg");
    let auto = args(&[
        "train",
        "--backend",
        "auto",
        "--steps",
        "1",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let (code, _, err) = pipefill(&auto);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--backend auto: using cpu (no CUDA"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn train_and_profile_run_on_the_gpu() {
    let Some(_gpu) = gpu_or_skip("train_and_profile_run_on_the_gpu") else {
        return;
    };
    let dir = scratch("gpu-cli");
    let svg = dir.join("t.svg");
    let train = args(&[
        "train",
        "--backend",
        "cuda",
        "--steps",
        "3",
        "--format",
        "json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let (code, out, err) = pipefill(&train);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"losses\""), "{out}");
    let costs = dir.join("costs.json");
    let profile = args(&[
        "profile",
        "--backend",
        "cuda",
        "--repeats",
        "3",
        "--out",
        costs.to_str().unwrap(),
    ]);
    let (code, _, err) = pipefill(&profile);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&costs).unwrap();
    assert!(
        text.contains("\"backend\": \"cuda\"") && text.contains("CUDA events"),
        "{text}"
    );
}

/// The losses of a `train --format json` run.
fn losses(out: &str) -> Vec<f64> {
    let v: serde_json::Value = serde_json::from_str(out).expect("train's JSON");
    v["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|l| l.as_f64().expect("a loss"))
        .collect()
}

/// `train --backend cuda` with `--data-parallel 2`, `--checkpoint` and `--resume`, through the same
/// training loop as the CPU: the replicas' losses match the CPU's (`--precision fp32`: the same
/// math, summed in another order, so within 1e-4 relative), and a run resumed from its step-2
/// checkpoint continues the uninterrupted run's losses (the same kernels on the same data from the
/// same state: within 1e-6 relative, allowing for a reduction order that is not fixed).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn train_on_the_gpu_with_replicas_and_checkpoints() {
    let Some(_gpu) = gpu_or_skip("train_on_the_gpu_with_replicas_and_checkpoints") else {
        return;
    };
    let dir = scratch("gpu-cli-dp");
    let svg = dir.join("t.svg");
    let ck = dir.join("ck");
    let _ = std::fs::remove_dir_all(&ck);
    let run = |backend: &str, steps: &str, extra: &[&str]| {
        let mut a = args(&[
            "train",
            "--backend",
            backend,
            "--data-parallel",
            "2",
            "--schedule",
            "1f1b",
            "--plan",
            "uniform",
            "--steps",
            steps,
            "--format",
            "json",
            "--svg",
            svg.to_str().unwrap(),
        ]);
        if backend == "cuda" {
            a.extend(["--precision", "fp32", "--devices", "one"]);
        }
        a.extend(extra);
        let (code, out, err) = pipefill(&a);
        assert_eq!(code, 0, "{a:?}: {err}");
        losses(&out)
    };
    let close = |a: &[f64], b: &[f64], tol: f64| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= tol * y.abs().max(1e-6))
    };
    let cpu = run("cpu", "4", &[]);
    let gpu = run("cuda", "4", &[]);
    assert!(close(&gpu, &cpu, 1e-4), "cuda {gpu:?}\ncpu  {cpu:?}");
    let ck_s = ck.to_str().unwrap();
    let first = run("cuda", "2", &["--checkpoint", ck_s]);
    assert!(
        close(&first, &gpu[..2], 1e-6),
        "first {first:?}\nwhole {gpu:?}"
    );
    assert!(ck.join("step-00000002/manifest.json").exists());
    let resumed = run("cuda", "4", &["--resume", ck_s]);
    assert!(
        close(&resumed, &gpu[2..], 1e-6),
        "resumed {resumed:?}\nwhole   {gpu:?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
