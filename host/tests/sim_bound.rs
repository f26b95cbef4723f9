//! The lower bound is a bound: on random small instances (random P, M, V, heterogeneous per-stage
//! costs, latency, bandwidth, overlap share) it never exceeds the simulated makespan of any family,
//! with or without the memory argument (the limit being the schedule's own simulated peak), and it
//! is never below the bound it replaced ([`basic_bound`]); the span bound never exceeds the longest
//! per-rank span. Plus closed forms where the new terms are strictly stronger.

mod prop_coverage;
mod sim_support;

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::{families, Params, Placement, Schedule};
use pipefill_host::sim::{
    basic_bound, bound_for, bound_with_limit, lower_bound, lower_bound_with_limit, simulate,
    span_bound, BoundError,
};
use proptest::prelude::*;
use sim_support::random::{case, Case};
use sim_support::{longest_span, peak_in_flight};

fn check(s: &Schedule, c: &Case) -> Result<(), TestCaseError> {
    let cost = c.costs_for(s);
    let sim = simulate(s, &cost).unwrap();
    let makespan = sim.timeline.makespan();
    let slack = |x: f64| x <= makespan * (1.0 + 1e-9) + 1e-9;
    let overlap = s.actions.iter().flatten().any(|i| i.actions().count() == 2);
    let basic = basic_bound(s.ranks, s.microbatches, s.placement, &cost, overlap);
    let bound = lower_bound(s, &cost);
    prop_assert_eq!(bound, sim.lower_bound);
    prop_assert!(
        bound >= basic,
        "{}: bound {bound} below the basic {basic}",
        s.name
    );
    prop_assert!(
        slack(bound),
        "{}: makespan {makespan} below the bound {bound}",
        s.name
    );
    let peak = peak_in_flight(s, &cost);
    let limited = lower_bound_with_limit(s, &cost, &peak).unwrap();
    prop_assert!(limited >= bound);
    prop_assert!(
        slack(limited),
        "{} P={} M={} V={}: makespan {makespan} below the memory bound {limited} (peaks {peak:?})",
        s.name,
        c.p,
        c.m,
        c.v
    );
    // The span bound (staircases and pairs of ranks included) under the same limits is never above
    // the schedule's longest per-rank span.
    let span = longest_span(&sim.timeline);
    let spanned = span_bound(
        s.ranks,
        s.microbatches,
        s.placement,
        &cost,
        overlap,
        Some(&peak),
    )
    .unwrap();
    prop_assert!(
        spanned <= span * (1.0 + 1e-9) + 1e-9,
        "{} P={} M={} V={}: longest span {span} below the span bound {spanned} (peaks {peak:?})",
        s.name,
        c.p,
        c.m,
        c.v
    );
    Ok(())
}

#[test]
fn bound_never_exceeds_any_family_and_never_weakens() {
    let tally = prop_coverage::run(file!(), 128, case(), |c, tally| {
        for fam in families::FAMILIES {
            let params = c.params();
            let Ok(s) = (fam.generate)(&params) else {
                continue;
            };
            check(&s, &c)?;
            tally.hit(fam.name);
        }
        Ok(())
    });
    for fam in families::FAMILIES {
        tally.assert_floor(fam.name, 32);
    }
}

fn uniform(f: f64, i: f64, w: f64, stages: usize) -> CostModel {
    CostModel::uniform(StageCost::uniform(f, i, w), stages, LinkCost::default())
}

#[test]
fn one_machine_relaxation_is_stronger_with_overlapped_pairs() {
    // DualPipeV, P = 4, M = 8, F = I = W = 1 (B = 2), perfect overlap: a forward inside a pair is
    // free, so the basic bound counts little work. The relaxation sees that rank P-1 (stages 3 and
    // 4) cannot start a backward before 2P + 3 = 11 (the forward chain to stage 7 and the backward
    // chain back to stage 4) and then has 2 * M * (I + W) = 32 of backward work: 43. The schedule
    // runs in 44.
    let s = families::generate("dualpipev", &Params::new(4, 8)).unwrap();
    let c = uniform(1.0, 1.0, 1.0, 8);
    let sim = simulate(&s, &c).unwrap();
    assert_eq!(basic_bound(4, 8, Placement::Vshape, &c, true), 35.0);
    assert_eq!(sim.lower_bound, 43.0);
    assert_eq!(sim.timeline.makespan(), 44.0);
}

