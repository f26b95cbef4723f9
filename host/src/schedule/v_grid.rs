//! The unit-time grid behind the controllable-memory V schedules (`v-half`, `v-min`).
//!
//! "Pipeline Parallelism with Controllable Memory" (Qi et al., 2024) builds V-shape schedules from a
//! *building block*: with every op taking one unit of time, rank `r` repeats, every 6 units (each
//! microbatch brings `F`, `I` and `W` of two chunks), the same four compute slots at fixed offsets:
//! the forward of chunk 0 (stage `r`, on the way down), the forward of chunk 1 (stage `2P-1-r`, on
//! the way back up), the input-gradient of chunk 1 and the input-gradient of chunk 0. The offsets
//! fix how long a microbatch's activations stay on a rank, and so the peak memory: the tighter
//! the chain of one microbatch, the fewer microbatches in flight.
//!
//! Microbatch `k` takes slot `offset + 6k` for each of the four. The weight-gradient passes fill
//! the slots left free, oldest input-gradient first, and any left when the pattern ends follow it. The pattern leaves free
//! slots in warm-up and cool-down; a greedy pass (as the paper's) then moves every op, in slot
//! order, to the earliest free slot after its inputs unless that raises the largest in-flight count
//! of any rank. A rank's list is its slots in time order.
//!
//! **Why it runs.** A family's offsets put every dependency of an op in a strictly earlier slot (each
//! family's module shows it), and the four offsets of a rank differ modulo 6 (so no two ops share a
//! slot). The grid is then a valid timetable when every op takes one unit and transfers are free,
//! and the compaction keeps it one (an op only moves to a slot after its inputs' final slots);
//! listing each rank's slots in time order gives lists in which every op's inputs come from ops
//! listed earlier in time, so the simulator and every runtime run them without deadlock, for any
//! costs (a rank only ever waits for something that the grid finished earlier).
//!
//! **Memory.** A rank's peak is fixed by the order alone (the simulator allocates at `F` and frees
//! at `W`, in list order), so it is the grid's: at most the pattern's largest per-rank peak (the
//! compaction lets a rank rise to it, never above). `host/tests/schedule_vhalf.rs` measures it
//! against 1F1B's in the simulator.

use super::deps::{self, Need};
use super::families::Family;
use super::zbv::vshape;
use super::{Action, Item, Op, Params, Schedule, ScheduleError};

/// The grid slots (time units) of microbatch 0's four compute ops on one rank, in the order forward
/// chunk 0, forward chunk 1, input-gradient chunk 1, input-gradient chunk 0.
pub(super) type Offsets = [usize; 4];

/// Units per microbatch in steady state: `F`, `I`, `W` of two chunks.
const PERIOD: usize = 6;

/// A schedule of `family` (V-shape, `V = 2`) from the grid whose rank `r` of `P` takes
/// `offsets(P, r)`: what `v-half` and `v-min` are, each with its own offsets.
pub(super) fn generate(
    family: &Family,
    p: &Params,
    offsets: impl Fn(usize, usize) -> Offsets,
) -> Result<Schedule, ScheduleError> {
    let v = p.checked(family.name, family.default_chunks, 2..=2)?;
    let n = p.ranks;
    let actions = build(n, p.microbatches, |r| offsets(n, r));
    Ok(vshape(family.name, n, v, p.microbatches, actions))
}

/// Every rank's list for `m` microbatches on `ranks` ranks, rank `r` taking `offsets(r)`: the
/// grid of each rank (its four ops per microbatch, `W`s in the free slots), compacted (see
/// [`compact`]), read in slot order.
pub(super) fn build(ranks: usize, m: usize, offsets: impl Fn(usize) -> Offsets) -> Vec<Vec<Item>> {
    let mut grid: Vec<Vec<(usize, Action)>> = (0..ranks)
        .map(|r| rank_slots(r, ranks, m, offsets(r)))
        .collect();
    compact(ranks, m, &mut grid);
    grid.into_iter()
        .map(|mut slots| {
            slots.sort_by_key(|&(t, _)| t);
            slots.into_iter().map(|(_, a)| Item::One(a)).collect()
        })
        .collect()
}

