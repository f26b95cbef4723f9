//! `pipefill simulate` end to end: table and JSON output, trace and SVG files, the cost of the bubble,
//! and refusals with exit code 2 that name the flag or field.

use std::path::PathBuf;

use serde_json::Value;

mod common;
use common::pipefill;

fn dir() -> PathBuf {
    common::scratch("cli-simulate")
}

fn write(name: &str, text: &str) -> PathBuf {
    let p = dir().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--format", "json"]);
    let (code, out, err) = pipefill(&all);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn json_results_best_first_with_closed_forms() {
    let v = json(&[
        "simulate",
        "--schedule",
        "1f1b,gpipe,zb-h1",
        "--ranks",
        "4",
        "--microbatches",
        "8",
        "--cost",
        "F=1,I=1,W=1",
    ]);
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["schedule"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "zb-h1", "best first: {names:?}");
    for r in rows {
        let makespan = r["makespan"].as_f64().unwrap();
        for key in ["busy", "idle", "peak_activations", "parameter_bytes"] {
            assert_eq!(r[key].as_array().unwrap().len(), 4, "{key}");
        }
        let lb = r["lower_bound"].as_f64().unwrap();
        assert!(close(
            r["ratio_to_lower_bound"].as_f64().unwrap(),
            makespan / lb
        ));
        match r["schedule"].as_str().unwrap() {
            "1f1b" | "gpipe" => {
                assert!(close(makespan, 11.0 * 3.0));
                assert!(close(r["bubble_fraction"].as_f64().unwrap(), 3.0 / 11.0));
            }
            _ => assert!(close(makespan, 24.0 + 3.0)), // ZB-H1: M(F+I+W) + (P-1)(F+I-W)
        }
    }
    let one = rows.iter().find(|r| r["schedule"] == "1f1b").unwrap();
    assert_eq!(
        one["peak_activations"],
        serde_json::json!([4.0, 3.0, 2.0, 1.0])
    );
    assert_eq!(one["peak_activations_unit"], "rank-microbatches");
}

#[test]
fn table_lists_every_schedule_and_a_text_gantt() {
    let (code, out, err) = pipefill(&[
        "simulate",
        "--schedule",
        "1f1b,interleaved-1f1b",
        "--ranks",
        "2",
        "--microbatches",
        "4",
        "--chunks",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().next().unwrap().starts_with("schedule"));
    assert!(out.contains("interleaved-1f1b   2  2"), "{out}");
    assert!(out.contains("rank 1 |"), "{out}");
    let (_, quiet, _) = pipefill(&[
        "simulate",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--microbatches",
        "4",
        "--gantt",
        "never",
    ]);
    assert!(!quiet.contains("rank 1 |"));
}

/// Abstract costs (no time suffix, as the default `F=1,I=1,W=1`) are reported in "units", not
/// seconds; one suffix makes every time seconds.
#[test]
fn unit_less_costs_are_not_called_seconds() {
    let base = [
        "simulate",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--microbatches",
        "2",
    ];
    let (code, out, err) = pipefill(&base);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("(s)") && !out.contains(" s,"), "{out}");
    assert!(out.contains("makespan 9 units"), "{out}");
    let with = |cost: &str| {
        let mut args = base.to_vec();
        args.extend(["--cost", cost]);
        json(&args)["results"][0]["time_unit"].clone()
    };
    assert_eq!(with("F=1,I=1,W=1,A=1MiB"), "units");
    assert_eq!(with("F=1ms,I=1,W=1"), "s");
    let mut args = base.to_vec();
    args.extend(["--cost", "F=10ms,B=20ms"]);
    let (code, out, err) = pipefill(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("makespan (s)") && out.contains("makespan 0.09 s"),
        "{out}"
    );
}

#[test]
fn bubble_cost_matches_the_seed_example() {
    // 1F1B with P = 2, M = 1, F = 5 ms, B = 10 ms: makespan 30 ms, each GPU busy 15 ms: 15 ms of bubble
    // per GPU per step; over 10 million steps 41.67 GPU-hours per GPU.
    // The seed example's run, priced per GPU-hour or per cluster-day.
    let priced = |price: [&str; 2]| {
        let mut args = vec![
            "simulate",
            "--schedule",
            "1f1b",
            "--ranks",
            "2",
            "--microbatches",
            "1",
            "--cost",
            "F=5ms,B=10ms",
            "--steps",
            "10000000",
        ];
        args.extend(price);
        json(&args)
    };
    let v = priced(["--price-per-gpu-hour", "2"]);
    let b = &v["results"][0]["bubble"];
    assert!(close(b["idle_per_gpu_per_step"].as_f64().unwrap(), 0.015));
    assert!(close(
        b["gpu_hours_per_gpu"].as_f64().unwrap(),
        0.015 * 1e7 / 3600.0
    ));
    assert!(close(
        b["gpu_hours"].as_f64().unwrap(),
        2.0 * 0.015 * 1e7 / 3600.0
    ));
    assert!(close(
        b["cost"].as_f64().unwrap(),
        2.0 * 2.0 * 0.015 * 1e7 / 3600.0
    ));
    let v = priced(["--cluster-cost-per-day", "96"]);
    assert!(close(
        v["results"][0]["bubble"]["price_per_gpu_hour"]
            .as_f64()
            .unwrap(),
        2.0
    ));
}

#[test]
fn cost_file_latency_and_files_out() {
    let costs = write(
        "costs.json",
        r#"{"layers": [
            {"name": "embed", "forward": 0.002, "backward": 0.004, "activation_bytes": 1048576, "parameter_bytes": 4096, "output_bytes": 65536},
            {"name": "block", "forward": 0.001, "backward_input": 0.001, "backward_weight": 0.001, "activation_bytes": 1048576, "parameter_bytes": 4096, "output_bytes": 65536},
            {"name": "block", "forward": 0.001, "backward_input": 0.001, "backward_weight": 0.001, "activation_bytes": 1048576, "parameter_bytes": 4096, "output_bytes": 65536},
            {"name": "head", "forward": 0.003, "backward": 0.006, "activation_bytes": 2097152, "parameter_bytes": 8192}],
          "transfer": {"latency": 0.0001, "bandwidth": 1e9}}"#,
    );
    let trace = dir().join("t.json");
    let svg = dir().join("t.svg");
    let v = json(&[
        "simulate",
        "--schedule",
        "1f1b,zb-h1",
        "--ranks",
        "2",
        "--microbatches",
        "4",
        "--costs",
        costs.to_str().unwrap(),
        "--layers-per-stage",
        "1,3",
        "--trace",
        trace.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let r = &v["results"][0];
    assert_eq!(r["peak_activations_unit"], "bytes");
    assert_eq!(r["parameter_bytes"], serde_json::json!([4096.0, 16384.0]));
    assert!(r["transfers"].as_u64().unwrap() == 8);
    let tr: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = tr["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["ph"] == "s") && events.iter().any(|e| e["ph"] == "f"));
    assert!(events
        .iter()
        .any(|e| e["args"]["name"] == "zb-h1 (predicted) rank 1"));
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.contains("1f1b</tspan>") && s.contains("zb-h1</tspan>"));
    // Latency override: one more hop of latency per direction shows in the makespan.
    let fast = json(&[
        "simulate",
        "--schedule",
        "gpipe",
        "--ranks",
        "2",
        "--microbatches",
        "1",
    ]);
    let slow = json(&[
        "simulate",
        "--schedule",
        "gpipe",
        "--ranks",
        "2",
        "--microbatches",
        "1",
        "--comm-latency",
        "0.5",
    ]);
    let d = slow["results"][0]["makespan"].as_f64().unwrap()
        - fast["results"][0]["makespan"].as_f64().unwrap();
    assert!(close(d, 1.0), "{d}");
}

#[test]
fn schedule_files_are_simulated() {
    let (code, text, err) = pipefill(&[
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--microbatches",
        "2",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let f = write("mine.json", &text);
    let v = json(&["simulate", "--schedule-file", f.to_str().unwrap()]);
    assert!(close(
        v["results"][0]["makespan"].as_f64().unwrap(),
        3.0 * 3.0
    ));
    let bad = write("bad.csv", "0F0,0B0\n1B0,1F0\n");
    let (code, _, err) = pipefill(&["simulate", "--schedule-file", bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.csv"), "{err}");
}

#[test]
fn refusals_exit_2_naming_the_problem() {
    let bad_cost = write(
        "bad.json",
        r#"{"layers": [{"name": "a", "forward": -1, "backward": 1, "activation_bytes": 0, "parameter_bytes": 0}]}"#,
    );
    let nan_cost = write(
        "nan.json",
        r#"{"layers": [{"name": "a", "forward": "NaN", "backward": 1, "activation_bytes": 0, "parameter_bytes": 0}]}"#,
    );
    let base = [
        "simulate",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--microbatches",
        "4",
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["simulate"], "nothing to simulate"),
        (
            vec!["simulate", "--schedule", "1f1b", "--ranks", "2"],
            "--microbatches",
        ),
        (
            vec![
                "simulate",
                "--schedule",
                "nope",
                "--ranks",
                "2",
                "--microbatches",
                "2",
            ],
            "unknown schedule family `nope`",
        ),
        (
            vec![
                "simulate",
                "--schedule",
                "1f1b",
                "--ranks",
                "0",
                "--microbatches",
                "2",
            ],
            "1f1b",
        ),
        (
            vec![
                "simulate",
                "--schedule",
                "interleaved-1f1b:x",
                "--ranks",
                "2",
                "--microbatches",
                "2",
            ],
            "not a number of chunks",
        ),
        (
            [&base[..], &["--cost", "F=1,Q=2"]].concat(),
            "unknown key `Q`",
        ),
        ([&base[..], &["--cost", "F=-1,B=1"]].concat(), "negative"),
        (
            [&base[..], &["--costs", bad_cost.to_str().unwrap()]].concat(),
            "layers[0].forward",
        ),
        (
            [&base[..], &["--costs", nan_cost.to_str().unwrap()]].concat(),
            "layers[0].forward",
        ),
        (
            [&base[..], &["--costs", "/no/such/file.json"]].concat(),
            "cannot read cost file",
        ),
        (
            [&base[..], &["--cost", "F=1,B=1", "--costs", "x.json"]].concat(),
            "cannot be used with",
        ),
        ([&base[..], &["--comm-latency=-3"]].concat(), "negative"),
        ([&base[..], &["--comm-bandwidth", "0"]].concat(), "positive"),
        (
            [&base[..], &["--overlap-share", "2"]].concat(),
            "between 0 and 1",
        ),
        (
            [&base[..], &["--price-per-gpu-hour", "2"]].concat(),
            "need --steps",
        ),
        (
            [&base[..], &["--layers-per-stage", "1,1"]].concat(),
            "needs a per-layer cost file",
        ),
        (
            [&base[..], &["--svg", "/no/such/dir/x.svg"]].concat(),
            "/no/such/dir/x.svg",
        ),
        ([&base[..], &["--format", "yaml"]].concat(), "yaml"),
    ];
    for (args, needle) in cases {
        let (code, out, err) = pipefill(&args);
        assert_eq!(code, 2, "{args:?}: exit {code}, stderr {err}");
        assert!(
            err.contains(needle),
            "{args:?}: wanted `{needle}` in `{err}`"
        );
        assert!(out.is_empty(), "{args:?} printed {out}");
    }
    assert!(!std::path::Path::new("/no/such/dir/x.svg").exists());
}

#[test]
fn the_formats_doc_cost_file_example_is_accepted() {
    let doc = include_str!("../docs/formats.md");
    let at = doc
        .find("**Cost file**")
        .expect("docs/formats.md has the cost file example");
    let start = at + doc[at..].find("```json\n").expect("a json block") + "```json\n".len();
    let end = start + doc[start..].find("```").unwrap();
    let f = write("formats-doc-costs.json", &doc[start..end]);
    let v = json(&[
        "simulate",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--microbatches",
        "2",
        "--costs",
        f.to_str().unwrap(),
    ]);
    assert_eq!(v["results"][0]["peak_activations_unit"], "bytes");
}

/// `simulate` of 1F1B on 4 ranks, M = 8, with the cost flags `costs` and `--recompute mode`: its
/// one result.
fn recomputed_1f1b(costs: [&str; 2], mode: &str) -> Value {
    let v = json(&[
        "simulate",
        "--schedule",
        "1f1b",
        "--ranks",
        "4",
        "--microbatches",
        "8",
        costs[0],
        costs[1],
        "--recompute",
        mode,
    ]);
    v["results"][0].clone()
}

/// What `simulate --recompute mode` of 1F1B on the default `--cost` says on stderr, in one error
/// line; it must exit 2.
fn refused(mode: &str) -> String {
    let (code, _, err) = pipefill(&[
        "simulate",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--microbatches",
        "2",
        "--recompute",
        mode,
    ]);
    assert_eq!(code, 2, "{err}");
    // One error line (a value the flag's parser refuses also gets clap's pointer to --help).
    let errors = err.lines().filter(|l| l.starts_with("error")).count();
    assert_eq!(errors, 1, "{err}");
    err
}

/// The largest `peak_activations` of a result.
fn peak(r: &Value) -> f64 {
    r["peak_activations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .fold(0.0, f64::max)
}

#[test]
fn recompute_full_trades_time_for_memory_and_is_reported_per_stage() {
    let run = |mode: &str| recomputed_1f1b(["--cost", "F=1,I=1,W=1,A=100,O=10"], mode);
    let (none, full) = (run("none"), run("full"));
    assert!(peak(&full) < peak(&none), "{full}\n{none}");
    assert!(full["makespan"].as_f64().unwrap() > none["makespan"].as_f64().unwrap());
    assert_eq!(
        full["recompute"],
        serde_json::json!(["full", "full", "full", "full"])
    );
    assert_eq!(
        none["recompute"],
        serde_json::json!(["none", "none", "none", "none"])
    );
    // The bound sees the longer backward too: the schedule stays at or above it.
    assert!(full["lower_bound"].as_f64().unwrap() > none["lower_bound"].as_f64().unwrap());
    let err = refused("half");
    assert!(
        err.contains("--recompute") && err.contains("none, full"),
        "{err}"
    );
}

#[test]
fn recompute_selective_prices_the_declared_part_and_refuses_costs_without_it() {
    let stage = r#"{"forward": 1, "backward": 2, "activation_bytes": 100, "parameter_bytes": 0, "output_bytes": 10, "selective_bytes": 40, "selective_time": 0.25}"#;
    let costs = write(
        "selective-stages.json",
        &format!(r#"{{"stages": [{stage}, {stage}, {stage}, {stage}]}}"#),
    );
    let path = costs.to_str().unwrap();
    let [none, sel, full] =
        ["none", "selective", "full"].map(|m| recomputed_1f1b(["--costs", path], m));
    let time = |r: &Value| r["makespan"].as_f64().unwrap();
    assert!(
        peak(&full) < peak(&sel) && peak(&sel) < peak(&none),
        "{sel}"
    );
    assert!(
        time(&none) < time(&sel) && time(&sel) < time(&full),
        "{sel}"
    );
    assert_eq!(sel["recompute"], serde_json::json!(vec!["selective"; 4]));
    // `--cost` declares nothing selective: refused, one line naming the flag.
    let err = refused("selective");
    assert!(err.contains("--recompute selective"), "{err}");
}
