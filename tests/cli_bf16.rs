//! `--activations bf16` end to end: `plan --activations` halves the activation part of the
//! predicted peak memory (and refuses a bad value with exit 2), and `train --activations bf16`
//! really stores BF16 on the CPU (its losses move, by about BF16's rounding, from the f32 run's).

mod common;

use std::path::{Path, PathBuf};

use common::{assert_refused, losses, pipefill, small_train};

/// A cost file of 8 equal layers with activation, release and output bytes, and parameters
/// (which stay f32).
fn cost_file(meta: &str) -> PathBuf {
    let dir = common::scratch("cli-bf16");
    let layers: Vec<String> = (0..8)
        .map(|i| {
            format!(
                r#"{{"name": "l{i}", "forward": 1e-3, "backward_input": 1e-3, "backward_weight": 1e-3, "activation_bytes": 4096, "released_at_input": 1024, "output_bytes": 512, "parameter_bytes": 1000}}"#
            )
        })
        .collect();
    let path = dir.join(format!("costs-{}.json", meta.len()));
    let text = format!(
        r#"{{"layers": [{}], "transfer": {{"latency": 1e-5, "bandwidth": 1e9}}, "meta": {{"microbatch_size": 4{meta}}}}}"#,
        layers.join(",")
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `plan` on `costs` with `extra` flags: each plan's (family, V, M, layers per stage) and peak
/// memory per rank.
fn plans(costs: &Path, extra: &[&str]) -> Vec<(String, Vec<f64>)> {
    let c = costs.to_str().unwrap();
    let mut args = vec![
        "plan",
        "--costs",
        c,
        "--ranks",
        "2",
        "--global-batch",
        "16",
        "--families",
        "1f1b,zb-h1",
        "--chunks",
        "1",
        "--top",
        "100",
        "--format",
        "json",
    ];
    args.extend(extra);
    let (code, out, err) = pipefill(&args);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["plans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let key = format!(
                "{} V={} M={} {}",
                p["family"], p["chunks"], p["microbatches"], p["layers_per_stage"]
            );
            let peak = serde_json::from_value(p["peak_memory"].clone()).unwrap();
            (key, peak)
        })
        .collect()
}

/// Parameter bytes on each of the 2 ranks for `key`'s layers per stage.
fn params(key: &str) -> Vec<f64> {
    let counts: Vec<f64> = serde_json::from_str(key.rsplit(' ').next().unwrap()).unwrap();
    counts.iter().map(|n| n * 1000.0).collect()
}

/// Each plan's activation memory per rank (its peak less its parameters).
fn activation_part(plans: &[(String, Vec<f64>)]) -> Vec<(String, Vec<f64>)> {
    plans
        .iter()
        .map(|(k, peak)| {
            (
                k.clone(),
                peak.iter().zip(params(k)).map(|(a, p)| a - p).collect(),
            )
        })
        .collect()
}

/// Asserts `a` (by plan) is `factor` times `b` on every plan both hold; at least 2 such plans.
fn assert_scaled(a: &[(String, Vec<f64>)], b: &[(String, Vec<f64>)], factor: f64) {
    let mut compared = 0;
    for (key, act_a) in a {
        let Some((_, act_b)) = b.iter().find(|(k, _)| k == key) else {
            continue;
        };
        assert!(act_b.iter().all(|&v| v > 0.0), "{key}: {act_b:?}");
        let scaled: Vec<f64> = act_b.iter().map(|v| v * factor).collect();
        assert_eq!(act_a, &scaled, "{key}");
        compared += 1;
    }
    assert!(compared >= 2, "too few common plans: {a:?} / {b:?}");
}

#[test]
fn plan_activations_bf16_halves_the_predicted_activation_memory() {
    let f32_file = cost_file("");
    let f = activation_part(&plans(&f32_file, &[]));
    let b = activation_part(&plans(&f32_file, &["--activations", "bf16"]));
    assert_scaled(&b, &f, 0.5);
    // A file in bf16 planned as f32 doubles; without the flag it stays in the file's type.
    let bf16_file = cost_file(r#", "activation_dtype": "bf16""#);
    assert_scaled(
        &activation_part(&plans(&bf16_file, &["--activations", "f32"])),
        &f,
        2.0,
    );
    assert_scaled(&activation_part(&plans(&bf16_file, &[])), &f, 1.0);
}

#[test]
fn plan_refuses_a_bad_activations_value() {
    let c = cost_file("");
    let c = c.to_str().unwrap();
    assert_refused([(
        vec![
            "plan",
            "--costs",
            c,
            "--ranks",
            "2",
            "--global-batch",
            "16",
            "--activations",
            "fp8",
        ],
        "--activations fp8: give f32 or bf16",
    )]);
}

/// `train` on 2 ranks with `extra` flags, five steps: the losses.
fn train(extra: &[&str]) -> Vec<f32> {
    losses(pipefill(&small_train(&[&["--steps", "5"], extra].concat())))
}

#[test]
fn train_activations_bf16_rounds_for_real() {
    let f = train(&[]);
    let b = train(&["--activations", "bf16"]);
    assert_ne!(f, b, "bf16 storage must change the losses");
    // 4 layers + the input: at most 5 roundings of 2^-8 on the way to the loss, x 8 (see
    // tests/runtime_bf16.rs for the derivation).
    for (x, y) in f.iter().zip(&b) {
        assert!(((x - y) / x).abs() <= 8.0 * 5.0 / 256.0, "{f:?} vs {b:?}");
    }
}

/// Under `mpirun -n 2` (feature `mpi`) the BF16 tensors cross the wire as their bits: the losses
/// are those of the threaded run storing BF16.
#[cfg(feature = "mpi")]
#[test]
fn bf16_tensors_cross_mpi_as_the_threaded_run_passes_them() {
    let args = small_train(&[
        "--steps",
        "3",
        "--activations",
        "bf16",
        "--schedule",
        "zb-h1",
    ]);
    let threads = losses(pipefill(&args));
    let dir = common::scratch("bf16-mpi");
    let mpi = losses(common::mpirun(
        &dir,
        2,
        &[&args[..], &["--launcher", "mpi"]].concat(),
    ));
    assert_eq!(mpi.len(), threads.len());
    for (a, b) in mpi.iter().zip(&threads) {
        assert!((a - b).abs() <= 1e-6, "{mpi:?} vs {threads:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
