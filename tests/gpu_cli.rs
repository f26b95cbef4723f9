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
    let mut train = args(&[
        "train",
        "--backend",
        "cuda",
        "--steps",
        "3",
        "--format",
        "json",
        "--svg",
    ]);
    train.push(svg.to_str().unwrap());
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
