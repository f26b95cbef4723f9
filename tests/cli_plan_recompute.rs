//! `--recompute` on `plan` (none|full|auto, auto by default under --memory-limit) and
//! `simulate --recompute auto`: what they choose, and one-line refusals with exit code 2.

use std::path::PathBuf;

use serde_json::Value;

mod common;
use common::pipefill;

/// Eight layers whose stashes dwarf their inputs, measured at one sample a microbatch.
fn costs() -> PathBuf {
    let layer = |i: usize| {
        serde_json::json!({"name": format!("l{i}"), "forward": 0.25, "backward_input": 1.0,
            "backward_weight": 1.0, "activation_bytes": 100.0, "released_at_input": 60.0,
            "output_bytes": 1.0, "parameter_bytes": 1.0})
    };
    let file = serde_json::json!({
        "layers": (0..8).map(layer).collect::<Vec<_>>(),
        "meta": {"microbatch_size": 1},
    });
    let p = common::scratch("cli-recompute").join("costs.json");
    std::fs::write(&p, file.to_string()).unwrap();
    p
}

fn plan_json(extra: &[&str]) -> (i32, Value, String) {
    let c = costs();
    let mut args = vec![
        "plan",
        "--costs",
        c.to_str().unwrap(),
        "--ranks",
        "4",
        "--global-batch",
        "16",
        "--format",
        "json",
        "--top",
        "1000",
    ];
    args.extend(extra);
    let (code, out, err) = pipefill(&args);
    (code, serde_json::from_str(&out).unwrap_or(Value::Null), err)
}

fn worst(p: &Value) -> f64 {
    p["peak_memory"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .fold(0.0, f64::max)
}

#[test]
fn plan_under_a_limit_recomputes_by_default_and_reports_it_per_stage() {
    let (code, all, err) = plan_json(&[]);
    assert_eq!(code, 0, "{err}");
    let plans = all["plans"].as_array().unwrap();
    assert!(plans.iter().all(|p| p["recompute"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m == "none")));
    let least = plans.iter().map(worst).fold(f64::INFINITY, f64::min);
    let limit = format!("{}", (0.6 * least).floor());
    let (code, _, err) = plan_json(&["--memory-limit", &limit, "--recompute", "none"]);
    assert_eq!(code, 2, "{err}");
    let (code, v, err) = plan_json(&["--memory-limit", &limit]);
    assert_eq!(code, 0, "{err}");
    let best = &v["plans"][0];
    assert!(worst(best) <= 0.6 * least, "{best}");
    let modes = best["recompute"].as_array().unwrap();
    assert_eq!(
        modes.len(),
        best["layers_per_stage"].as_array().unwrap().len()
    );
    assert!(modes.iter().any(|m| m == "full"), "{best}");
}

#[test]
fn plan_table_has_a_recompute_column_and_bad_values_are_refused() {
    let c = costs();
    let base = [
        "plan",
        "--costs",
        c.to_str().unwrap(),
        "--ranks",
        "4",
        "--global-batch",
        "16",
    ];
    let (code, out, err) = pipefill(&[&base[..], &["--recompute", "full"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("recompute") && out.contains(" full "), "{out}");
    let (code, _, err) = pipefill(&[&base[..], &["--recompute", "some"]].concat());
    assert_eq!(code, 2);
    // clap's refusal: one line naming the flag and the values, then its usual pointer to --help.
    let first = err.lines().next().unwrap_or("");
    assert!(
        first.contains("--recompute") && first.contains("none, full, auto"),
        "{err}"
    );
}

fn simulate(extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        "simulate",
        "--schedule",
        "1f1b",
        "--ranks",
        "4",
        "--microbatches",
        "8",
        "--cost",
        "F=1,I=1,W=1,A=100,O=10",
        "--format",
        "json",
    ];
    args.extend(extra);
    pipefill(&args)
}

#[test]
fn simulate_recompute_auto_recomputes_only_where_the_limit_needs_it() {
    // 1F1B's first rank holds four stashes (400 bytes), the others fewer.
    let (code, out, err) = simulate(&["--recompute", "auto", "--memory-limit", "350"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let row = &v["results"][0];
    assert_eq!(
        row["recompute"],
        serde_json::json!(["full", "none", "none", "none"])
    );
    let peaks = row["peak_activations"].as_array().unwrap();
    assert!(peaks.iter().all(|p| p.as_f64().unwrap() <= 350.0), "{row}");
}

#[test]
fn simulate_recompute_auto_refuses_without_a_limit_or_when_nothing_fits() {
    let (code, out, err) = simulate(&["--recompute", "auto"]);
    assert_eq!(code, 2, "{out}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("--recompute auto") && err.contains("--memory-limit"),
        "{err}"
    );
    let (code, _, err) = simulate(&["--recompute", "auto", "--memory-limit", "50"]);
    assert_eq!(code, 2);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--memory-limit"), "{err}");
}

/// The actions whose boxes the SVG at `path` hatches as a recomputed forward, in order.
fn hatched(path: &std::path::Path) -> Vec<String> {
    let svg = std::fs::read_to_string(path).unwrap();
    svg.split(r#"fill="url(#rebuild)"><title>"#)
        .skip(1)
        .map(|rest| rest.split(" on rank").next().unwrap().to_string())
        .collect()
}

#[test]
fn simulate_svg_hatches_the_rebuilds_of_the_recomputing_stages_only() {
    let dir = common::scratch("cli-recompute-svg");
    let svg = dir.join("t.svg");
    let with_svg = |extra: &[&str]| {
        let (code, _, err) = simulate(&[extra, &["--svg", svg.to_str().unwrap()]].concat());
        assert_eq!(code, 0, "{err}");
        (hatched(&svg), std::fs::read_to_string(&svg).unwrap())
    };
    // Only stage 0 recomputes under 350 bytes: its eight B boxes, and nothing else, are hatched.
    let (auto, text) = with_svg(&["--recompute", "auto", "--memory-limit", "350"]);
    let want: Vec<String> = (0..8).map(|k| format!("0B{k}")).collect();
    let mut got = auto.clone();
    got.sort();
    assert_eq!(got, want, "{auto:?}");
    assert!(text.contains("recomputed forward"));
    // Full recomputation: every stage's backward.
    let (full, _) = with_svg(&["--recompute", "full"]);
    assert_eq!(full.len(), 4 * 8);
    assert!(full.iter().all(|a| a.contains('B')), "{full:?}");
    // Without recomputation: no hatch and no legend entry.
    let (none, text) = with_svg(&[]);
    assert!(none.is_empty() && !text.contains("recomputed forward"));
    // Two schedules, one picture: each panel hatches its own recomputing stages (ZB-H1 has I).
    let (both, _) = with_svg(&[
        "--schedule",
        "1f1b,zb-h1",
        "--recompute",
        "auto",
        "--memory-limit",
        "350",
    ]);
    assert!(
        both.iter()
            .all(|a| a.starts_with("0B") || a.starts_with("0I")),
        "{both:?}"
    );
    assert!(both.iter().any(|a| a.starts_with("0I")), "{both:?}");
}
