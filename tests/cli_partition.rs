//! `pipefill partition` end to end: output keys and values, and refusals with exit code 2.

use std::path::PathBuf;

mod common;
use common::pipefill;

/// Writes a cost file whose layers' F + I + W are `totals` (F = I = W = total / 3).
fn cost_file(name: &str, totals: &[f64], extra: &str) -> PathBuf {
    let dir = common::scratch("cli-partition");
    let layers: Vec<String> = totals
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let third = t / 3.0;
            format!(
                r#"{{"name": "l{i}", "forward": {third}, "backward_input": {third}, "backward_weight": {third}, "activation_bytes": 0, "parameter_bytes": {p}{extra}}}"#,
                p = 1000 - i
            )
        })
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, format!(r#"{{"layers": [{}]}}"#, layers.join(","))).unwrap();
    path
}

#[test]
fn json_output_of_the_torchgpipe_counterexample() {
    let f = cost_file("tg.json", &[81.0, 99.0, 98.0, 67.0, 67.0, 96.0, 57.0], "");
    let (code, out, err) = pipefill(&[
        "partition",
        "--costs",
        f.to_str().unwrap(),
        "--stages",
        "4",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["method"], "optimal");
    assert_eq!(v["layers_per_stage"], serde_json::json!([2, 1, 2, 2]));
    assert!(
        (v["bottleneck"].as_f64().unwrap() - 180.0).abs() < 1e-6,
        "{v}"
    );
    assert_eq!(v["stage_costs"].as_array().unwrap().len(), 4);

    let (code, out, _) = pipefill(&[
        "partition",
        "--costs",
        f.to_str().unwrap(),
        "--stages",
        "4",
        "--method",
        "time-greedy",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        (v["bottleneck"].as_f64().unwrap() - 287.0).abs() < 1e-6,
        "{v}"
    );
    assert!((v["ratio_to_optimal"].as_f64().unwrap() - 287.0 / 180.0).abs() < 1e-9);
}

#[test]
fn all_methods_table_and_json() {
    let f = cost_file("all.json", &[5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 5.0], "");
    let (code, out, err) = pipefill(&[
        "partition",
        "--costs",
        f.to_str().unwrap(),
        "--stages",
        "4",
        "--ranks",
        "2",
        "--method",
        "all",
    ]);
    assert_eq!(code, 0, "{err}");
    for m in ["optimal", "uniform", "parameters", "time-greedy"] {
        assert!(out.contains(m), "{m} missing from:\n{out}");
    }
    let (code, out, _) = pipefill(&[
        "partition",
        "--costs",
        f.to_str().unwrap(),
        "--stages",
        "4",
        "--ranks",
        "2",
        "--placement",
        "vshape",
        "--method",
        "all",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 4);
    let best = arr[0]["bottleneck"].as_f64().unwrap();
    assert_eq!(arr[0]["placement"], "vshape");
    assert!(arr
        .iter()
        .all(|r| r["bottleneck"].as_f64().unwrap() >= best - 1e-12));
}

#[test]
fn bad_inputs_exit_2_with_a_clear_message() {
    let good = cost_file("good.json", &[1.0, 2.0, 3.0], "");
    let g = good.to_str().unwrap();
    let nan_file = std::env::temp_dir().join(format!(
        "pipefill-cli-partition-{}-neg.json",
        std::process::id()
    ));
    std::fs::write(&nan_file, r#"{"layers": [{"name": "a", "forward": -1, "backward": 1, "activation_bytes": 0, "parameter_bytes": 0}]}"#).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "partition",
                "--costs",
                "/nonexistent/costs.json",
                "--stages",
                "2",
            ],
            "cannot read",
        ),
        (
            vec![
                "partition",
                "--costs",
                nan_file.to_str().unwrap(),
                "--stages",
                "1",
            ],
            "layers[0].forward",
        ),
        (vec!["partition", "--costs", g, "--stages", "4"], "3 layers"),
        (vec!["partition", "--costs", g, "--stages", "0"], "--stages"),
        (
            vec!["partition", "--costs", g, "--stages", "3", "--ranks", "2"],
            "--ranks",
        ),
        (
            vec![
                "partition",
                "--costs",
                g,
                "--stages",
                "2",
                "--ranks",
                "2",
                "--placement",
                "vshape",
            ],
            "vshape",
        ),
        (
            vec![
                "partition",
                "--costs",
                g,
                "--stages",
                "2",
                "--memory-limit",
                "10",
            ],
            "--schedule",
        ),
        (
            vec![
                "partition",
                "--costs",
                g,
                "--stages",
                "2",
                "--memory-limit",
                "10",
                "--schedule",
                "nope",
                "--microbatches",
                "4",
            ],
            "nope",
        ),
        (
            vec![
                "partition",
                "--costs",
                g,
                "--stages",
                "2",
                "--method",
                "best",
            ],
            "best",
        ),
        (
            vec![
                "partition",
                "--costs",
                g,
                "--stages",
                "2",
                "--schedule",
                "auto",
                "--microbatches",
                "4",
                "--memory-limit",
                "1e9",
            ],
            "pipefill plan --families auto",
        ),
    ];
    common::assert_refused(cases);
}

#[test]
fn memory_limit_refuses_with_the_needed_bytes() {
    // Parameters 1000, 999, 998: 2 stages on 1f1b; any split puts >= 1997 bytes on one rank.
    let f = cost_file("mem.json", &[1.0, 1.0, 1.0], "");
    let (code, _, err) = pipefill(&[
        "partition",
        "--costs",
        f.to_str().unwrap(),
        "--stages",
        "2",
        "--memory-limit",
        "1500",
        "--schedule",
        "1f1b",
        "--microbatches",
        "4",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("1997"), "{err}");
    let (code, out, err) = pipefill(&[
        "partition",
        "--costs",
        f.to_str().unwrap(),
        "--stages",
        "2",
        "--memory-limit",
        "1997",
        "--schedule",
        "1f1b",
        "--microbatches",
        "4",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["layers_per_stage"], serde_json::json!([1, 2]));
}

#[test]
fn plan_json_best_first_and_refusals() {
    let f = cost_file("plan.json", &[6.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 6.0], "");
    let g = f.to_str().unwrap();
    let (code, out, err) = pipefill(&[
        "plan",
        "--costs",
        g,
        "--ranks",
        "4",
        "--global-batch",
        "8",
        "--cost-batch",
        "1",
        "--format",
        "json",
        "--top",
        "5",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let plans = v["plans"].as_array().unwrap();
    assert!(!plans.is_empty() && plans.len() <= 5);
    let steps: Vec<f64> = plans
        .iter()
        .map(|p| p["step_time"].as_f64().unwrap())
        .collect();
    assert!(
        steps.windows(2).all(|w| w[0] <= w[1] * (1.0 + 1e-9)),
        "{steps:?}"
    );
    for key in [
        "family",
        "chunks",
        "microbatches",
        "layers_per_stage",
        "bubble_fraction",
        "peak_memory",
        "ratio_to_bound",
    ] {
        assert!(plans[0].get(key).is_some(), "{key} missing");
    }
    let svg = std::env::temp_dir().join(format!(
        "pipefill-cli-partition-{}-plan.svg",
        std::process::id()
    ));
    let (code, out, err) = pipefill(&[
        "plan",
        "--costs",
        g,
        "--ranks",
        "2",
        "--global-batch",
        "4",
        "--cost-batch",
        "1",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("best first"), "{out}");
    // The last line names the plan chosen (the fastest, or a near-tie's pick); the SVG draws it.
    let chosen = out.lines().last().unwrap();
    assert!(chosen.starts_with("chosen: #"), "{out}");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(
        drawn.starts_with("<svg") && drawn.contains("chosen plan"),
        "{drawn}"
    );

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["plan", "--costs", g, "--ranks", "4", "--global-batch", "8"],
            "--cost-batch",
        ),
        (
            vec![
                "plan",
                "--costs",
                g,
                "--ranks",
                "0",
                "--global-batch",
                "8",
                "--cost-batch",
                "1",
            ],
            "--ranks",
        ),
        (
            vec![
                "plan",
                "--costs",
                g,
                "--ranks",
                "4",
                "--global-batch",
                "8",
                "--cost-batch",
                "1",
                "--families",
                "nope",
            ],
            "nope",
        ),
        (
            vec![
                "plan",
                "--costs",
                g,
                "--ranks",
                "9",
                "--global-batch",
                "8",
                "--cost-batch",
                "1",
            ],
            "--ranks 9",
        ),
        (
            vec![
                "plan",
                "--costs",
                g,
                "--ranks",
                "4",
                "--global-batch",
                "8",
                "--cost-batch",
                "1",
                "--memory-limit",
                "1",
            ],
            "no plan fits",
        ),
    ];
    common::assert_refused(cases);
}

#[test]
fn train_uses_the_plan_by_default() {
    let dir = common::scratch("cli-partition");
    let svg = dir.join("t.svg");
    let base = [
        "train",
        "--layers",
        "6",
        "--hidden",
        "32",
        "--batch",
        "16",
        "--microbatches",
        "4",
        "--steps",
        "2",
        "--ranks",
        "2",
        "--schedule",
        "1f1b",
        "--format",
        "json",
        "--svg",
        svg.to_str().unwrap(),
    ];
    for (extra, plan) in [(vec![], "auto"), (vec!["--plan", "uniform"], "uniform")] {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra);
        let (code, out, err) = pipefill(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["plan"], plan);
        let counts: Vec<u64> = v["layers_per_stage"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .collect();
        assert_eq!(counts.iter().sum::<u64>(), 6);
        if plan == "uniform" {
            assert_eq!(counts, vec![3, 3]);
        }
    }
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--plan", "best"]);
    let (code, _, err) = pipefill(&args);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn profile_writes_a_cost_file_that_partition_and_plan_read() {
    let dir = common::scratch("cli-partition");
    let out = dir.join("profiled.json");
    let o = out.to_str().unwrap();
    let (code, _, err) = pipefill(&[
        "profile",
        "--layers",
        "4",
        "--hidden",
        "32",
        "--outputs",
        "8",
        "--batch",
        "16",
        "--microbatches",
        "4",
        "--repeats",
        "3",
        "--out",
        o,
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    let file = pipefill_host::cost::CostFile::parse(&text).unwrap();
    assert_eq!(file.layers.len(), 4);
    assert_eq!(file.meta["microbatch_size"], 4);
    // The CPU backend runs an overlapped pair's halves one after the other, and says so.
    assert_eq!(file.overlap_share, 1.0);
    assert_eq!(file.meta["pair_execution"], "sequential");
    // Layer 0: 32 -> 32 weights + bias in f32; output 4 rows x 32.
    assert_eq!(file.layers[0].parameter_bytes, ((32 * 32 + 32) * 4) as f64);
    assert_eq!(file.layers[0].output_bytes, (4 * 32 * 4) as f64);
    assert_eq!(file.layers[3].output_bytes, (4 * 8 * 4) as f64);
    assert!(file
        .layers
        .iter()
        .all(|l| l.forward > 0.0 && l.backward_weight > 0.0));
    // The fixed part is fitted from a second profile at an eighth of the rows (at least 1).
    assert_eq!(file.meta["fit_microbatch_size"], 1);
    assert!(file.layers.iter().all(|l| l.fixed.is_some()));
    // `--sizes auto` (default): every power of two up to the batch but the microbatch size itself.
    assert_eq!(
        file.meta["sample_microbatch_sizes"],
        serde_json::json!([1, 2, 8, 16])
    );
    for l in &file.layers {
        let scales: Vec<f64> = l.samples.iter().map(|s| s.scale).collect();
        assert_eq!(scales, vec![0.25, 0.5, 2.0, 4.0], "{}", l.name);
        assert!(
            l.samples
                .iter()
                .all(|s| s.forward > 0.0 && s.backward > 0.0),
            "{l:?}"
        );
    }
    let (code, _, err) = pipefill(&["partition", "--costs", o, "--stages", "2"]);
    assert_eq!(code, 0, "{err}");
    let (code, out_text, err) =
        pipefill(&["plan", "--costs", o, "--ranks", "2", "--global-batch", "16"]);
    assert_eq!(code, 0, "{err}");
    assert!(out_text.contains("sampled time scaling"), "{out_text}");

    // A small profile with `extra` flags, then the scaling `plan` reports for it.
    let small = |name: &str, extra: &[&str]| -> (pipefill_host::cost::CostFile, String) {
        let path = dir.join(name);
        let p = path.to_str().unwrap();
        let mut args = vec![
            "profile",
            "--layers",
            "2",
            "--hidden",
            "16",
            "--outputs",
            "4",
            "--batch",
            "16",
            "--microbatches",
            "2",
            "--repeats",
            "1",
            "--out",
            p,
        ];
        args.extend_from_slice(extra);
        let (code, _, err) = pipefill(&args);
        assert_eq!(code, 0, "{err}");
        let file =
            pipefill_host::cost::CostFile::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let (code, out_text, err) =
            pipefill(&["plan", "--costs", p, "--ranks", "2", "--global-batch", "16"]);
        assert_eq!(code, 0, "{err}");
        (file, out_text)
    };
    // `--sizes none`: the fixed part alone, affine scaling.
    let (_, out_text) = small("affine.json", &["--sizes", "none"]);
    assert!(out_text.contains("affine time scaling"), "{out_text}");
    // `--fit-rows 0` too: one size, no fixed part, linear scaling as before.
    let (file, out_text) = small("one-size.json", &["--fit-rows", "0", "--sizes", "none"]);
    assert!(file.layers.iter().all(|l| l.fixed.is_none()));
    assert!(out_text.contains("linear time scaling"), "{out_text}");

    common::assert_refused([
        (
            vec![
                "profile",
                "--batch",
                "16",
                "--microbatches",
                "3",
                "--out",
                o,
            ],
            "--microbatches",
        ),
        (vec!["profile", "--repeats", "0", "--out", o], "--repeats"),
        (
            vec![
                "profile",
                "--batch",
                "16",
                "--microbatches",
                "4",
                "--fit-rows",
                "4",
                "--out",
                o,
            ],
            "--fit-rows",
        ),
        (
            vec!["profile", "--activation", "tanhh", "--out", o],
            "--activation",
        ),
        (vec!["profile", "--sizes", "8,0", "--out", o], "--sizes"),
        (vec!["profile", "--sizes", "all", "--out", o], "--sizes"),
        (
            vec!["profile", "--out", "/nonexistent-dir/costs.json"],
            "cannot write",
        ),
    ]);
}
