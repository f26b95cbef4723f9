//! The zero-bubble and V-shape families (`zb-h1`, `zb-h2`, `interleaved-zb`, `zbv`, `dualpipev`):
//! golden orders against the published ones, validation over a grid, refusals, peak memory.

use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{families, Item, Params, Placement, Schedule, ScheduleError};

/// Generates `name` with `P`, `M` and optionally `V`.
fn gen(name: &str, ranks: usize, m: usize, v: Option<usize>) -> Result<Schedule, ScheduleError> {
    let mut p = Params::new(ranks, m);
    p.chunks = v;
    families::generate(name, &p)
}

/// Rank `r`'s list in text form.
fn rank_text(s: &Schedule, r: usize) -> Vec<String> {
    s.actions[r].iter().map(Item::to_string).collect()
}

/// Asserts rank `r` of `s` is exactly `expected` (actions separated by spaces).
fn assert_rank(s: &Schedule, r: usize, expected: &str) {
    let want: Vec<&str> = expected.split_whitespace().collect();
    assert_eq!(rank_text(s, r), want, "{} rank {r}", s.name);
}

/// Peak in-flight activations per rank, from the validator.
fn peaks(s: &Schedule) -> Vec<usize> {
    match validate(s) {
        Ok(report) => report.peak_in_flight,
        Err(e) => panic!(
            "{} P={} M={} V={} invalid: {e}",
            s.name, s.ranks, s.microbatches, s.chunks
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Golden orders, P = 4, M = 8. Each list is written out from the published rule, not from our output.
// ---------------------------------------------------------------------------------------------

/// ZB-H1 (paper section 2.1, figure 3 top): stage i repeats (F x, I x-(p-1-i), W x-(p-1)).
#[test]
fn zb_h1_golden_p4_m8() {
    let s = gen("zb-h1", 4, 8, None).unwrap();
    assert_eq!((s.ranks, s.chunks, s.microbatches), (4, 1, 8));
    assert_eq!(s.placement, Placement::Looped);
    // Rank 0: 3 lone F, steady (F, I, W) with I and W both 3 behind, then (I, W) pairs.
    assert_rank(&s, 0, "0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7");
    // Rank 1: 2 lone F, 1 pair (F, I), steady, 2 pairs (I, W), 1 lone W.
    assert_rank(&s, 1, "1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1F6 1I4 1W3 1F7 1I5 1W4 1I6 1W5 1I7 1W6 1W7");
    // Rank 2: 1 lone F, 2 pairs (F, I), steady, 1 pair (I, W), 2 lone W.
    assert_rank(&s, 2, "2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2F4 2I3 2W1 2F5 2I4 2W2 2F6 2I5 2W3 2F7 2I6 2W4 2I7 2W5 2W6 2W7");
    // Rank 3: 3 pairs (F, I), steady with W 3 behind, 3 lone W.
    assert_rank(&s, 3, "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 3W4 3W5 3W6 3W7");
}

/// ZB-H2 (paper section 2.2, figure 3 bottom): stage i repeats (F x, I x-2(p-1-i), W x-2(p-1)).
#[test]
fn zb_h2_golden_p4_m8() {
    let s = gen("zb-h2", 4, 8, None).unwrap();
    // Rank 0: 6 lone F (7 in flight before the first I), then (F, I, W), then (I, W).
    assert_rank(&s, 0, "0F0 0F1 0F2 0F3 0F4 0F5 0F6 0I0 0W0 0F7 0I1 0W1 0I2 0W2 0I3 0W3 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7");
    // Rank 1: 4 lone F, 2 pairs (F, I), steady, 4 pairs (I, W), 2 lone W.
    assert_rank(&s, 1, "1F0 1F1 1F2 1F3 1F4 1I0 1F5 1I1 1F6 1I2 1W0 1F7 1I3 1W1 1I4 1W2 1I5 1W3 1I6 1W4 1I7 1W5 1W6 1W7");
    // Rank 3: 6 pairs (F, I), steady with W 6 behind, then the 6 deferred W (the parallelogram tail).
    assert_rank(&s, 3, "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3F4 3I4 3F5 3I5 3F6 3I6 3W0 3F7 3I7 3W1 3W2 3W3 3W4 3W5 3W6 3W7");
}

/// PyTorch `ScheduleInterleavedZeroBubble` for P = 4, M = 8, V = 2: two rounds of 4, warm-up
/// (V-1)*4 + (P-1-r), W of rank r lagging its I by r.
#[test]
fn interleaved_zb_golden_p4_m8_v2() {
    let s = gen("interleaved-zb", 4, 8, Some(2)).unwrap();
    assert_eq!((s.chunks, s.placement), (2, Placement::Looped));
    assert_rank(&s, 0, "0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 4I0 4W0 0F4 4I1 4W1 0F5 4I2 4W2 0F6 4I3 4W3 0F7 0I0 0W0 4F4 0I1 0W1 4F5 0I2 0W2 4F6 0I3 0W3 4F7 4I4 4W4 4I5 4W5 4I6 4W6 4I7 4W7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7");
    assert_rank(&s, 3, "3F0 3F1 3F2 3F3 7F0 7I0 7F1 7I1 7F2 7I2 7F3 7I3 7W0 3F4 3I0 7W1 3F5 3I1 7W2 3F6 3I2 7W3 3F7 3I3 3W0 7F4 7I4 3W1 7F5 7I5 3W2 7F6 7I6 3W3 7F7 7I7 7W4 3I4 7W5 3I5 7W6 3I6 7W7 3I7 3W4 3W5 3W6 3W7");
}

/// PyTorch `ScheduleZBVZeroBubble` for P = 4, M = 8: rank 0 holds stages 0 and 7, rank 3 stages 3, 4.
#[test]
fn zbv_golden_p4_m8() {
    let s = gen("zbv", 4, 8, None).unwrap();
    assert_eq!((s.chunks, s.placement), (2, Placement::Vshape));
    assert_rank(&s, 0, "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 7I3 7W3 0F7 0I0 0W0 7F4 7I4 7W4 0I1 0W1 7F5 7I5 7W5 0I2 0W2 7F6 7I6 7W6 0I3 0W3 7F7 7I7 7W7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7");
    assert_rank(&s, 3, "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 4I0 4W0 3F4 3I0 3W0 4F4 4I1 4W1 3F5 3I1 3W1 4F5 4I2 4W2 3F6 3I2 3W2 4F6 4I3 4W3 3F7 3I3 3W3 4F7 4I4 4W4 3I4 4I5 3I5 4I6 3I6 4I7 3I7 3W4 4W5 4W6 4W7 3W5 3W6 3W7");
}

/// DeepSeek `dualpipev.py` / PyTorch `ScheduleDualPipeV` for P = 4, M = 8.
#[test]
fn dualpipev_golden_p4_m8() {
    let s = gen("dualpipev", 4, 8, None).unwrap();
    assert_eq!((s.chunks, s.placement), (2, Placement::Vshape));
    assert_rank(&s, 0, "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 \
        (0F7;7B3)OVERLAP_F_B (7F4;0B0)OVERLAP_F_B 7B4 (7F5;0B1)OVERLAP_F_B 7B5 (7F6;0B2)OVERLAP_F_B \
        7B6 (7F7;0B3)OVERLAP_F_B 7B7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7");
    // The last rank: its first forward/backward pair is not overlapped; odd rank, so the switch to
    // I/W happens before chunk 1's backward in the middle of the B1-B0 phase.
    assert_rank(
        &s,
        3,
        "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 (4F4;3B0)OVERLAP_F_B \
        (3F5;4B1)OVERLAP_F_B (4F5;3B1)OVERLAP_F_B (3F6;4B2)OVERLAP_F_B (4F6;3B2)OVERLAP_F_B \
        (3F7;4B3)OVERLAP_F_B (4F7;3B3)OVERLAP_F_B 4B4 3B4 4B5 3B5 4I6 3I6 4I7 3I7 4W6 3W6 4W7 3W7",
    );
}

// ---------------------------------------------------------------------------------------------
// Every P in 1..=16, M in 1..=64, V in 1..=4: a schedule that validates, or a typed refusal.
// ---------------------------------------------------------------------------------------------

/// What each of our families must accept (`v == None`: the family default); the rest is refused.
fn accepted(name: &str, ranks: usize, m: usize, v: Option<usize>) -> bool {
    match name {
        "zb-h1" | "zb-h2" => v.is_none_or(|v| v == 1),
        "zbv" => v.is_none_or(|v| v == 2),
        "dualpipev" => v.is_none_or(|v| v == 2) && m >= 2 * ranks,
        "dualpipev-slack" => v.is_none_or(|v| v == 2),
        "interleaved-zb" => {
            let rounds = (m / ranks).max(1);
            v.is_none_or(|v| v >= 2) && m % rounds == 0
        }
        _ => unreachable!("not one of ours: {name}"),
    }
}

/// Runs `check` on every schedule of the grid, after checking it is accepted or refused as it
/// should be. Returns how many schedules were generated.
fn over_grid(name: &str, mut check: impl FnMut(&Schedule, Vec<usize>)) -> usize {
    let mut made = 0;
    for ranks in 1..=16 {
        for m in 1..=64 {
            for v in [None, Some(1), Some(2), Some(3), Some(4)] {
                match gen(name, ranks, m, v) {
                    Ok(s) => {
                        assert!(
                            accepted(name, ranks, m, v),
                            "{name} P={ranks} M={m} V={v:?} should be refused"
                        );
                        assert_eq!(
                            (s.ranks, s.microbatches, s.actions.len()),
                            (ranks, m, ranks)
                        );
                        let p = peaks(&s);
                        check(&s, p);
                        made += 1;
                    }
                    Err(ScheduleError::Refused { family, reason }) => {
                        assert_eq!(family, name);
                        assert!(
                            !accepted(name, ranks, m, v),
                            "{name} P={ranks} M={m} V={v:?} refused: {reason}"
                        );
                    }
                    Err(e) => panic!("{name} P={ranks} M={m} V={v:?}: not a refusal: {e}"),
                }
            }
        }
    }
    made
}

/// ZB-H1: the paper's claim is 1F1B's peak memory, i.e. 1F1B's first rank, `min(M, P)`. The published
/// order holds exactly that many on every rank (see `zb_h1.rs`), so a rank `r > 0` holds more than
/// 1F1B's `min(M, P - r)`: the bound holds for the peak over ranks, not rank by rank.
#[test]
fn zb_h1_grid_and_peak() {
    let made = over_grid("zb-h1", |s, peak| {
        let one_f_one_b_peak = s.microbatches.min(s.ranks); // 1F1B's rank 0, its largest
        assert_eq!(
            peak,
            vec![one_f_one_b_peak; s.ranks],
            "P={} M={}",
            s.ranks,
            s.microbatches
        );
    });
    assert_eq!(made, 16 * 64 * 2);
}

/// ZB-H2: at most `2P - 1` in flight on every rank, reached on rank 0 when `M >= 2P - 1`.
#[test]
fn zb_h2_grid_and_peak() {
    over_grid("zb-h2", |s, peak| {
        let bound = s.microbatches.min(2 * s.ranks - 1);
        assert_eq!(peak[0], bound);
        assert!(peak.iter().all(|&p| p <= bound), "{peak:?}");
    });
}

/// ZB-V: at most `min(M, P)` in full-stage units (two V-shape stages make one 1F1B stage) on every
/// rank: 1F1B's peak.
#[test]
fn zbv_grid_and_peak() {
    over_grid("zbv", |s, peak| {
        let full = s.microbatches.min(s.ranks);
        assert!(
            peak.iter().all(|&p| p.div_ceil(2) <= full),
            "P={} M={} {peak:?}",
            s.ranks,
            s.microbatches
        );
    });
}

/// Interleaved zero-bubble: every rank holds the interleaved warm-up `(V-1) * per_round + P - r - 1`,
/// one more forward, and the `r` deferred `W`s: `(V-1) * per_round + P`, capped by `V * M`.
#[test]
fn interleaved_zb_grid_and_peak() {
    let made = over_grid("interleaved-zb", |s, peak| {
        let (ranks, m, v) = (s.ranks, s.microbatches, s.chunks);
        let per_round = m / (m / ranks).max(1);
        let want = ((v - 1) * per_round + ranks).min(v * m);
        assert!(
            peak.iter().all(|&p| p == want),
            "P={ranks} M={m} V={v} {peak:?} want {want}"
        );
    });
    assert!(made > 0);
}

/// How many overlapped pairs `s` holds.
fn overlaps(s: &Schedule) -> usize {
    s.actions
        .iter()
        .flatten()
        .filter(|i| matches!(i, Item::Overlap { .. }))
        .count()
}

/// DualPipeV: `2P + 1` stage-microbatches in flight on every rank (one more than ZB-V's `2P`: each
/// rank runs one more forward before the backward that would free a slot); `M < 2P` refused.
#[test]
fn dualpipev_grid_and_peak() {
    over_grid("dualpipev", |s, peak| {
        assert_eq!(peak, vec![2 * s.ranks + 1; s.ranks]);
        let overlaps = overlaps(s);
        assert!(
            overlaps > 0 || s.microbatches < 2,
            "no overlapped pair at all"
        );
    });
}

/// DualPipeV with slack: at most `4P - 1` stage-microbatches in flight on every rank (each flow
/// one microbatch ahead on the rank it comes from), and never more than both stages' `2M`; all of
/// them from `M = 4P` on; overlapped pairs from `M = 2P` on.
#[test]
fn dualpipev_slack_grid_and_peak() {
    let made = over_grid("dualpipev-slack", |s, peak| {
        let most = (4 * s.ranks - 1).min(2 * s.microbatches);
        assert!(
            peak.iter().all(|&p| p <= most),
            "P={} M={} {peak:?}",
            s.ranks,
            s.microbatches
        );
        if s.microbatches >= 4 * s.ranks {
            assert_eq!(peak, vec![4 * s.ranks - 1; s.ranks]);
        }
        let overlaps = overlaps(s);
        assert!(
            overlaps > 0 || s.microbatches < 2 * s.ranks,
            "no overlapped pair at all"
        );
    });
    assert_eq!(made, 16 * 64 * 2);
}

// ---------------------------------------------------------------------------------------------
// Refusals name the failed constraint and what would work.
// ---------------------------------------------------------------------------------------------

/// The refusal text of `name` with these parameters.
fn refusal(name: &str, p: &Params) -> String {
    match families::generate(name, p) {
        Err(e @ ScheduleError::Refused { .. }) => e.to_string(),
        other => panic!("{name} {p:?}: expected a refusal, got {other:?}"),
    }
}

#[test]
fn refusals_name_the_constraint_and_the_fix() {
    for name in [
        "zb-h1",
        "zb-h2",
        "interleaved-zb",
        "zbv",
        "dualpipev",
        "dualpipev-slack",
    ] {
        let e = refusal(name, &Params::new(0, 8));
        assert!(e.contains("ranks (P) must be at least 1"), "{e}");
        let e = refusal(name, &Params::new(4, 0));
        assert!(e.contains("microbatches (M) must be at least 1"), "{e}");
    }
    let e = refusal("zb-h1", &Params::new(4, 8).with_chunks(2));
    assert!(e.contains("use V = 1"), "{e}");
    let e = refusal("zbv", &Params::new(4, 8).with_chunks(3));
    assert!(e.contains("use V = 2"), "{e}");
    let e = refusal("dualpipev", &Params::new(4, 7));
    assert!(
        e.contains("M >= 2P = 8") && e.contains("use M >= 8") && e.contains("P <= 3"),
        "{e}"
    );
    let e = refusal("interleaved-zb", &Params::new(4, 8).with_chunks(1));
    assert!(e.contains("use V >= 2") && e.contains("zb-h1"), "{e}");
    // P = 4, M = 9: two rounds, 9 is odd; 8 and 10 split into two equal rounds.
    let e = refusal("interleaved-zb", &Params::new(4, 9));
    assert!(e.contains("use M = 8 or M = 10"), "{e}");
    let e = refusal("interleaved-zb", &Params::new(4, 8).with_group_size(3));
    assert!(e.contains("group size >= 4"), "{e}");
}

/// Group sizes of at least `P` give rounds of that many microbatches (here 2 rounds of 6).
#[test]
fn interleaved_zb_takes_group_sizes_of_at_least_p() {
    for g in 4..=13 {
        for m in [6, 12, 13, 24] {
            match families::generate("interleaved-zb", &Params::new(4, m).with_group_size(g)) {
                Ok(s) => {
                    peaks(&s);
                }
                Err(ScheduleError::Refused { reason, .. }) => {
                    let rounds = (m / g).max(1);
                    assert!(m % rounds != 0, "g={g} M={m}: {reason}");
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}
