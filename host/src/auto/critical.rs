//! Moves on the critical path: the improvement phase's moves aimed where they can help.
//!
//! A schedule's makespan (or its worst rank's span) is the length of a chain of actions, each
//! starting when the one before it ends: either the previous action on the same rank (a machine
//! edge) or the action whose output it waits for (a data edge, plus the transfer). Moving an action
//! that is not on that chain cannot shorten it; random moves mostly do exactly that. This module
//! reads the chain off the simulator's timeline and proposes the job-shop moves on it: a *block* is
//! a run of chain actions back to back on one rank; swapping the first two or the last two of a
//! block, or moving one of its actions to just before or just after the block, is what can start
//! the chain's next link sooner (Nowicki and Smutnicki's neighbourhood, widened by the moves to a
//! block's ends).
//!
//! The chain is the simulator's own critical path ([`crate::sim::Simulation::critical_path`]),
//! or for the span objective the chain that ends the worst rank's last item. The moves keep every
//! rank's list a permutation of its items and never pass an item over another that shares a
//! microbatch with it on the same rank (its own `F` before `I` before `W`, and on V-shape the two
//! chunks' forwards); a move that still deadlocks across ranks is refused by the simulator when it
//! is scored.

use crate::schedule::Schedule;
use crate::sim::{simulate_path_to, PathStep, Via};

use super::instance::Instance;
use super::rng::Rng;

/// The blocks of a schedule's critical chain (the simulator's critical path,
/// [`crate::sim::Simulation::critical_path`], or the one that ends a given rank).
pub(crate) struct Chain {
    /// `(rank, first, last)` positions of two or more chain items back to back on one rank.
    blocks: Vec<(usize, usize, usize)>,
}

/// What the chain ends at.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// The item that ends last (the makespan).
    Makespan,
    /// The last item of this rank (its span).
    Rank(usize),
}

impl Chain {
    /// The chain of `schedule` under the instance's costs ending at `target`; `None` when the
    /// schedule does not simulate.
    pub(crate) fn of(inst: &Instance, schedule: &Schedule, target: Target) -> Option<Self> {
        let rank = match target {
            Target::Makespan => None,
            Target::Rank(r) => Some(r),
        };
        let sim = simulate_path_to(schedule, &inst.scoring, rank).ok()?;
        Some(Chain {
            blocks: blocks(&sim.critical_path),
        })
    }
}

/// Runs of two or more path steps back to back on one rank (each after the first waited for its
/// rank only), as `(rank, first, last)` positions.
fn blocks(path: &[PathStep]) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut j = 0;
    while j < path.len() {
        let mut k = j;
        while k + 1 < path.len() && path[k + 1].via == Via::Rank {
            k += 1;
        }
        if k > j {
            out.push((path[j].rank, path[j].index, path[k].index));
        }
        j = k + 1;
    }
    out
}

