//! The simulator refuses what cannot run with the validator's own error: `simulate` accepts exactly
//! what `validate` accepts.

mod sim_support;

use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{Item, Placement, Schedule, ScheduleError};
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

/// The simulator refuses a schedule with exactly the validator's error.
fn same_refusal(s: &Schedule) -> ScheduleError {
    let v = validate(s).expect_err("the validator accepts it");
    match simulate(s, &costs(s.stages(), 1.0, 1.0, 1.0, 0.0)) {
        Err(SimError::Schedule(e)) => assert_eq!(e, v, "simulate and validate disagree"),
        other => panic!("simulate gave {other:?}, validate gave {v}"),
    }
    v
}

#[test]
fn deadlock_names_the_waiting_actions() {
    // A valid order first; then rank 1 runs 1F1 before 1F0 while rank 0 waits for 1B0's gradient.
    let s = sched(
        2,
        2,
        &[&["0F0", "0B0", "0F1", "0B1"], &["1F0", "1B0", "1F1", "1B1"]],
    );
    assert!(simulate(&s, &costs(2, 1.0, 1.0, 1.0, 0.0)).is_ok());
    let s = sched(
        2,
        2,
        &[&["0F0", "0B0", "0F1", "0B1"], &["1F1", "1F0", "1B0", "1B1"]],
    );
    match same_refusal(&s) {
        ScheduleError::Deadlock { waits, .. } => {
            assert_eq!(waits.len(), 2, "{waits:?}");
            assert_eq!(
                waits[0].to_string(),
                "rank 0 at position 1 (`0B0`) waits for `1B0` (rank 1, position 2)"
            );
            assert_eq!(
                waits[1].to_string(),
                "rank 1 at position 0 (`1F1`) waits for `0F1` (rank 0, position 2)"
            );
        }
        other => panic!("expected a deadlock, got {other}"),
    }
    // An input nobody produces is a missing action, named before any run.
    let s = sched(2, 1, &[&["0F0", "0B0"], &["1B0"]]);
    assert!(matches!(
        same_refusal(&s),
        ScheduleError::BadAction {
            rank: 1,
            position: 0,
            ..
        }
    ));
}

#[test]
fn bad_items_are_named_by_both() {
    for (lists, needle) in [
        (&[&["0F0"][..], &["0F0"]][..], "stage 0 belongs on rank 0"),
        (&[&["5F0"][..], &["1F0"]], "stage 5 is out of range"),
        (&[&["0F9"][..], &["1F0"]], "microbatch 9 is out of range"),
        (&[&["0F0", "0F0"][..], &["1F0"]], "duplicate"),
        (
            &[&["0F0", "0B0", "0I0"][..], &["1F0", "1B0"]],
            "either B or I and W",
        ),
        (
            &[&["(0F0;0B0)OVERLAP_F_B"][..], &[]],
            "same (stage, microbatch)",
        ),
        (&[&["0F0", "0B0"][..], &["1F0"]], "no backward; add `1B0`"),
    ] {
        let s = sched(2, 1, lists);
        let e = same_refusal(&s).to_string();
        assert!(e.contains(needle), "wanted `{needle}` in `{e}`");
    }
}

#[test]
fn transfers_are_checked_by_both() {
    let ok: &[&[&str]] = &[
        &["0F0", "0SEND_F0", "0RECV_B0", "0B0"],
        &["1RECV_F0", "1F0", "1B0", "1SEND_B0"],
    ];
    let s = sched(2, 1, ok);
    validate(&s).unwrap();
    let sim = simulate(&s, &costs(2, 1.0, 1.0, 1.0, 0.5)).unwrap();
    // F, transfer, F, B(2), transfer, B(2).
    assert_eq!(sim.timeline.makespan(), 7.0);
    for (lists, needle) in [
        // A receive after its consumer.
        (
            &[
                &["0F0", "0SEND_F0", "0RECV_B0", "0B0"][..],
                &["1F0", "1RECV_F0", "1B0", "1SEND_B0"],
            ][..],
            "add `1RECV_F0` before `1F0`",
        ),
        // A send before its producer.
        (
            &[
                &["0SEND_F0", "0F0", "0RECV_B0", "0B0"][..],
                &["1RECV_F0", "1F0", "1B0", "1SEND_B0"],
            ],
            "sends before `0F0`",
        ),
        // A send without its receive.
        (
            &[
                &["0F0", "0SEND_F0", "0RECV_B0", "0B0"][..],
                &["1F0", "1B0", "1SEND_B0"],
            ],
            "add `1RECV_F0` before `1F0`",
        ),
        (
            &[
                &["0F0", "0SEND_F0", "0B0"][..],
                &["1RECV_F0", "1F0", "1B0", "1SEND_B0"],
            ],
            "add `0RECV_B0` before `0B0`",
        ),
        // A compute waiting for data whose send comes after something waiting on it (a receive
        // posted early does not wait: see `pytorch_comms_files_take_what_their_compute_order_takes`).
        (
            &[
                &["0F0", "0RECV_B0", "0B0", "0SEND_F0"][..],
                &["1RECV_F0", "1F0", "1B0", "1SEND_B0"],
            ],
            "deadlock",
        ),
        // A transfer on a boundary that does not exist.
        (
            &[
                &["0F0", "0SEND_F0", "0RECV_B0", "0B0", "0SEND_B0"][..],
                &["1RECV_F0", "1F0", "1B0", "1SEND_B0"],
            ],
            "names no boundary",
        ),
    ] {
        let s = sched(2, 1, lists);
        let e = same_refusal(&s).to_string();
        assert!(e.contains(needle), "wanted `{needle}` in `{e}`");
    }
}

#[test]
fn parameter_operations_are_checked_by_both() {
    let s = sched(
        2,
        1,
        &[
            &["0UNSHARD", "0F0", "0B0", "0REDUCE_GRAD", "0RESHARD"],
            &["1F0", "1B0", "1REDUCE_GRAD"],
        ],
    );
    validate(&s).unwrap();
    assert_eq!(
        simulate(&s, &costs(2, 1.0, 1.0, 1.0, 0.0))
            .unwrap()
            .timeline
            .makespan(),
        6.0
    );
    for (lists, needle) in [
        (
            &[&["0F0", "0REDUCE_GRAD", "0B0"][..], &["1F0", "1B0"]][..],
            "after 0 of its 1 weight backwards",
        ),
        (
            &[&["0UNSHARD", "0F0", "0RESHARD", "0B0"][..], &["1F0", "1B0"]],
            "computes while sharded",
        ),
        (
            &[&["0RESHARD", "0F0", "0B0"][..], &["1F0", "1B0"]],
            "is not unsharded",
        ),
        (
            &[&["0F0", "0B0"][..], &["1F0", "1B0", "0REDUCE_GRAD"]],
            "stage 0 belongs on rank 0",
        ),
    ] {
        let s = sched(2, 1, lists);
        let e = same_refusal(&s).to_string();
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
    assert!(same_refusal(&bad).to_string().contains("rank lists"));
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
