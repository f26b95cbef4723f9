//! The shared-device mode (`DeviceSharing::Shared`): share 1 is the serial sum of all actions, share 0 and
//! one rank are the per-rank simulation, a closed form on a tiny case, and on random instances it is
//! never faster than the per-rank mode nor than its own bound.

mod prop_coverage;

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_host::sim::{
    simulate, simulate_with, DeviceSharing, SimError, SimOptions, Simulation,
};
use proptest::prelude::*;

fn shared(s: &Schedule, c: &CostModel) -> Simulation {
    simulate_with(s, c, SimOptions::ALL.on(DeviceSharing::Shared)).unwrap()
}

fn uniform(f: f64, i: f64, w: f64, stages: usize, share: f64) -> CostModel {
    let mut c = CostModel::uniform(StageCost::uniform(f, i, w), stages, LinkCost::default());
    c.overlap_share = share;
    c
}

/// Every family at P = 4, M = 8 (V = 2 where it has chunks).
fn all_families() -> Vec<Schedule> {
    families::FAMILIES
        .iter()
        .filter_map(|f| (f.generate)(&Params::new(4, 8)).ok())
        .collect()
}

/// Sum of every item's time alone on the device.
fn serial_sum(sim: &Simulation, c: &CostModel) -> f64 {
    sim.timeline
        .spans
        .iter()
        .flatten()
        .map(|sp| {
            let acts: Vec<_> = sp.item().actions().collect();
            match acts.as_slice() {
                [a] => c.stages[a.stage].time(a.op),
                [f, b] => c.pair_time(c.stages[f.stage].forward, c.stages[b.stage].time(b.op)),
                _ => 0.0,
            }
        })
        .sum()
}

#[test]
fn share_one_is_the_serial_sum() {
    // With free transfers the device is never idle while work is left, and at share 1 it runs one
    // unit of work per unit of time: every family takes the sum of all its actions.
    for s in all_families() {
        let v = s.chunks as f64;
        let c = uniform(1.0 / v, 1.5 / v, 0.5 / v, s.stages(), 1.0);
        let sim = shared(&s, &c);
        let sum = serial_sum(&sim, &c);
        assert!(
            (sim.timeline.makespan() - sum).abs() < 1e-9 * sum,
            "{}: {} vs serial {sum}",
            s.name,
            sim.timeline.makespan()
        );
        assert!((sim.lower_bound - sum).abs() < 1e-9 * sum, "{}", s.name);
    }
}

#[test]
fn share_zero_is_the_per_rank_simulation() {
    for s in all_families() {
        let v = s.chunks as f64;
        let mut c = uniform(1.0 / v, 1.5 / v, 0.5 / v, s.stages(), 0.0);
        c.link.latency = 0.1;
        let a = shared(&s, &c);
        let b = simulate(&s, &c).unwrap();
        assert_eq!(a.timeline.spans, b.timeline.spans, "{}", s.name);
        assert_eq!(a.timeline.transfers.len(), b.timeline.transfers.len());
        assert_eq!(a.peak_activations, b.peak_activations);
    }
}

#[test]
fn one_rank_is_the_per_rank_simulation_at_any_share() {
    for name in ["1f1b", "zb-h1", "zbv", "dualpipev", "v-half"] {
        let s = families::generate(name, &Params::new(1, 5)).unwrap();
        let c = uniform(1.0, 2.0, 0.5, s.stages(), 0.7);
        assert_eq!(
            shared(&s, &c).timeline.spans,
            simulate(&s, &c).unwrap().timeline.spans,
            "{name}"
        );
    }
}

