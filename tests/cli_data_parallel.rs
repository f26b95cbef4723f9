//! `train --data-parallel D`: D pipeline replicas on the same global batch train like one replica
//! (losses within 1e-5 over several steps, for plain, split-backward and interleaved schedules),
//! and bad replica counts are refused at the edge.

mod common;

use common::{assert_refused, pipefill, scratch};

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
