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
    let svg = common::scratch("cli-recompute-plan-svg").join("best.svg");
    let (code, v, err) = plan_json(&["--memory-limit", &limit, "--svg", svg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let best = &v["plans"][0];
    assert!(worst(best) <= 0.6 * least, "{best}");
    let modes = best["recompute"].as_array().unwrap();
    assert_eq!(
        modes.len(),
        best["layers_per_stage"].as_array().unwrap().len()
    );
    assert!(modes.iter().any(|m| m == "full"), "{best}");
    // The chosen plan's picture hatches the rebuilds of its recomputing stages, and only those.
    let chosen = &v["chosen"];
    let hatched_stages: std::collections::BTreeSet<usize> = hatched(&svg)[0]
        .1
        .iter()
        .map(|a| a[..a.find(['B', 'I']).unwrap()].parse().unwrap())
        .collect();
    let full: std::collections::BTreeSet<usize> = (chosen["recompute"].as_array().unwrap().iter())
        .enumerate()
        .filter(|(_, m)| *m == "full")
        .map(|(s, _)| s)
        .collect();
    assert_eq!(hatched_stages, full);
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
        first.contains("--recompute") && first.contains("none, full, selective, auto"),
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

/// Per panel of the SVG at `path` (by schedule name), the actions whose boxes it hatches as a
/// recomputed forward.
fn hatched(path: &std::path::Path) -> Vec<(String, Vec<String>)> {
    let svg = std::fs::read_to_string(path).unwrap();
    (svg.split(r#"<tspan font-weight="bold">"#).skip(1))
        .map(|panel| {
            let name = panel.split("</tspan>").next().unwrap().to_string();
            let actions = (panel.split(r#"fill="url(#rebuild)"><title>"#).skip(1))
                .map(|rest| rest.split(" on rank").next().unwrap().to_string())
                .collect();
            (name, actions)
        })
        .collect()
}

/// Per panel: the hatched actions and, from the JSON, the stages that recompute.
type Panel = (Vec<String>, Vec<usize>);

/// Runs `simulate` with `extra` and an SVG: each [`Panel`], and whether the legend names the hatch.
fn hatches_and_modes(extra: &[&str]) -> (Vec<Panel>, bool) {
    let svg = common::scratch("cli-recompute-svg").join("t.svg");
    let (code, out, err) = simulate(&[extra, &["--svg", svg.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let rows = v["results"].as_array().unwrap();
    let legend = std::fs::read_to_string(&svg)
        .unwrap()
        .contains("recomputed forward");
    let panels = hatched(&svg)
        .into_iter()
        .map(|(name, actions)| {
            let row = rows
                .iter()
                .find(|r| r["schedule"] == name.as_str())
                .unwrap();
            let modes = row["recompute"].as_array().unwrap();
            let full = (0..modes.len()).filter(|&s| modes[s] == "full").collect();
            (actions, full)
        })
        .collect();
    (panels, legend)
}

#[test]
fn simulate_svg_hatches_the_rebuilds_of_the_recomputing_stages_only() {
    // 1F1B under 350 bytes: only stage 0 recomputes; its eight B boxes, and nothing else, are
    // hatched.
    let (panels, legend) = hatches_and_modes(&["--recompute", "auto", "--memory-limit", "350"]);
    let mut got = panels[0].0.clone();
    got.sort();
    assert_eq!(got, (0..8).map(|k| format!("0B{k}")).collect::<Vec<_>>());
    assert_eq!(panels[0].1, vec![0]);
    assert!(legend);
    // Full recomputation: every stage's backward.
    let (panels, _) = hatches_and_modes(&["--recompute", "full"]);
    assert_eq!(panels[0].0.len(), 4 * 8);
    // Without recomputation: no hatch and no legend entry.
    let (panels, legend) = hatches_and_modes(&[]);
    assert!(panels[0].0.is_empty() && !legend);
    // Several schedules in one picture (the helper's 1F1B, GPipe, interleaved 1F1B at V = 2), each
    // recomputing its own stages: each panel hatches exactly its recomputing stages' I/B boxes,
    // M of them each.
    let (panels, _) = hatches_and_modes(&[
        "--schedule",
        "gpipe,interleaved-1f1b",
        "--recompute",
        "auto",
        "--memory-limit",
        "350",
    ]);
    assert_eq!(panels.len(), 3);
    for (actions, full) in &panels {
        let mut stages: Vec<usize> = actions
            .iter()
            .map(|a| a[..a.find(['B', 'I']).unwrap()].parse().unwrap())
            .collect();
        assert!(
            actions.iter().all(|a| a.contains(['B', 'I'])),
            "{actions:?}"
        );
        assert_eq!(stages.len(), 8 * full.len(), "{actions:?} {full:?}");
        stages.sort();
        stages.dedup();
        assert_eq!(&stages, full);
    }
    let counts: Vec<usize> = panels.iter().map(|p| p.1.len()).collect();
    assert!(counts.iter().any(|&c| c != counts[0]), "{counts:?}");
}