#[test]
fn closed_form_1f1b_p2_m2() {
    // F = 1, B = 2, share 1/2. Rank 0: 0F0 0F1 0B0 0B1; rank 1: 1F0 1B0 1F1 1B1.
    // 0F0 alone 0..1; 0F1 and 1F0 together from 1: 1.5 each, to 2.5; 1B0 alone to 4.5; 0B0 and
    // 1F1 together: 1F1 ends at 4.5 + 1.5 = 6 with half of 0B0 done; 0B0 and 1B1 together:
    // 0B0's last unit takes 1.5, to 7.5; 1B1's last unit alone to 8.5; 0B1 alone to 10.5.
    // (Per-rank: (M + P - 1)(F + B) = 9; serial: 12.)
    let s = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let c = uniform(1.0, 1.0, 1.0, 2, 0.5);
    let sim = shared(&s, &c);
    let ends: Vec<Vec<f64>> = sim
        .timeline
        .spans
        .iter()
        .map(|l| l.iter().map(|sp| sp.end).collect())
        .collect();
    assert_eq!(
        ends,
        vec![vec![1.0, 2.5, 7.5, 10.5], vec![2.5, 4.5, 6.0, 8.5]]
    );
    assert_eq!(simulate(&s, &c).unwrap().timeline.makespan(), 9.0);
    // The throughput bound: P = 3, M = 1, total work 3 * (1 + 2) = 9, share 1/2: the device does
    // at most 3 / (1 + 0.5 * 2) = 1.5 units of work per unit of time, so at least 6.
    let s = families::generate("1f1b", &Params::new(3, 1)).unwrap();
    let c = uniform(1.0, 1.0, 1.0, 3, 0.5);
    assert!(shared(&s, &c).lower_bound >= 6.0);
}

#[test]
fn lowered_schedules_are_refused() {
    let s = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let lowered = pipefill_host::schedule::lower::lower(&s).unwrap();
    let c = uniform(1.0, 1.0, 1.0, 2, 0.5);
    match simulate_with(&lowered, &c, SimOptions::ALL.on(DeviceSharing::Shared)) {
        Err(SimError::Shape { reason, .. }) => assert!(reason.contains("compute-only"), "{reason}"),
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[derive(Debug, Clone)]
struct Case {
    p: usize,
    m: usize,
    v: usize,
    stages: Vec<(f64, f64, f64)>,
    latency: f64,
    share: f64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..=4,
        1usize..=8,
        1usize..=2,
        prop::collection::vec((0.0f64..3.0, 0.0f64..3.0, 0.0f64..3.0), 8),
        prop::option::of(0.0f64..0.5),
        0.0f64..=1.0,
    )
        .prop_map(|(p, m, v, stages, latency, share)| Case {
            p,
            m,
            v,
            stages,
            latency: latency.unwrap_or(0.0),
            share,
        })
}

#[test]
fn never_faster_than_per_rank_nor_than_its_bound() {
    let tally = prop_coverage::run(file!(), 64, case(), |c, tally| {
        for fam in families::FAMILIES {
            let params = Params {
                ranks: c.p,
                microbatches: c.m,
                chunks: Some(c.v),
                group_size: None,
            };
            let Ok(s) = (fam.generate)(&params) else {
                continue;
            };
            let cost = CostModel {
                stages: (0..s.stages())
                    .map(|i| {
                        let (f, ii, w) = c.stages[i % c.stages.len()];
                        StageCost::uniform(f, ii, w)
                    })
                    .collect(),
                link: LinkCost {
                    latency: c.latency,
                    bandwidth: f64::INFINITY,
                },
                overlap_share: c.share,
            };
            let alone = simulate(&s, &cost).unwrap().timeline.makespan();
            let sim = shared(&s, &cost);
            let m = sim.timeline.makespan();
            let tol = 1e-9 * m.max(1.0);
            prop_assert!(
                m + tol >= alone,
                "{}: shared {m} < per-rank {alone}",
                s.name
            );
            prop_assert!(
                sim.lower_bound <= m + tol,
                "{}: {m} < bound {}",
                s.name,
                sim.lower_bound
            );
            if c.latency == 0.0 {
                let sum = serial_sum(&sim, &cost);
                prop_assert!(m <= sum + tol, "{}: {m} above the serial sum {sum}", s.name);
            }
            tally.hit(fam.name);
        }
        Ok(())
    });
    tally.assert_floor("1f1b", 8);
    tally.assert_floor("zbv", 8);
}
