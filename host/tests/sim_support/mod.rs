//! Shared helpers of the simulator tests: an independent, deliberately naive reference simulator
//! (rounds over the ranks until nothing moves, dependencies looked up in a hash map), cost helpers,
//! and timeline invariants.
#![allow(dead_code)]

use std::collections::HashMap;

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::{Action, Item, Op, Schedule};
use pipefill_host::sim::{Simulation, Via};

pub mod random;

/// Uniform per-stage costs with `F`, `I`, `W` and latency `t` on every cross-rank hop.
pub fn costs(stages: usize, f: f64, i: f64, w: f64, latency: f64) -> CostModel {
    CostModel::uniform(
        StageCost::uniform(f, i, w),
        stages,
        LinkCost {
            latency,
            bandwidth: f64::INFINITY,
        },
    )
}

/// The longest per-rank span of a timeline: first action's start to last action's end.
pub fn longest_span(timeline: &pipefill_host::timeline::Timeline) -> f64 {
    timeline
        .spans
        .iter()
        .filter_map(|l| Some(l.last()?.end - l.first()?.start))
        .fold(0.0, f64::max)
}

/// The schedule's peak in flight per rank in rank-microbatches (a stage's microbatch counts `1/V`,
/// from its `F` to the end of its `W` or `B`, whether or not the stage recomputes).
pub fn peak_in_flight(s: &Schedule, sim_costs: &CostModel) -> Vec<f64> {
    let sim = pipefill_host::sim::simulate(s, sim_costs).unwrap();
    let mut unit = sim_costs.clone();
    for st in &mut unit.stages {
        st.activation_bytes = 1.0 / s.chunks as f64;
        st.released_at_input = 0.0;
        st.recompute = pipefill_host::cost::Recompute::None;
    }
    pipefill_host::sim::peak_activations(&sim.timeline, &unit)
}

/// `|a - b| <= 1e-9 * max(1, |a|, |b|)`.
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// The naive reference: returns `spans[r] = [(start, end)]` in list order, or `None` on deadlock.
pub fn reference(s: &Schedule, c: &CostModel) -> Option<Vec<Vec<(f64, f64)>>> {
    let n_stages = s.stages();
    // (is_forward_output, stage, microbatch) -> (end, rank)
    let mut done: HashMap<(bool, usize, usize), (f64, usize)> = HashMap::new();
    let mut pos = vec![0; s.ranks];
    let mut free = vec![0.0f64; s.ranks];
    let mut out = vec![Vec::new(); s.ranks];
    let hop = |from_rank: usize, to_rank: usize, boundary: usize| {
        if from_rank == to_rank {
            0.0
        } else {
            c.link.latency + c.stages[boundary].output_bytes / c.link.bandwidth
        }
    };
    loop {
        let mut moved = false;
        for r in 0..s.ranks {
            while pos[r] < s.actions[r].len() {
                let item = s.actions[r][pos[r]];
                let mut ready = 0.0f64;
                let mut ok = true;
                for a in item.actions() {
                    let mut need = |key: (bool, usize, usize), boundary: usize| match done.get(&key)
                    {
                        Some(&(end, rank)) => ready = ready.max(end + hop(rank, r, boundary)),
                        None => ok = false,
                    };
                    match a.op {
                        Op::F if a.stage > 0 => {
                            need((true, a.stage - 1, a.microbatch), a.stage - 1)
                        }
                        Op::F => {}
                        Op::I | Op::B => {
                            need((true, a.stage, a.microbatch), a.stage);
                            if a.stage + 1 < n_stages {
                                need((false, a.stage + 1, a.microbatch), a.stage);
                            }
                        }
                        Op::W => need((false, a.stage, a.microbatch), a.stage),
                    }
                }
                if !ok {
                    break;
                }
                let dur = match item {
                    Item::One(a) => c.stages[a.stage].time(a.op),
                    Item::Overlap { forward, backward } => c.pair_time(
                        c.stages[forward.stage].forward,
                        c.stages[backward.stage].time(backward.op),
                    ),
                    Item::Comm(_) | Item::Param(_) => {
                        panic!("the reference simulator takes compute-only schedules")
                    }
                };
                let start = ready.max(free[r]);
                let end = start + dur;
                free[r] = end;
                out[r].push((start, end));
                for a in item.actions() {
                    match a.op {
                        Op::F => {
                            done.insert((true, a.stage, a.microbatch), (end, r));
                        }
                        Op::I | Op::B => {
                            done.insert((false, a.stage, a.microbatch), (end, r));
                        }
                        Op::W => {}
                    }
                }
                pos[r] += 1;
                moved = true;
            }
        }
        if (0..s.ranks).all(|r| pos[r] == s.actions[r].len()) {
            return Some(out);
        }
        if !moved {
            return None;
        }
    }
}

/// Asserts that the simulation equals the reference, span by span.
pub fn assert_matches_reference(s: &Schedule, c: &CostModel, sim: &Simulation) {
    let want = reference(s, c).expect("reference deadlocked where the simulator did not");
    for (r, lane) in want.iter().enumerate() {
        assert_eq!(
            sim.timeline.spans[r].len(),
            lane.len(),
            "{} rank {r}: span count",
            s.name
        );
        for (i, &(start, end)) in lane.iter().enumerate() {
            let got = sim.timeline.spans[r][i];
            assert!(
                close(got.start, start) && close(got.end, end),
                "{} rank {r} item {i} `{}`: simulator {}..{}, reference {start}..{end}",
                s.name,
                got.item(),
                got.start,
                got.end
            );
        }
    }
}

/// Asserts the critical path is a chain from time 0 to the makespan: each step starts when the previous
/// one ends (plus its transfer), and durations plus transfers add up to the makespan.
pub fn assert_critical_path(sim: &Simulation) {
    let t = &sim.timeline;
    let path = &sim.critical_path;
    assert!(!path.is_empty());
    let first = t.spans[path[0].rank][path[0].index];
    assert!(
        close(first.start, 0.0),
        "critical path starts at {}",
        first.start
    );
    let mut total = first.end - first.start;
    for w in path.windows(2) {
        let prev = t.spans[w[0].rank][w[0].index];
        let cur = t.spans[w[1].rank][w[1].index];
        let gap = match w[1].via {
            Via::Rank => {
                assert_eq!(w[0].rank, w[1].rank);
                0.0
            }
            Via::Data { transfer } => transfer,
            Via::Start => panic!("Start in the middle of the path"),
        };
        assert!(
            close(cur.start, prev.end + gap),
            "path step {} starts at {}, previous ends at {} (+{gap})",
            cur.item(),
            cur.start,
            prev.end
        );
        total += gap + (cur.end - cur.start);
    }
    assert!(
        close(total, t.makespan()),
        "path length {total} != makespan {}",
        t.makespan()
    );
}

/// Every single action in `s`, for lookups.
pub fn all_actions(s: &Schedule) -> Vec<Action> {
    s.actions
        .iter()
        .flatten()
        .flat_map(|i| i.actions())
        .collect()
}