#[test]
fn memory_limit_gives_the_serial_chain() {
    // 1F1B costs, P = 4, M = 8, at most one microbatch per rank: rank 0 runs the chain of one
    // microbatch (4 F, I on stages 3..1, I and W on stage 0: 9) eight times.
    let c = uniform(1.0, 1.0, 1.0, 4);
    let b = bound_with_limit(4, 8, Placement::Looped, &c, false, &[1.0; 4]).unwrap();
    assert_eq!(b, 72.0);
    // Two in flight on rank 0: a forward every 9 / 2, and the last one's tail; still above the
    // free bound of 27.
    let two = bound_with_limit(4, 8, Placement::Looped, &c, false, &[2.0; 4]).unwrap();
    assert!(two > bound_for(4, 8, Placement::Looped, &c, false));
    assert!(two < b);
    // 1F1B itself holds P - r microbatches on rank r: with that limit the bound stays at or under
    // its makespan, and it is above the free bound.
    let s = families::generate("1f1b", &Params::new(4, 8)).unwrap();
    let sim = simulate(&s, &c).unwrap();
    let own = lower_bound_with_limit(&s, &c, &[4.0, 3.0, 2.0, 1.0]).unwrap();
    assert!(own <= sim.timeline.makespan());
    // A limit that covers every microbatch changes nothing.
    let all = bound_with_limit(4, 8, Placement::Looped, &c, false, &[8.0; 4]).unwrap();
    assert_eq!(all, bound_for(4, 8, Placement::Looped, &c, false));
}

#[test]
fn limit_below_one_chunk_is_infinite() {
    let c = uniform(1.0, 1.0, 1.0, 8);
    // V = 2: a chunk's microbatch counts 1/2; 0.4 holds none.
    let b = bound_with_limit(4, 8, Placement::Vshape, &c, false, &[0.4; 4]).unwrap();
    assert_eq!(b, f64::INFINITY);
    // 0.5 holds one chunk's microbatch, but a microbatch at a rank's upper chunk still holds its
    // lower chunk's slot there (section 9): no schedule fits, so the bound is infinite too.
    let half = bound_with_limit(4, 8, Placement::Vshape, &c, false, &[0.5; 4]).unwrap();
    assert_eq!(half, f64::INFINITY);
    let one = bound_with_limit(4, 8, Placement::Vshape, &c, false, &[1.0; 4]).unwrap();
    assert!(one.is_finite());
}

#[test]
fn bad_limits_are_refused() {
    let c = uniform(1.0, 1.0, 1.0, 4);
    assert_eq!(
        bound_with_limit(4, 8, Placement::Looped, &c, false, &[1.0; 3]),
        Err(BoundError::Limits { ranks: 4, got: 3 })
    );
    let e = bound_with_limit(4, 8, Placement::Looped, &c, false, &[1.0, -1.0, 1.0, 1.0]);
    assert_eq!(
        e,
        Err(BoundError::Limit {
            rank: 1,
            value: -1.0
        })
    );
    let e = bound_with_limit(4, 8, Placement::Looped, &c, false, &[f64::NAN; 4]).unwrap_err();
    assert!(e.to_string().contains("rank 0"), "{e}");
}