/// Rank `r`'s grid: `(slot, action)` for every op, in slot order. The four offsets must differ
/// modulo 6 (the families' offsets do), so that no two ops share a slot.
fn rank_slots(r: usize, ranks: usize, m: usize, offsets: Offsets) -> Vec<(usize, Action)> {
    debug_assert!((0..4).all(|i| (0..i).all(|j| offsets[i] % PERIOD != offsets[j] % PERIOD)));
    let stage = [r, 2 * ranks - 1 - r];
    let kinds = [(0, Op::F), (1, Op::F), (1, Op::I), (0, Op::I)];
    let mut ops: Vec<(usize, Action)> = (0..m)
        .flat_map(|k| {
            kinds.iter().zip(offsets).map(move |(&(chunk, op), off)| {
                (off + PERIOD * k, Action::new(op, stage[chunk], k))
            })
        })
        .collect();
    ops.sort_by_key(|&(t, _)| t);
    let mut out = Vec::with_capacity(6 * m);
    // Input-gradients whose W is still to come, oldest first.
    let mut pending = std::collections::VecDeque::new();
    let mut next = ops.into_iter().peekable();
    let mut t = 0;
    while next.peek().is_some() || !pending.is_empty() {
        match next.peek() {
            Some(&(at, a)) if at == t => {
                out.push((t, a));
                if a.op == Op::I {
                    pending.push_back(a);
                }
                next.next();
            }
            _ => {
                if let Some(i) = pending.pop_front() {
                    out.push((t, Action::new(Op::W, i.stage, i.microbatch)));
                }
            }
        }
        t += 1;
    }
    out
}

/// Moves every op, in slot order over all ranks, to the earliest free slot of its rank after its
/// inputs' slots, unless that raises the largest in-flight count of any rank (a forward moved
/// earlier holds its activations longer; a `W` moved earlier frees them sooner). The pattern leaves
/// free slots in warm-up and cool-down; this closes them, as the controllable-memory paper's
/// greedy does. Each op's inputs were processed before it (they sit in earlier slots) and are not
/// moved again, so the grid stays a timetable in which every input is in an earlier slot.
fn compact(ranks: usize, m: usize, grid: &mut [Vec<(usize, Action)>]) {
    let stages = 2 * ranks;
    let key = |a: Action| (a.stage * m + a.microbatch) * 3 + op_slot(a.op);
    let mut slot_of = vec![0; stages * m * 3];
    let len = grid
        .iter()
        .flatten()
        .map(|&(t, _)| t + 1)
        .max()
        .unwrap_or(0);
    let mut busy = vec![vec![false; len]; ranks];
    let mut held = vec![vec![0i64; len]; ranks];
    for (r, slots) in grid.iter().enumerate() {
        for &(t, a) in slots {
            slot_of[key(a)] = t;
            busy[r][t] = true;
        }
    }
    for (r, slots) in grid.iter().enumerate() {
        for &(t, a) in slots {
            if a.op == Op::F {
                let w = slot_of[key(Action::new(Op::W, a.stage, a.microbatch))];
                held[r][t..=w].iter_mut().for_each(|h| *h += 1);
            }
        }
    }
    let cap = held.iter().flatten().copied().max().unwrap_or(0);
    let mut events: Vec<(usize, usize, Action)> = grid
        .iter()
        .enumerate()
        .flat_map(|(r, slots)| slots.iter().map(move |&(t, a)| (t, r, a)))
        .collect();
    events.sort_by_key(|&(t, r, _)| (t, r));
    for (_, r, a) in events {
        let now = slot_of[key(a)];
        let earliest = deps::needs(a, stages)
            .map(|need| match need {
                Need::Stash(x) => slot_of[key(x)] + 1,
                Need::Data(e) => slot_of[key(e.producer())] + 1,
            })
            .max()
            .unwrap_or(0);
        let mut best = None;
        let mut most = i64::MIN;
        for t in (earliest..now).rev() {
            most = most.max(held[r][t]);
            if a.op == Op::F && most + 1 > cap {
                break;
            }
            if !busy[r][t] {
                best = Some(t);
            }
        }
        let Some(t) = best else { continue };
        busy[r][now] = false;
        busy[r][t] = true;
        slot_of[key(a)] = t;
        match a.op {
            Op::F => held[r][t..now].iter_mut().for_each(|h| *h += 1),
            Op::W => held[r][t + 1..=now].iter_mut().for_each(|h| *h -= 1),
            Op::I | Op::B => {}
        }
    }
    for slots in grid.iter_mut() {
        for entry in slots.iter_mut() {
            entry.0 = slot_of[key(entry.1)];
        }
    }
}

/// Index of `op` among a `(stage, microbatch)`'s three ops.
fn op_slot(op: Op) -> usize {
    match op {
        Op::F => 0,
        Op::I | Op::B => 1,
        Op::W => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_fills_gaps_with_w() {
        // P = 1: stage 0 and 1 on rank 0; offsets 0, 1, 2, 3: F0 F1 I1 I0, then W1 W0 in the gaps.
        let l: Vec<String> = rank_slots(0, 1, 2, [0, 1, 2, 3])
            .iter()
            .map(|(_, a)| a.to_string())
            .collect();
        assert_eq!(
            l,
            ["0F0", "1F0", "1I0", "0I0", "1W0", "0W0", "0F1", "1F1", "1I1", "0I1", "1W1", "0W1"]
        );
    }
}
