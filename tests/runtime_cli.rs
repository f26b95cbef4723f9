//! `pipefill train` end to end: JSON keys, the loss falling, files written, bad input refused with
//! exit code 2 naming the flag.

use std::path::Path;

mod common;

use common::scratch;

/// `pipefill train ARGS` in `dir`: exit code, stdout, stderr.
fn train(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["train"];
    all.extend_from_slice(args);
    common::pipefill_in(Some(dir), &all)
}

#[test]
fn json_has_the_documented_keys_and_the_loss_falls() {
    let dir = scratch("json");
    let out = train(
        &dir,
        &[
            "--format",
            "json",
            "--steps",
            "12",
            "--layers",
            "4",
            "--hidden",
            "32",
            "--batch",
            "64",
            "--lr",
            "0.01",
            "--trace",
            "trace.json",
        ],
    );
    let (code, stdout, err) = out;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    for key in [
        "schedule",
        "ranks",
        "chunks",
        "microbatches",
        "losses",
        "step_time_s",
        "bubble_measured",
        "bubble_predicted",
        "busy_s",
        "idle_s",
        "candidates",
        "bubble_measured_per_rank",
        "bubble_predicted_per_rank",
        "makespan_resimulated_s",
        "bubble_resimulated",
        "bubble_resimulated_per_rank",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    // The plan run is the fastest, or one within the near-tie window of it that the stated rule
    // chose, and the JSON says which (`near_tie`, null when the fastest won alone).
    let predicted = |c: &serde_json::Value| c["step_time_predicted_s"].as_f64().unwrap();
    let candidates = v["candidates"].as_array().unwrap();
    let fastest = candidates
        .iter()
        .map(predicted)
        .fold(f64::INFINITY, f64::min);
    let ran = candidates
        .iter()
        .find(|c| c["schedule"] == v["schedule"] && c["chunks"] == v["chunks"])
        .map(predicted)
        .unwrap();
    match &v["near_tie"] {
        serde_json::Value::Null => assert_eq!(ran, fastest),
        t => {
            let window = t["window"].as_f64().unwrap();
            assert!((0.02..=0.1).contains(&window), "{t}");
            assert!(t["candidates"].as_u64().unwrap() >= 2, "{t}");
            assert!(ran <= fastest * (1.0 + window), "{ran} vs {fastest}: {t}");
            assert!(t["rule"].as_str().unwrap().contains("then"), "{t}");
        }
    }
    let losses: Vec<f64> = serde_json::from_value(v["losses"].clone()).unwrap();
    assert_eq!(losses.len(), 12);
    assert!(losses[11] < losses[0], "loss must fall: {losses:?}");
    assert_eq!(v["ranks"], 2);
    assert_eq!(v["busy_s"].as_array().unwrap().len(), 2);
    for key in ["bubble_measured", "bubble_predicted", "bubble_resimulated"] {
        let b = v[key].as_f64().unwrap();
        assert!((0.0..1.0).contains(&b), "{key} = {b}");
    }
    assert_eq!(
        v["bubble_resimulated_per_rank"].as_array().unwrap().len(),
        2
    );
    // Each rank's measured makespan splits into compute, waiting and descheduled; the replay
    // without time-sharing is never longer than the measured timeline.
    let makespan = v["makespan_measured_s"].as_f64().unwrap();
    let per_rank = |key: &str| -> Vec<f64> { serde_json::from_value(v[key].clone()).unwrap() };
    let (c, w, d) = (
        per_rank("compute_s"),
        per_rank("waiting_s"),
        per_rank("descheduled_s"),
    );
    for r in 0..2 {
        let sum = c[r] + w[r] + d[r];
        assert!(
            (sum - makespan).abs() < 1e-4 * makespan.max(1e-3),
            "rank {r}: {sum} vs {makespan}"
        );
    }
    let free = v["makespan_without_time_sharing_s"].as_f64().unwrap();
    assert!(
        free > 0.0 && free <= makespan + 1e-9,
        "{free} vs {makespan}"
    );
    assert!(
        v["load"].is_null() || v["load"]["loaded"].is_boolean(),
        "{}",
        v["load"]
    );
    let svg = std::fs::read_to_string(dir.join("pipefill-timeline.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("measured") && svg.contains("predicted"));
    assert!(svg.contains("from the profile") && svg.contains("from this run"));
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap();
    assert!(!trace["traceEvents"].as_array().unwrap().is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_named_schedule_and_replay_run() {
    let dir = scratch("replay");
    let out = train(
        &dir,
        &[
            "--schedule",
            "dualpipev",
            "--ranks",
            "3",
            "--microbatches",
            "6",
            "--steps",
            "3",
            "--layers",
            "6",
            "--hidden",
            "16",
            "--batch",
            "24",
            "--replay",
            "--format",
            "json",
        ],
    );
    let (code, stdout, err) = out;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["schedule"], "dualpipev");
    assert_eq!(v["stages"], 6);
    assert_eq!(v["replay"], true);
    // With --replay the measured timeline is the one resimulated from the run's durations.
    assert_eq!(v["bubble_measured"], v["bubble_resimulated"]);
    assert_eq!(v["makespan_measured_s"], v["makespan_resimulated_s"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_exits_2_naming_the_flag() {
    let dir = scratch("bad");
    for (args, needle) in [
        (vec!["--microbatches", "7"], "--microbatches"),
        (vec!["--schedule", "nope"], "--schedule"),
        (vec!["--activation", "tanh"], "--activation"),
        (vec!["--layers", "1", "--ranks", "2"], "--layers"),
        (vec!["--lr=0"], "--lr"),
        (vec!["--model", "missing.toml"], "missing.toml"),
        (vec!["--steps", "0"], "--steps"),
        (
            vec!["--schedule-file", "absent.json"],
            "--schedule-file `absent.json`",
        ),
    ] {
        let (code, _, err) = train(&dir, &args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert!(
        !dir.join("pipefill-timeline.svg").exists(),
        "nothing written on refusal"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_schedule_file_is_trained_as_written() {
    let dir = scratch("file");
    // A schedule written by `pipefill schedule`, as a user would save or edit one.
    let out = common::pipefill_in(
        Some(&dir),
        &[
            "schedule",
            "--schedule",
            "zb-h1",
            "--ranks",
            "2",
            "--microbatches",
            "4",
            "--format",
            "json",
            "--out",
            "mine.json",
        ],
    );
    let (code, _, err) = out;
    assert_eq!(code, 0, "{err}");
    let args = [
        "--schedule-file",
        "mine.json",
        "--steps",
        "12",
        "--layers",
        "4",
        "--hidden",
        "16",
        "--batch",
        "32",
        "--format",
        "json",
    ];
    let out = train(&dir, &args);
    let (code, stdout, err) = out;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    // P, V, M come from the file; the name is the file's.
    assert_eq!(v["ranks"], 2);
    assert_eq!(v["chunks"], 1);
    assert_eq!(v["microbatches"], 4);
    assert_eq!(v["candidates"].as_array().unwrap().len(), 1);
    let losses: Vec<f64> = serde_json::from_value(v["losses"].clone()).unwrap();
    assert_eq!(losses.len(), 12);
    assert!(losses[11] < losses[0], "loss must fall: {losses:?}");

    // A file whose schedule cannot run, flags that the file already fixes, a model too small.
    std::fs::write(dir.join("deadlock.csv"), "0F0,0B0\n1B0,1F0\n").unwrap();
    for (extra, needle) in [
        (
            vec!["--schedule-file", "deadlock.csv"],
            "--schedule-file `deadlock.csv`",
        ),
        (
            vec!["--schedule-file", "mine.json", "--ranks", "3"],
            "--ranks",
        ),
        (
            vec!["--schedule-file", "mine.json", "--schedule", "1f1b"],
            "--schedule",
        ),
        (
            vec!["--schedule-file", "mine.json", "--layers", "1"],
            "stages",
        ),
        (
            vec!["--schedule-file", "mine.json", "--batch", "30"],
            "multiple of 4",
        ),
    ] {
        let (code, _, err) = train(&dir, &extra);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