/// `schedule` with one critical-path move, or `None` when the chain has no block of two or the
/// drawn move would pass an item over one that shares a microbatch with it.
pub(crate) fn moved(schedule: &Schedule, chain: &Chain, rng: &mut Rng) -> Option<Schedule> {
    let &(r, lo, hi) = chain.blocks.get(rng.below(chain.blocks.len()))?;
    let (from, to) = match rng.below(4) {
        0 => (lo, lo + 1),
        1 => (hi, hi - 1),
        2 => (lo + rng.below(hi - lo + 1), lo),
        _ => (lo + rng.below(hi - lo + 1), hi),
    };
    if from == to {
        return None;
    }
    let list = &schedule.actions[r];
    let item = &list[from];
    let (a, b) = (from.min(to), from.max(to));
    let passed = if from < to { a + 1..=b } else { a..=b - 1 };
    let shares = |other: &crate::schedule::Item| {
        other
            .actions()
            .any(|x| item.actions().any(|y| x.microbatch == y.microbatch))
    };
    if list[passed].iter().any(shares) {
        return None;
    }
    let mut s = schedule.clone();
    let it = s.actions[r].remove(from);
    s.actions[r].insert(to, it);
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::{AutoRequest, MemoryLimit};
    use crate::cost::{CostModel, LinkCost, StageCost};
    use crate::schedule::families::generate;
    use crate::schedule::{Params, Placement};
    use crate::sim::{simulate_with, SimOptions};

    /// P = 4, M = 8, V-shape, 1:1:1 with a latency: transfers put data edges on the chain.
    fn instance() -> Instance {
        let link = LinkCost {
            latency: 0.1,
            bandwidth: f64::INFINITY,
        };
        let one = StageCost::uniform(1.0, 1.0, 1.0).split(2);
        let req = AutoRequest::new(4, 8, CostModel::uniform(one, 8, link))
            .with_chunks(2, Placement::Vshape)
            .with_limit(MemoryLimit::InFlight(8.0));
        Instance::new(&req).unwrap()
    }

    /// Per rank, its items sorted (a move keeps each rank's items).
    fn sorted(s: &Schedule) -> Vec<Vec<String>> {
        s.actions
            .iter()
            .map(|l| {
                let mut v: Vec<String> = l.iter().map(|i| format!("{i:?}")).collect();
                v.sort();
                v
            })
            .collect()
    }

    /// Per rank, the order of the items that touch microbatch `k`.
    fn per_microbatch(s: &Schedule, k: usize) -> Vec<Vec<String>> {
        s.actions
            .iter()
            .map(|l| {
                l.iter()
                    .filter(|i| i.actions().any(|a| a.microbatch == k))
                    .map(|i| format!("{i:?}"))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn blocks_are_the_simulator_s_critical_path_back_to_back() {
        let inst = instance();
        let base = generate("zbv", &Params::new(4, 8).with_chunks(2)).unwrap();
        let chain = Chain::of(&inst, &base, Target::Makespan).unwrap();
        assert!(!chain.blocks.is_empty());
        let sim = simulate_with(&base, &inst.scoring, SimOptions::ALL).unwrap();
        let on_path = |r: usize, i: usize| {
            sim.critical_path
                .iter()
                .any(|p| (p.rank, p.index) == (r, i))
        };
        for &(r, lo, hi) in &chain.blocks {
            assert!(lo < hi && hi < base.actions[r].len());
            for i in lo..=hi {
                assert!(on_path(r, i), "{r} {i}");
            }
            // Back to back: each starts when the one before it ends.
            let lane = &sim.timeline.spans[r];
            for i in lo + 1..=hi {
                assert!((lane[i].start - lane[i - 1].end).abs() < 1e-9);
            }
        }
        // The chain ending at rank 3 ends at its last item.
        let to_rank = Chain::of(&inst, &base, Target::Rank(3)).unwrap();
        let last = base.actions[3].len() - 1;
        assert!(to_rank
            .blocks
            .iter()
            .all(|&(r, _, hi)| r != 3 || hi <= last));
    }

    #[test]
    fn moves_keep_each_rank_s_items_and_each_microbatch_s_order() {
        let inst = instance();
        // ZB-V (single passes) and DualPipeV (overlapped pairs).
        for family in ["zbv", "dualpipev"] {
            let base = generate(family, &Params::new(4, 8).with_chunks(2)).unwrap();
            let mut made = 0;
            let mut rng = Rng::new(7);
            for n in 0..300 {
                let target = if n % 2 == 0 {
                    Target::Makespan
                } else {
                    Target::Rank(n % 4)
                };
                let chain = Chain::of(&inst, &base, target).unwrap();
                let Some(s) = moved(&base, &chain, &mut rng) else {
                    continue;
                };
                made += 1;
                assert_ne!(s.actions, base.actions);
                assert_eq!(sorted(&s), sorted(&base));
                for k in 0..8 {
                    assert_eq!(per_microbatch(&s, k), per_microbatch(&base, k));
                }
            }
            assert!(made > 20, "{family}: {made}");
        }
    }
}
