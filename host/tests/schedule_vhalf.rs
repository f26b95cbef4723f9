//! The controllable-memory V families (`v-half`, `v-min`): golden orders written from the slot
//! tables of their module docs, validation over a grid of P and M, refusals, and their peak
//! in-flight memory measured by the simulator against 1F1B's.

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{families, Item, Params, Placement, Schedule, ScheduleError};
use pipefill_host::sim::simulate;

fn gen(name: &str, ranks: usize, m: usize) -> Result<Schedule, ScheduleError> {
    families::generate(name, &Params::new(ranks, m))
}

fn assert_rank(s: &Schedule, r: usize, expected: &str) {
    let got: Vec<String> = s.actions[r].iter().map(Item::to_string).collect();
    let want: Vec<&str> = expected.split_whitespace().collect();
    assert_eq!(got, want, "{} rank {r}", s.name);
}

/// Peak activations per rank in rank-microbatches (a stage's microbatch counts 1/V), as the
/// simulator measures them with F = I = W = 1 per rank.
fn sim_peaks(s: &Schedule) -> Vec<f64> {
    let v = s.chunks as f64;
    let mut stage = StageCost::uniform(1.0 / v, 1.0 / v, 1.0 / v);
    stage.activation_bytes = 1.0 / v;
    let c = CostModel::uniform(stage, s.stages(), LinkCost::default());
    simulate(s, &c).unwrap().peak_activations
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// V-Min, P = 2, M = 2. The grid (period 6): rank 0 (stages 0 and 3) takes F0 at 0, F3 at 3, I3
/// at 4, I0 at 7; rank 1 (stages 1 and 2) F1 at 1, F2 at 2, I2 at 5, I1 at 6; free slots take the
/// oldest pending W. Rank 1 then holds up to 4 chunk-microbatches (slots 8 and 9), the cap of the
/// compaction, which moves, in slot order: 0F1 from 6 to 1 (no input), 1F1 from 7 to 3, 2F1 from
/// 8 to 4, 3F1 from 9 to 6, 2W0 from 9 to 7, 3I1 to 9, 1W0 to 8, 3W1 to 10, 2I1 to 10, 1I1 to 11,
/// 0I1 to 12, 2W1 to 12, 0W1 to 13, 1W1 to 13 (each to the first free slot after its inputs).
#[test]
fn v_min_golden_p2_m2() {
    let s = gen("v-min", 2, 2).unwrap();
    assert_eq!((s.ranks, s.chunks, s.placement), (2, 2, Placement::Vshape));
    assert_rank(&s, 0, "0F0 0F1 3F0 3I0 3W0 3F1 0I0 0W0 3I1 3W1 0I1 0W1");
    assert_rank(&s, 1, "1F0 2F0 1F1 2F1 2I0 1I0 2W0 1W0 2I1 1I1 2W1 1W1");
}

/// V-Half, P = 2 (d = 3), M = 1. Rank 0: F0 at 0, F3 at 4, I3 at 8, I0 at 13; rank 1: F1 at 2,
/// F2 at 3, I2 at 10, I1 at 12.
#[test]
fn v_half_golden_p2_m1() {
    let s = gen("v-half", 2, 1).unwrap();
    assert_rank(&s, 0, "0F0 3F0 3I0 3W0 0I0 0W0");
    assert_rank(&s, 1, "1F0 2F0 2I0 2W0 1I0 1W0");
}

#[test]
fn valid_over_a_grid() {
    for name in ["v-half", "v-min"] {
        for p in 1..=9 {
            for m in 1..=3 * p + 2 {
                let s = gen(name, p, m).unwrap();
                if let Err(e) = validate(&s) {
                    panic!("{name} P={p} M={m}: {e}");
                }
                assert_eq!(s.action_count(), 3 * 2 * p * m, "{name} P={p} M={m}");
            }
        }
    }
}

#[test]
fn refusals_name_the_family_and_the_fix() {
    for name in ["v-half", "v-min"] {
        let e = families::generate(name, &Params::new(4, 8).with_chunks(3)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(name) && text.contains("V = 2"), "{text}");
        assert!(gen(name, 0, 8).is_err());
        assert!(gen(name, 4, 0).is_err());
    }
}

/// The point of the families: peak in-flight activations, measured by the simulator, about a half
/// (`v-half`) and a third (`v-min`) of 1F1B's `P` once `M >= P` (the schedules' own grid adds at
/// most one rank-microbatch of rounding and W placement).
#[test]
fn peak_memory_against_1f1b() {
    for p in [4, 6, 8, 12, 16] {
        let m = 4 * p;
        let one = max(&sim_peaks(&gen("1f1b", p, m).unwrap()));
        assert_eq!(one, p as f64);
        let half = max(&sim_peaks(&gen("v-half", p, m).unwrap()));
        let min = max(&sim_peaks(&gen("v-min", p, m).unwrap()));
        let pf = p as f64;
        assert!(half <= (pf / 2.0).floor() + 1.0, "v-half P={p}: {half}");
        assert!(min <= (pf / 3.0).ceil() + 1.0, "v-min P={p}: {min}");
        assert!(min < half && half < one, "P={p}: {min} {half} {one}");
    }
    // At P = 16 the ratios are close to the names: 9/16 and 6/16.
    let half = max(&sim_peaks(&gen("v-half", 16, 64).unwrap()));
    let min = max(&sim_peaks(&gen("v-min", 16, 64).unwrap()));
    assert!(half / 16.0 <= 0.57 && min / 16.0 <= 0.38, "{half} {min}");
}

/// Less memory costs some bubble, but both stay faster than 1F1B with F = I = W.
#[test]
fn faster_than_1f1b_with_split_backward() {
    for p in [4, 8] {
        let m = 4 * p;
        let span = |name: &str| {
            let s = gen(name, p, m).unwrap();
            let v = s.chunks as f64;
            let c = CostModel::uniform(
                StageCost::uniform(1.0 / v, 1.0 / v, 1.0 / v),
                s.stages(),
                LinkCost::default(),
            );
            simulate(&s, &c).unwrap().timeline.makespan()
        };
        let one = span("1f1b");
        for name in ["v-half", "v-min"] {
            assert!(
                span(name) < one,
                "{name} P={p}: {} vs 1f1b {one}",
                span(name)
            );
        }
    }
}