/// A random valid schedule: actions are appended, one at a time, to their rank's list in a random
/// order that respects the dependencies (each appended action's inputs were appended before), so
/// every rank's list runs. Each `(stage, microbatch)` runs a full `B` or `I` then `W` at random.
/// `picks` drives every choice.
fn random_schedule(p: usize, v: usize, m: usize, vshape: bool, picks: &[u32]) -> Schedule {
    use pipefill_host::schedule::{Action, Item, Op, Placement};
    let placement = if vshape {
        Placement::Vshape
    } else {
        Placement::Looped
    };
    let stages = p * v;
    let mut pick = picks.iter().cycle().copied();
    let full: Vec<bool> = (0..stages * m)
        .map(|_| pick.next().unwrap_or(0) % 3 == 0)
        .collect();
    // Per (stage, microbatch): how far it got (0 nothing, 1 F, 2 I or B, 3 W).
    let mut done = vec![0u8; stages * m];
    let mut actions = vec![Vec::new(); p];
    loop {
        let mut ready = Vec::new();
        for s in 0..stages {
            for k in 0..m {
                let j = s * m + k;
                let next = match done[j] {
                    0 if s == 0 || done[(s - 1) * m + k] >= 1 => Op::F,
                    1 if s + 1 == stages || done[(s + 1) * m + k] >= 2 => {
                        if full[j] {
                            Op::B
                        } else {
                            Op::I
                        }
                    }
                    2 if !full[j] => Op::W,
                    _ => continue,
                };
                ready.push(Action::new(next, s, k));
            }
        }
        if ready.is_empty() {
            break;
        }
        let a = ready[pick.next().unwrap_or(0) as usize % ready.len()];
        let j = a.stage * m + a.microbatch;
        done[j] = match a.op {
            Op::F => 1,
            Op::I => 2,
            Op::B | Op::W => 3,
        };
        actions[placement.rank_of(a.stage, p)].push(Item::One(a));
    }
    Schedule {
        name: "random".into(),
        ranks: p,
        chunks: v,
        microbatches: m,
        placement,
        actions,
    }
}

#[test]
fn bound_holds_for_random_schedules() {
    let strategy = (
        case(),
        any::<bool>(),
        prop::collection::vec(any::<u32>(), 64..256),
    );
    let tally = prop_coverage::run(file!(), 128, strategy, |(c, vshape, picks), tally| {
        let (v, label) = if vshape {
            (2, "vshape")
        } else {
            (c.v, "looped")
        };
        let s = random_schedule(c.p, v, c.m, vshape, &picks);
        check(&s, &c)?;
        let cost = c.costs_for(&s);
        let shared = pipefill_host::sim::simulate_with(
            &s,
            &cost,
            pipefill_host::sim::SimOptions::ALL.on(pipefill_host::sim::DeviceSharing::Shared),
        )
        .unwrap();
        let m = shared.timeline.makespan();
        prop_assert!(
            shared.lower_bound <= m * (1.0 + 1e-9) + 1e-9,
            "shared {m} < {}",
            shared.lower_bound
        );
        tally.hit(label);
        Ok(())
    });
    tally.assert_floor("vshape", 4);
    tally.assert_floor("looped", 4);
}

/// Section 9 (a microbatch's two slots on one rank) raises the V-Half bound where transfers
/// stretch the climb: P = 4, M = 16, F:I:W 2:2:1 per rank, transfer 0.1 of F, at V-Half's limit
/// (P/2 microbatches in flight) the bound was 89.8 without it and is 95.8 with it, still below
/// V-Min's makespan (the one family that fits) and below the schedules `auto` finds (116.9). Rank
/// 0's term also bounds rank 0's span: the span bound rises from 85.6 to 95.8, below V-Min's
/// longest span.
#[test]
fn two_slots_of_one_microbatch_raise_the_v_half_bound() {
    let link = LinkCost {
        latency: 0.2,
        bandwidth: f64::INFINITY,
    };
    let c = CostModel::uniform(StageCost::uniform(2.0, 2.0, 1.0).split(2), 8, link);
    let bound = bound_with_limit(4, 16, Placement::Vshape, &c, false, &[2.0; 4]).unwrap();
    assert!(bound >= 95.8 - 1e-9, "{bound}");
    let v_min = families::generate("v-min", &Params::new(4, 16).with_chunks(2)).unwrap();
    let sim = simulate(&v_min, &c).unwrap();
    assert!(peak_in_flight(&v_min, &c).iter().all(|&p| p <= 2.0 + 1e-9));
    assert!(bound <= sim.timeline.makespan() + 1e-9);
    let span = span_bound(4, 16, Placement::Vshape, &c, false, Some(&[2.0; 4])).unwrap();
    assert!(span >= 95.8 - 1e-9, "{span}");
    let longest = longest_span(&sim.timeline);
    assert!(span <= longest + 1e-9, "{span} > {longest}");
}
