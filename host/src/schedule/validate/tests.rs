use super::*;
use crate::schedule::{Action, Item, Op};

fn sched(ranks: usize, chunks: usize, m: usize, lists: &[&str]) -> Schedule {
    Schedule {
        name: "t".into(),
        ranks,
        chunks,
        microbatches: m,
        placement: Placement::Looped,
        actions: lists
            .iter()
            .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
            .collect(),
    }
}

#[test]
fn accepts_a_small_1f1b_and_counts_peaks() {
    let s = sched(2, 1, 2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
    let r = validate(&s).unwrap();
    assert_eq!(r.peak_in_flight, vec![2, 1]);
    // 1F1 waits for rank 1 to be free (slot 3) although 0F1 ended at slot 2.
    assert_eq!(r.slots, vec![vec![0, 1, 3, 5], vec![1, 2, 3, 4]]);
    assert_eq!(r.makespan_slots, 6);
}

#[test]
fn split_backward_peak_ends_at_w() {
    let s = sched(1, 1, 2, &["0F0 0I0 0F1 0W0 0I1 0W1"]);
    assert_eq!(validate(&s).unwrap().peak_in_flight, vec![2]);
}

#[test]
fn wrong_rank_names_rank_position_and_fix() {
    let s = sched(2, 1, 1, &["0F0 1B0 0B0", "1F0"]);
    let e = validate(&s).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            ScheduleError::BadAction {
                rank: 0,
                position: 1,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("rank 1"), "{msg}");
    assert!(msg.contains("[1B0]"), "{msg}");
}

#[test]
fn duplicate_and_order_errors() {
    let dup = sched(1, 1, 1, &["0F0 0F0 0B0"]);
    assert!(validate(&dup)
        .unwrap_err()
        .to_string()
        .contains("duplicate"));
    let order = sched(1, 1, 1, &["0B0 0F0"]);
    let e = validate(&order).unwrap_err();
    assert!(matches!(e, ScheduleError::BadAction { position: 0, .. }));
    let w_first = sched(1, 1, 1, &["0F0 0W0 0I0"]);
    assert!(validate(&w_first).unwrap_err().to_string().contains("0I0"));
    let mixed = sched(1, 1, 1, &["0F0 0B0 0W0"]);
    assert!(validate(&mixed)
        .unwrap_err()
        .to_string()
        .contains("either B or I and W"));
}

#[test]
fn incomplete_is_reported() {
    let missing_b = sched(2, 1, 2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1"]);
    let e = validate(&missing_b).unwrap_err();
    assert!(
        matches!(
            e,
            ScheduleError::Incomplete {
                stage: 1,
                microbatch: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("add `1B1`"), "{e}");
    let s = sched(1, 1, 2, &["0F0 0B0 0F1 0I1"]);
    let e = validate(&s).unwrap_err();
    assert!(
        matches!(
            e,
            ScheduleError::Incomplete {
                stage: 0,
                microbatch: 1,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn header_errors() {
    let mut s = sched(2, 1, 1, &["0F0 0B0", "1F0 1B0"]);
    s.ranks = 3;
    assert!(matches!(validate(&s), Err(ScheduleError::Invalid(_))));
    let mut big = sched(2, 1, 1, &["0F0 0B0", "1F0 1B0"]);
    big.microbatches = usize::MAX / 2;
    assert!(matches!(validate(&big), Err(ScheduleError::Invalid(_))));
}

#[test]
fn deadlock_names_the_waiting_ranks() {
    // Rank 0 waits for 1B1's gradient before forwarding microbatch 1; rank 1 waits for 0F1.
    let s = sched(2, 1, 2, &["0F0 0B1 0F1 0B0", "1F0 1F1 1B0 1B1"]);
    let e = validate(&s);
    // 0B1 before 0F1 is an order error, caught before the dry run.
    assert!(matches!(e, Err(ScheduleError::BadAction { .. })));
    let s = sched(2, 1, 2, &["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"]);
    match validate(&s) {
        Err(ScheduleError::Deadlock { waits, grid }) => {
            assert_eq!(waits.len(), 2, "{waits:?}");
            assert_eq!(waits[0].rank, 0);
            assert_eq!(waits[0].needs, Item::One(Action::new(Op::B, 1, 0)));
            assert_eq!(waits[0].needs_position, 2);
            assert_eq!(waits[1].rank, 1);
            assert_eq!(waits[1].needs, Item::One(Action::new(Op::F, 0, 1)));
            assert!(grid.contains("[0B0]") && grid.contains("[1F1]"), "{grid}");
        }
        other => panic!("expected a deadlock, got {other:?}"),
    }
}

#[test]
fn overlap_needs_both_halves_ready() {
    // Rank 1 overlaps 1F1 with 1B0; fine once 0F1 ran.
    let s = sched(
        2,
        1,
        2,
        &["0F0 0F1 0B0 0B1", "1F0 (1F1;1B0)OVERLAP_F_B 1B1"],
    );
    let r = validate(&s).unwrap();
    assert_eq!(r.peak_in_flight, vec![2, 2]);
    let same = sched(1, 1, 1, &["(0F0;0B0)OVERLAP_F_B"]);
    assert!(matches!(
        validate(&same),
        Err(ScheduleError::BadAction { .. })
    ));
}
