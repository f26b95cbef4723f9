//! `pipefill train --graph`: refused with exit 2 off the CUDA backend and with too few steps to
//! replay; on a GPU (or with `PIPEFILL_REQUIRE_GPU=1`) it trains and reports the host time per
//! action with and without the graph, in the text and the JSON output.

mod common;

use common::pipefill;
use pipefill::cuda::gpu_or_skip;

fn svg(tag: &str) -> String {
    let p = std::env::temp_dir().join(format!("pipefill-{tag}-{}.svg", std::process::id()));
    p.to_string_lossy().into_owned()
}

const SMALL: [&str; 10] = [
    "--layers",
    "4",
    "--hidden",
    "32",
    "--batch",
    "64",
    "--microbatches",
    "4",
    "--schedule",
    "1f1b",
];

#[test]
fn graph_on_the_cpu_backend_exits_2_naming_the_fix() {
    let svg = svg("graph-cpu");
    let mut a = vec!["train", "--backend", "cpu", "--graph", "--steps", "5"];
    a.extend(SMALL);
    a.extend(["--svg", &svg]);
    let (code, out, err) = pipefill(&a);
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains("--graph") && err.contains("--backend cuda"),
        "{err}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn graph_on_a_gpu_reports_host_time_per_action_with_and_without() {
    let Some(_gpu) = gpu_or_skip("graph_on_a_gpu_reports_host_time_per_action_with_and_without")
    else {
        return;
    };
    let svg = svg("graph-gpu");
    let mut a = vec!["train", "--backend", "cuda", "--graph", "--steps", "6"];
    a.extend(SMALL);
    a.extend(["--svg", &svg]);
    let (code, out, err) = pipefill(&a);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("without a graph") && out.contains("with the graph"),
        "{out}"
    );
    a.extend(["--format", "json"]);
    let (code, out, err) = pipefill(&a);
    assert_eq!(code, 0, "stderr: {err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    let h = &v["host_enqueue"];
    assert!(h["plain_per_action_s"].as_f64().is_some(), "{h}");
    assert!(h["graph_per_action_s"].as_f64().is_some(), "{h}");
    assert_eq!(h["graph_steps"], 3, "{h}");
    assert_eq!(h["captured_at_step"], 2, "{h}");
}

#[test]
fn graph_with_too_few_steps_is_refused() {
    // Refused on any machine: without CUDA the backend check fails first, also with exit 2.
    let svg = svg("graph-steps");
    let mut a = vec!["train", "--backend", "cuda", "--graph", "--steps", "3"];
    a.extend(SMALL);
    a.extend(["--svg", &svg]);
    let (code, _, err) = pipefill(&a);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--backend cuda") || err.contains("--steps"),
        "{err}"
    );
}
