//! `auto` on the command line: `schedule`, `simulate`, `plan` and `bench auto`, and its refusals
//! (exit code 2, naming the flag).

use serde_json::Value;

mod common;
use common::{assert_refused, pipefill};

fn json(args: &[&str]) -> Value {
    let (code, out, err) = pipefill(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[test]
fn schedule_auto_writes_json_with_the_solver_that_validates() {
    let dir = common::scratch("cli-auto");
    let path = dir.join("auto.json");
    let p = path.to_str().unwrap();
    let args = [
        "schedule",
        "--schedule",
        "auto",
        "--ranks",
        "4",
        "--microbatches",
        "8",
        "--cost",
        "F=1,I=1.2,W=0.8",
        "--comm-latency",
        "0.1",
        "--max-in-flight",
        "3",
        "--time-budget",
        "0.05",
        "--format",
        "json",
        "--out",
        p,
    ];
    let (code, _, err) = pipefill(&args);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("auto: makespan"), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["name"], "auto");
    let solver = &v["solver"];
    assert_eq!(solver["objective"], "makespan");
    assert!(solver["value"].as_f64().unwrap() >= solver["lower_bound"].as_f64().unwrap());
    let peaks = solver["peak"].as_array().unwrap();
    assert!(
        peaks.iter().all(|x| x.as_f64().unwrap() <= 3.0),
        "{peaks:?}"
    );
    let (code, out, err) = pipefill(&["schedule", "--validate", p]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("OK auto"), "{out}");
    // The file simulates under the same costs to the makespan the solver recorded.
    let sim = json(&[
        "simulate",
        "--schedule-file",
        p,
        "--cost",
        "F=1,I=1.2,W=0.8",
        "--comm-latency",
        "0.1",
        "--format",
        "json",
    ]);
    let makespan = sim["results"][0]["makespan"].as_f64().unwrap();
    assert!((makespan - solver["makespan"].as_f64().unwrap()).abs() < 1e-9);
}

#[test]
fn simulate_takes_auto_next_to_the_families() {
    let v = json(&[
        "simulate",
        "--schedule",
        "auto,1f1b,zb-h1",
        "--ranks",
        "4",
        "--microbatches",
        "8",
        "--cost",
        "F=1,I=1,W=1",
        "--max-in-flight",
        "4",
        "--time-budget",
        "0.02",
        "--format",
        "json",
    ]);
    let rows = v["results"].as_array().unwrap();
    let of = |name: &str| {
        rows.iter()
            .find(|r| r["schedule"] == name)
            .unwrap_or_else(|| panic!("{name} missing"))["makespan"]
            .as_f64()
            .unwrap()
    };
    assert!(of("auto") <= of("zb-h1") && of("zb-h1") < of("1f1b"));
    let vshape = json(&[
        "simulate",
        "--schedule",
        "auto:2",
        "--placement",
        "vshape",
        "--ranks",
        "4",
        "--microbatches",
        "8",
        "--max-in-flight",
        "2",
        "--time-budget",
        "0.02",
        "--format",
        "json",
    ]);
    assert_eq!(vshape["results"][0]["chunks"], 2);
}

#[test]
fn refusals_name_the_flag() {
    let base = [
        "schedule",
        "--schedule",
        "auto",
        "--ranks",
        "4",
        "--microbatches",
        "8",
    ];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().copied().chain(extra.iter().copied()).collect()
    };
    assert_refused([
        (with(&["--objective", "fastest"]), "--objective"),
        (with(&["--max-in-flight", "0.5"]), "--max-in-flight"),
        (with(&["--max-in-flight", "-1"]), "--max-in-flight"),
        (with(&["--memory-limit", "1GiB"]), "--memory-limit"),
        (
            with(&["--cost", "F=1,I=1,W=1,A=1MiB", "--memory-limit", "1MB"]),
            "--memory-limit",
        ),
        (with(&["--time-budget", "-1"]), "--time-budget"),
        (with(&["--placement", "vshape", "--chunks", "1"]), "vshape"),
        (with(&["--cost", "F=1"]), "--cost"),
        (
            vec![
                "simulate",
                "--schedule",
                "auto",
                "--ranks",
                "4",
                "--microbatches",
                "8",
                "--max-in-flight",
                "0.9",
            ],
            "--max-in-flight",
        ),
    ]);
    // Flags that only steer auto are refused without it.
    assert_refused([
        (
            vec![
                "schedule",
                "--schedule",
                "1f1b",
                "--ranks",
                "2",
                "--microbatches",
                "2",
                "--cost",
                "F=1,B=2",
            ],
            "--cost steers the automatic scheduler only",
        ),
        (
            vec![
                "simulate",
                "--schedule",
                "1f1b",
                "--ranks",
                "2",
                "--microbatches",
                "2",
                "--objective",
                "span",
            ],
            "--objective steers the automatic scheduler only",
        ),
    ]);
    let (code, _, err) = pipefill(&with(&["--max-in-flight", "0.5"]));
    assert_eq!(code, 2);
    assert!(err.contains("below what any schedule needs"), "{err}");
}

