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
//! the slots left free, oldest input-gradient first (on a tie in age, chunk 1's, whose stage is
//! further from the loss), and any left when the pattern ends follow it. A rank's list is its slots
//! in time order.
//!
//! **Why it runs.** A family's offsets put every dependency of an op in a strictly earlier slot (each
//! family's module shows it), and the four offsets of a rank differ modulo 6 (so no two ops share a
//! slot). The grid is then a valid timetable when every op takes one unit and transfers are free;
//! listing each rank's slots in time order gives lists in which every op's inputs come from ops
//! listed earlier in time, so the simulator and every runtime run them without deadlock, for any
//! costs (a rank only ever waits for something that the grid finished earlier).
//!
//! **Memory.** A rank's peak is fixed by the order alone (the simulator allocates at `F` and frees
//! at `W`, in list order), so it is the grid's: `host/tests/schedule_vhalf.rs` measures it against
//! 1F1B's in the simulator.

use super::{Action, Item, Op};

/// The grid slots (time units) of microbatch 0's four compute ops on one rank, in the order forward
/// chunk 0, forward chunk 1, input-gradient chunk 1, input-gradient chunk 0.
pub(super) type Offsets = [usize; 4];

/// Units per microbatch in steady state: `F`, `I`, `W` of two chunks.
const PERIOD: usize = 6;

/// Rank `r`'s list for `m` microbatches on `ranks` ranks, from its offsets.
pub(super) fn rank_list(r: usize, ranks: usize, m: usize, offsets: Offsets) -> Vec<Item> {
    let stage = [r, 2 * ranks - 1 - r];
    // (slot, chunk, op) of the four kinds, for every microbatch, in slot order.
    let kinds = [(0, Op::F), (1, Op::F), (1, Op::I), (0, Op::I)];
    let mut slots: Vec<(usize, usize, Op, usize)> = (0..m)
        .flat_map(|k| {
            kinds
                .iter()
                .zip(offsets)
                .map(move |(&(chunk, op), off)| (off + PERIOD * k, chunk, op, k))
        })
        .collect();
    slots.sort_by_key(|&(t, chunk, op, k)| (t, k, op == Op::I, chunk));
    let mut items = Vec::with_capacity(6 * m);
    // Input-gradients whose W is still to come, oldest first.
    let mut pending: std::collections::VecDeque<Action> = std::collections::VecDeque::new();
    let mut next = slots.iter().peekable();
    let mut t = 0;
    while let Some(&&(at, chunk, op, k)) = next.peek() {
        if at == t {
            let a = Action::new(op, stage[chunk], k);
            items.push(Item::One(a));
            if op == Op::I {
                pending.push_back(a);
            }
            next.next();
            // Two ops in one slot (never with the families' offsets) simply follow each other.
            if next.peek().is_some_and(|s| s.0 == t) {
                continue;
            }
        } else if let Some(i) = pending.pop_front() {
            items.push(Item::One(Action::new(Op::W, i.stage, i.microbatch)));
        }
        t += 1;
    }
    items.extend(
        pending
            .into_iter()
            .map(|i| Item::One(Action::new(Op::W, i.stage, i.microbatch))),
    );
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_fills_gaps_with_w() {
        // P = 1: stage 0 and 1 on rank 0; offsets 0, 1, 2, 3: F0 F1 I1 I0, then W1 W0 in the gaps.
        let l: Vec<String> = rank_list(0, 1, 2, [0, 1, 2, 3])
            .iter()
            .map(Item::to_string)
            .collect();
        assert_eq!(
            l,
            ["0F0", "1F0", "1I0", "0I0", "1W0", "0W0", "0F1", "1F1", "1I1", "0I1", "1W1", "0W1"]
        );
    }
}
