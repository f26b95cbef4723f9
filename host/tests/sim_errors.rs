//! The simulator refuses what cannot run, naming the rank, position and action.

mod sim_support;

use pipefill_host::schedule::{Item, Placement, Schedule};
use pipefill_host::sim::{simulate, SimError};
use sim_support::costs;

fn sched(ranks: usize, m: usize, lists: &[&[&str]]) -> Schedule {
    Schedule {
        name: "hand".into(),
        ranks,
        chunks: 1,
        microbatches: m,
        placement: Placement::Looped,
        actions: lists
            .iter()
            .map(|l| l.iter().map(|t| t.parse::<Item>().unwrap()).collect())
            .collect(),
    }
}

fn err(s: &Schedule) -> String {
    simulate(s, &costs(s.stages(), 1.0, 1.0, 1.0, 0.0))
        .unwrap_err()
        .to_string()
}

#[test]
fn deadlock_names_the_waiting_actions() {
    // A valid order first; then rank 0 asks for 0B1 before running 0F1, and rank 1 waits for 0F1.
    let s = sched(
        2,
        2,
        &[&["0F0", "0B0", "0F1", "0B1"], &["1F0", "1B0", "1F1", "1B1"]],
    );
    assert!(simulate(&s, &costs(2, 1.0, 1.0, 1.0, 0.0)).is_ok());
    let s = sched(
        2,
        2,
        &[&["0F0", "0B1", "0F1", "0B0"], &["1F0", "1F1", "1B0", "1B1"]],
    );
    let e = err(&s);
    assert!(e.contains("deadlocks"), "{e}");
    assert!(
        e.contains("rank 0 at position 1 runs `0B1` and waits for 0F1"),
        "{e}"
    );
    assert!(
        e.contains("rank 1 at position 1 runs `1F1` and waits for 0F1"),
        "{e}"
    );
    // An input nobody produces.
    let s = sched(2, 1, &[&["0F0"], &["1F0", "1B0", "1W0"]]);
    let e = err(&s);
    assert!(
        e.contains("rank 1, position 2, `1W0`: its backward already ran as a full B"),
        "{e}"
    );
    let s = sched(2, 1, &[&["0F0", "0B0"], &["1B0"]]);
    let e = err(&s);
    assert!(e.contains("waits for 1F0 (which rank 1 never runs)"), "{e}");
}

#[test]
fn bad_items_are_named() {
    for (lists, needle) in [
        (
            &[&["0F0"][..], &["0F0"]][..],
            "rank 1, position 0, `0F0`: stage 0 sits on rank 0",
        ),
        (&[&["5F0"][..], &[]], "stage 5 is out of range (0..2)"),
        (&[&["0F9"][..], &[]], "microbatch 9 is out of range (0..1)"),
        (
            &[&["0F0", "0F0"][..], &[]],
            "position 1, `0F0`: this action already ran",
        ),
        (
            &[&["0F0", "0B0", "0I0"][..], &["1F0", "1B0"]],
            "already ran (I or B)",
        ),
        (&[&["(0F0;0B0)OVERLAP_F_B"][..], &[]], "deadlocks"),
    ] {
        let s = sched(2, 1, lists);
        let e = err(&s);
        assert!(e.contains(needle), "wanted `{needle}` in `{e}`");
    }
}

#[test]
fn shape_and_cost_mismatches() {
    let s = sched(2, 1, &[&["0F0", "0B0"], &["1F0", "1B0"]]);
    let e = simulate(&s, &costs(3, 1.0, 1.0, 1.0, 0.0)).unwrap_err();
    assert!(
        matches!(
            e,
            SimError::Stages {
                costs: 3,
                stages: 2,
                ..
            }
        ),
        "{e}"
    );
    let mut c = costs(2, 1.0, 1.0, 1.0, 0.0);
    c.stages[1].backward = f64::NAN;
    let e = simulate(&s, &c).unwrap_err().to_string();
    assert!(e.contains("stages[1].backward") && e.contains("NaN"), "{e}");
    let mut bad = s.clone();
    bad.actions.pop();
    assert!(simulate(&bad, &costs(2, 1.0, 1.0, 1.0, 0.0))
        .unwrap_err()
        .to_string()
        .contains("action lists"));
}

#[test]
fn overlapped_pair_takes_the_longer_half_plus_a_share() {
    // One rank, two stages on it would need V = 2; use P = 1, V = 2 looped: stages 0 and 1 on rank 0.
    let mut s = sched(
        1,
        2,
        &[&[
            "0F0",
            "1F0",
            "1B0",
            "(0F1;0B0)OVERLAP_F_B",
            "1F1",
            "1B1",
            "0B1",
        ]],
    );
    s.chunks = 2;
    let mut c = costs(2, 1.0, 1.0, 2.0, 0.0);
    c.overlap_share = 0.5;
    let sim = simulate(&s, &c).unwrap();
    let pair = sim.timeline.spans[0][3];
    // F = 1, B = 3: max 3 + 0.5 * 1.
    assert_eq!(pair.end - pair.start, 3.5);
    assert!(sim.lower_bound <= sim.timeline.makespan());
}
