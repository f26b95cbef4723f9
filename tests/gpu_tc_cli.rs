//! The command line's numerics flags: `--precision` is refused with exit 2 on the CPU backend (train,
//! profile), a bad `--activations` or `--precision` value exits 2 naming the flag, and
//! `--activations bf16` halves the activation bytes of the cost file `profile` writes. On a GPU (or
//! with `PIPEFILL_REQUIRE_GPU=1`), `train --backend cuda` runs in each precision.

mod common;

use std::path::PathBuf;

use common::pipefill;
use pipefill::cuda::gpu_or_skip;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pipefill-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("create a scratch folder");
    d
}

const SMALL: [&str; 8] = [
    "--layers",
    "3",
    "--hidden",
    "24",
    "--batch",
    "32",
    "--microbatches",
    "4",
];

fn with_small<'a>(head: &[&'a str]) -> Vec<&'a str> {
    head.iter().copied().chain(SMALL).collect()
}

#[test]
fn precision_on_the_cpu_backend_exits_2_naming_the_flag() {
    let dir = scratch("tc-cli-cpu");
    let out = dir.join("c.json");
    let out = out.to_str().unwrap();
    for cmd in [
        with_small(&[
            "train",
            "--backend",
            "cpu",
            "--steps",
            "1",
            "--precision",
            "bf16",
        ]),
        with_small(&["profile", "--out", out, "--precision", "tf32"]),
    ] {
        let (code, _, err) = pipefill(&cmd);
        assert_eq!(code, 2, "{cmd:?}: {err}");
        assert!(
            err.contains("--precision") && err.contains("--backend cuda"),
            "{cmd:?}: {err}"
        );
    }
}

#[test]
fn bad_numerics_values_exit_2_naming_the_flag() {
    let dir = scratch("tc-cli-bad");
    let out = dir.join("c.json");
    let out = out.to_str().unwrap();
    for (cmd, flag) in [
        (
            with_small(&["train", "--steps", "1", "--activations", "fp8"]),
            "--activations",
        ),
        (
            with_small(&["profile", "--out", out, "--activations", "f16"]),
            "--activations",
        ),
        (
            with_small(&["train", "--steps", "1", "--precision", "fp16"]),
            "--precision",
        ),
        (
            vec!["bench", "overlap", "--precision", "half"],
            "--precision",
        ),
    ] {
        let (code, _, err) = pipefill(&cmd);
        assert_eq!(code, 2, "{cmd:?}: {err}");
        assert!(err.contains(flag), "{cmd:?}: {err}");
    }
}

fn activation_bytes(path: &std::path::Path) -> (f64, String) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("cost file")).expect("json");
    let bytes = v["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| l["activation_bytes"].as_f64().expect("activation_bytes"))
        .sum();
    let dtype = v["meta"]["activation_dtype"].as_str().unwrap_or("f32");
    (bytes, dtype.to_string())
}

#[test]
fn bf16_activations_halve_the_cost_files_activation_bytes() {
    let dir = scratch("tc-cli-act");
    let (f32_file, bf16_file) = (dir.join("f32.json"), dir.join("bf16.json"));
    let fast = [
        "--sizes",
        "none",
        "--fit-rows",
        "0",
        "--repeats",
        "1",
        "--warmup",
        "0",
    ];
    for (file, dtype) in [(&f32_file, "f32"), (&bf16_file, "bf16")] {
        let mut cmd = with_small(&["profile", "--out", file.to_str().unwrap()]);
        cmd.extend(fast);
        cmd.extend(["--activations", dtype]);
        let (code, _, err) = pipefill(&cmd);
        assert_eq!(code, 0, "{cmd:?}: {err}");
    }
    let (full, d32) = activation_bytes(&f32_file);
    let (half, d16) = activation_bytes(&bf16_file);
    assert_eq!((d32.as_str(), d16.as_str()), ("f32", "bf16"));
    assert!(
        full > 0.0 && (half - full / 2.0).abs() <= 1e-9 * full,
        "{full} vs {half}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn train_on_the_gpu_runs_in_each_precision() {
    if gpu_or_skip("train_on_the_gpu_runs_in_each_precision").is_none() {
        return;
    }
    for p in ["tf32", "fp32", "bf16"] {
        let cmd = with_small(&[
            "train",
            "--backend",
            "cuda",
            "--steps",
            "2",
            "--precision",
            p,
        ]);
        let (code, _, err) = pipefill(&cmd);
        assert_eq!(code, 0, "{cmd:?}: {err}");
    }
}