#[test]
fn plan_takes_auto() {
    let dir = common::scratch("cli-auto-plan");
    let layers: Vec<Value> = (0..8)
        .map(|i| {
            let f = if i == 0 { 2.0 } else { 1.0 };
            // A selective part, as `profile` writes for the built-in layers: `auto` plans with it
            // whether or not a stage recomputes.
            serde_json::json!({"name": format!("l{i}"), "forward": f, "backward_input": f,
                "backward_weight": 0.8 * f, "activation_bytes": 1e6, "parameter_bytes": 1e6,
                "selective_bytes": 4e5, "selective_time": 0.05})
        })
        .collect();
    let file = dir.join("costs.json");
    let text = serde_json::json!({"layers": layers, "meta": {"microbatch_size": 1}});
    std::fs::write(&file, text.to_string()).unwrap();
    let path = file.to_str().unwrap();
    // auto and 1f1b planned at four ranks; `extra` gives the batch and the replicas.
    let plan = |extra: &[&str]| {
        let base = [
            "plan",
            "--costs",
            path,
            "--ranks",
            "4",
            "--families",
            "auto,1f1b",
        ];
        let rest = ["--time-budget", "0.02", "--format", "json", "--top", "50"];
        json(&[&base[..], extra, &rest[..]].concat())
    };
    let v = plan(&["--global-batch", "8"]);
    let plans = v["plans"].as_array().unwrap();
    let best = |name: &str| {
        plans
            .iter()
            .filter(|p| p["family"] == name)
            .map(|p| p["step_time"].as_f64().unwrap())
            .fold(f64::INFINITY, f64::min)
    };
    assert!(best("auto").is_finite() && best("auto") <= best("1f1b"));

    // With data parallelism every row, auto's too, is planned for D replicas: each runs its share
    // of the batch, and the all-reduces are in its step time.
    let v = plan(&["--global-batch", "16", "--data-parallel", "2"]);
    let plans = v["plans"].as_array().unwrap();
    assert!(plans.iter().any(|p| p["family"] == "auto"), "{v}");
    for p in plans {
        let (m, size) = (
            p["microbatches"].as_u64().unwrap(),
            p["microbatch_size"].as_u64().unwrap(),
        );
        assert_eq!(p["data_parallel"], 2, "{}: {p}", p["family"]);
        assert_eq!(
            m * size * 2,
            16,
            "{}: M {m} x {size} samples x D 2",
            p["family"]
        );
    }
    // The chosen plan is said, with the near-tie that decided it (null when the fastest won).
    assert!(v["chosen"]["rank"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["chosen"].get("near_tie").is_some(), "{v}");

    // With --workers, auto is planned at every split of the workers into P x D, as the families.
    let plan_workers = |n: &str| {
        let args = [
            "plan",
            "--costs",
            path,
            "--workers",
            n,
            "--families",
            "auto,1f1b",
            "--global-batch",
            "16",
            "--time-budget",
            "0.02",
            "--format",
            "json",
            "--top",
            "100",
        ];
        json(&args)
    };
    let v = plan_workers("4");
    let auto = v["plans"].as_array().unwrap().iter();
    let splits = common::splits(auto.filter(|p| p["family"] == "auto" && p["ranks"] != 1));
    assert_eq!(splits, vec![(2, 2), (4, 1)], "{v}");
}

#[test]
fn bench_auto_quick_meets_the_aims() {
    let v = json(&["bench", "auto", "--quick", "--json"]);
    let g = &v["grid"]["summary"];
    assert!(g["instances"].as_u64().unwrap() >= 8);
    assert_eq!(g["worse_than_a_family"], 0);
    assert_eq!(g["wide_limit"], g["wide_within_2_percent"]);
    // The V-shape grid: three limits, both objectives, never worse than a V-shape family that fits.
    let vs = &v["vshape"];
    assert_eq!(vs["summary"]["rows"], 6);
    assert_eq!(vs["summary"]["worse_than_a_family"], 0);
    assert_eq!(vs["summary"]["worse_with_more_memory"], 0);
    assert!(vs["summary"]["span_above_makespan_run"].is_u64(), "{vs}");
    assert_eq!(vs["summary"]["wide_limit"], 2);
    for r in vs["rows"].as_array().unwrap() {
        assert!(r["auto_ratio"].as_f64().unwrap() >= 1.0 - 1e-9, "{r}");
    }
    let p = &v["paper"];
    assert_eq!(p["rows"].as_array().unwrap().len(), 2);
    // The simulator reproduces the paper's own 1F1B rate from its profiled times.
    let row = &p["rows"][0];
    let ours = row["families"]["1f1b"].as_f64().unwrap();
    let paper = row["paper"]["1f1b"].as_f64().unwrap();
    assert!((ours - paper).abs() < 1e-4, "{ours} vs {paper}");
    let (code, out, err) = pipefill(&["bench", "auto", "--quick", "--part", "grid"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("aims over"), "{out}");
    let (code, out, err) = pipefill(&["bench", "auto", "--quick", "--part", "vshape"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("vshape grid") && out.contains("aims over 6 rows"),
        "{out}"
    );
}

/// `train --schedule auto` takes the automatic scheduler's flags: a tighter in-flight limit cannot
/// predict a shorter step (profiles differ between runs, so the comparison is on one run's plan each,
/// with generous slack), and auto's flags without auto are refused.
#[test]
fn train_takes_the_auto_flags() {
    let dir = common::scratch("auto-train");
    let svg = dir.join("t.svg");
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "train",
            "--schedule",
            "auto",
            "--steps",
            "1",
            "--format",
            "json",
            "--svg",
            svg.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = common::pipefill(&args);
        assert_eq!(code, 0, "{extra:?}: {err}");
        serde_json::from_str(&out).unwrap()
    };
    let free = run(&[]);
    let tight = run(&[
        "--max-in-flight",
        "1",
        "--time-budget",
        "0.05",
        "--objective",
        "span",
    ]);
    assert_eq!(tight["schedule"], "auto");
    // One microbatch in flight per rank leaves no overlap between the ranks' forwards: the
    // predicted bubble is far above the unconstrained plan's.
    let (b_free, b_tight) = (
        free["bubble_predicted"].as_f64().unwrap(),
        tight["bubble_predicted"].as_f64().unwrap(),
    );
    assert!(b_tight > b_free + 0.1, "free {b_free}, tight {b_tight}");
    common::assert_refused([
        (
            vec!["train", "--schedule", "1f1b", "--max-in-flight", "2"],
            "--max-in-flight",
        ),
        (
            vec!["train", "--schedule", "gpipe", "--objective", "span"],
            "--objective",
        ),
    ]);
}
