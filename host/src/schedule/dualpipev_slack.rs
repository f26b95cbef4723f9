//! The `dualpipev-slack` family: DualPipeV's overlapped forward/backward pairs, with one step of
//! slack on every link between neighbouring ranks, so that a transfer has a whole pair's time to
//! land before it is needed. Not a published schedule: pipefill's answer to DualPipeV's one
//! weakness where transfers take time.
//!
//! **Why.** In DualPipeV's steady state rank `r` alternates two pairs, `A` = (forward of chunk 0,
//! backward of chunk 1) and `C` = (forward of chunk 1, backward of chunk 0). `A`'s inputs come from
//! rank `r - 1`, `C`'s from rank `r + 1`. DualPipeV's rank `r + 1` is one microbatch ahead of rank
//! `r` on chunk 0 but level with it on chunk 1: rank `r`'s `C` needs what rank `r + 1` made in the
//! `C` of the same step. Around the link `r, r + 1` the dependencies close a cycle of three pairs
//! and two transfers, so every step of every rank waits two transfer latencies: at P = 16,
//! M = 128, transfers of 0.1 of a forward, 309.3 against 280.0 without transfers (+10 %).
//!
//! **How.** Step `s` of rank `r` runs pair `A` on microbatches `(s + 2P - 2 - r, s - 1 - r)` and pair
//! `C` on `(s + r, s - 2P + 1 + r)` (forward's, backward's), each half only where its microbatch
//! exists: the warm-up is the forwards alone, the cool-down the backwards alone. Every flow is one
//! microbatch ahead on the rank it comes from (chunk 0's forwards and chunk 1's backwards from rank
//! `r - 1`, chunk 1's forwards and chunk 0's backwards from rank `r + 1`), so each input was made
//! a step before it is used. A backward that runs alone is split into `I` then `W`: the gradient
//! leaves at the end of `I`, which shortens the drain's chain.
//!
//! **Cost.** Every rank holds `4P - 1` stage-microbatches at its peak (`2P - 1/2` microbatches;
//! DualPipeV `2P + 1`): it needs twice 1F1B's memory, and a schedule in flight that long leaves
//! more forwards and backwards unpaired. Where overlap is free (`overlap_share` 0) it is shorter
//! than DualPipeV once transfers cost about a tenth of a forward and `M >= 8P` (P = 16, M = 128,
//! 2:2:1, transfers 0.1 of `F`: 482.0 against 498.1; 0.3: 495.5 against 617.3), and longer without
//! transfers (1:1:1: 302.0 against 280.0). `auto` offers it as a seed with every family, so its
//! choice never loses to either.

use super::families::Family;
use super::zbv::vshape;
use super::{Action, Item, Op, Params, Placement, Schedule, ScheduleError};

/// The `dualpipev-slack` family as [`FAMILIES`](super::families::FAMILIES) lists it.
pub const FAMILY: Family = Family {
    name: "dualpipev-slack",
    placement: Placement::Vshape,
    splits_iw: true,
    overlaps: true,
    default_chunks: 2,
    constraints: "V = 2; P >= 1, M >= 1",
    summary: "DualPipeV's pairs with a step of slack per link (hides transfers; 2P microbatches)",
    generate,
};

/// Generates a `dualpipev-slack` schedule; refuses `P = 0`, `M = 0` and `V != 2`.
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    let v = p.checked(FAMILY.name, FAMILY.default_chunks, 2..=2)?;
    let (ranks, m) = (p.ranks, p.microbatches);
    let actions = (0..ranks).map(|r| rank_list(r, ranks, m)).collect();
    Ok(vshape(FAMILY.name, ranks, v, m, actions))
}

/// Rank `r`'s list: its steps in order, each pair `A` then pair `C` (module documentation).
fn rank_list(r: usize, ranks: usize, m: usize) -> Vec<Item> {
    let (ri, pi, mi) = (r as i64, ranks as i64, m as i64);
    let stages = [r, 2 * ranks - 1 - r];
    // Microbatch offsets per step: (forward's chunk, its offset, backward's chunk, its offset).
    let pairs = [
        (0, 2 * pi - 2 - ri, 1, -1 - ri),
        (1, ri, 0, 1 - 2 * pi + ri),
    ];
    let offsets = pairs.iter().flat_map(|&(_, f, _, b)| [f, b]);
    let first = offsets.clone().map(|o| -o).min().unwrap_or(0);
    let last = offsets.map(|o| mi - 1 - o).max().unwrap_or(0);
    let exists = |k: i64| (0..mi).contains(&k).then_some(k as usize);
    let mut items = Vec::with_capacity(4 * m);
    for s in first..=last {
        for &(fc, fo, bc, bo) in &pairs {
            let forward = exists(s + fo).map(|k| Action::new(Op::F, stages[fc], k));
            let backward = exists(s + bo);
            match (forward, backward) {
                (Some(forward), Some(k)) => items.push(Item::Overlap {
                    forward,
                    backward: Action::new(Op::B, stages[bc], k),
                }),
                (Some(forward), None) => items.push(Item::One(forward)),
                (None, Some(k)) => {
                    items.push(Item::One(Action::new(Op::I, stages[bc], k)));
                    items.push(Item::One(Action::new(Op::W, stages[bc], k)));
                }
                (None, None) => {}
            }
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every microbatch of every stage of the rank, once each: `F`, and `B` or `I` then `W`.
    #[test]
    fn each_rank_runs_each_of_its_actions_once() {
        for (ranks, m) in [(1, 1), (2, 3), (4, 8), (4, 32), (8, 5)] {
            let s = generate(&Params::new(ranks, m)).unwrap();
            for (r, list) in s.actions.iter().enumerate() {
                let mut seen = std::collections::BTreeMap::new();
                for a in list.iter().flat_map(|i| i.actions()) {
                    assert!(a.stage == r || a.stage == 2 * ranks - 1 - r, "{a}");
                    *seen.entry((a.stage, a.microbatch, a.op)).or_insert(0) += 1;
                }
                for st in [r, 2 * ranks - 1 - r] {
                    for k in 0..m {
                        let f = seen.get(&(st, k, Op::F)).copied().unwrap_or(0);
                        let b = seen.get(&(st, k, Op::B)).copied().unwrap_or(0);
                        let i = seen.get(&(st, k, Op::I)).copied().unwrap_or(0);
                        let w = seen.get(&(st, k, Op::W)).copied().unwrap_or(0);
                        assert_eq!((f, b + i, b + w), (1, 1, 1), "P={ranks} M={m} {st} {k}");
                    }
                }
            }
        }
    }
}
