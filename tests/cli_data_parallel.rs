//! `train --data-parallel D`: D pipeline replicas on the same global batch train like one replica
//! (losses within 1e-5 over several steps, for plain, split-backward and interleaved schedules),
//! and bad replica counts are refused at the edge.

mod common;

use common::{assert_refused, pipefill, scratch, small_train, SMALL_TRAIN};

/// The per-step losses of a JSON `train` run.
fn losses(schedule: &str, ranks: &str, d: &str) -> Vec<f64> {
    let dir = scratch(&format!("dp-{schedule}-{d}"));
    let svg = dir.join("t.svg");
    let args = [
        "train",
        "--ranks",
        ranks,
        "--microbatches",
        "4",
        "--data-parallel",
        d,
        "--steps",
        "4",
        "--schedule",
        schedule,
        "--plan",
        "uniform",
        "--format",
        "json",
        "--optimizer",
        "sgd",
        "--lr",
        "0.05",
        "--svg",
        svg.to_str().unwrap(),
    ];
    let (code, out, err) = pipefill(&args);
    assert_eq!(code, 0, "{schedule} D={d}: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn two_replicas_train_like_one_on_the_same_global_batch() {
    for (schedule, ranks) in [("1f1b", "2"), ("zb-h1", "2"), ("interleaved-1f1b", "2")] {
        let one = losses(schedule, ranks, "1");
        let two = losses(schedule, ranks, "2");
        assert_eq!(one.len(), 4);
        // The losses move: the test would notice replicas that do not learn together.
        assert!((one[0] - one[3]).abs() > 1e-4, "{schedule}: {one:?}");
        for (step, (a, b)) in one.iter().zip(&two).enumerate() {
            assert!((a - b).abs() <= 1e-5, "{schedule} step {step}: {a} vs {b}");
        }
    }
}

#[test]
fn bad_replica_counts_are_refused() {
    assert_refused([
        (
            vec!["train", "--data-parallel", "0", "--steps", "1"],
            "--data-parallel 0",
        ),
        (
            vec![
                "train",
                "--data-parallel",
                "3",
                "--microbatches",
                "4",
                "--batch",
                "32",
                "--steps",
                "1",
            ],
            "--data-parallel 3",
        ),
    ]);
}

#[test]
fn plan_searches_the_split_of_workers_and_refuses_bad_replica_counts() {
    let dir = scratch("dp-plan");
    let costs = dir.join("c.json");
    let c = costs.to_str().unwrap();
    let (code, _, err) = pipefill(&[
        "profile",
        "--layers",
        "8",
        "--hidden",
        "32",
        "--batch",
        "64",
        "--microbatches",
        "4",
        "--out",
        c,
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = pipefill(&[
        "plan",
        "--costs",
        c,
        "--workers",
        "4",
        "--global-batch",
        "64",
        "--families",
        "1f1b",
        "--dp-bandwidth",
        "1e6",
        "--format",
        "json",
        "--top",
        "100",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let plans = v["plans"].as_array().unwrap();
    let splits = common::splits(plans);
    assert_eq!(splits, vec![(1, 4), (2, 2), (4, 1)]);
    // At 1 MB/s the all-reduces outlast the cool-down: data-parallel plans carry a tail.
    for p in plans {
        let tail = p["reduce_tail"].as_f64().unwrap();
        if p["data_parallel"].as_u64() == Some(1) {
            assert_eq!(tail, 0.0);
        } else {
            assert!(tail > 0.0, "{p}");
        }
    }
    assert_refused([
        (
            vec![
                "plan",
                "--costs",
                c,
                "--ranks",
                "2",
                "--data-parallel",
                "3",
                "--global-batch",
                "64",
            ],
            "--data-parallel",
        ),
        (
            vec![
                "plan",
                "--costs",
                c,
                "--workers",
                "0",
                "--global-batch",
                "64",
            ],
            "--workers",
        ),
        (
            vec![
                "plan",
                "--costs",
                c,
                "--ranks",
                "2",
                "--workers",
                "4",
                "--global-batch",
                "64",
            ],
            "--workers",
        ),
    ]);
}

#[test]
fn the_report_gives_each_replicas_share_of_the_batch() {
    let extra = ["--steps", "1", "--data-parallel", "2"];
    // SMALL_TRAIN without its closing `--format json`: the text report.
    let text = [&SMALL_TRAIN[..SMALL_TRAIN.len() - 2], &extra[..]].concat();
    let (code, out, err) = pipefill(&text);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("batch 32 over 2 replicas: 16 each in 4 microbatches of 4"),
        "{out}"
    );
    let (code, out, err) = pipefill(&small_train(&extra));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["data_parallel"].as_u64(), v["microbatch_size"].as_u64()),
        (Some(2), Some(4))
    );
}
