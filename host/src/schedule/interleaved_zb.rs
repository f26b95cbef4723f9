//! The `interleaved-zb` family: zero-bubble on looped placement with `V >= 2` stages per rank, the
//! order of PyTorch pipelining's `ScheduleInterleavedZeroBubble` (the ZB1P schedule of "Zero Bubble
//! Pipeline Parallelism", Qi et al., ICLR 2024).
//!
//! It is Megatron's interleaved 1F1B with the backward split into `I` and `W`:
//! - Microbatches go in rounds of `g` (the group size, default `P`): there are
//!   `rounds = max(1, M / g)` rounds of `M / rounds` microbatches each, so `M` must be a multiple of
//!   `rounds` (PyTorch's rule; e.g. `P = 4`: `M = 10` gives two rounds of 5, `M = 9` is refused).
//! - Rank `r`'s `n`-th forward runs local chunk `(n / per_round) % V` (stage `chunk * P + r`) and its
//!   `n`-th input-gradient backward runs chunk `V - 1 - (n / per_round) % V`.
//! - Warm-up: `min((V-1) * per_round + (P-1-r), V*M)` forwards. Then one forward and one `I` per
//!   step while forwards remain, then the remaining `I`s.
//! - Each `I` is followed by the `W` of the `I` run `r` steps earlier (so the `W`s of rank `r` start
//!   `r` steps late, as in ZB-H1), and the `r` `W`s still owed are run at the end.
//!
//! With `V = 1` this is exactly `zb-h1`, which is why `V = 1` is refused here. Group sizes below `P`
//! are refused: the warm-up is then too short for the backwards of later chunks and the order can
//! deadlock. Memory: every rank holds `min(V*M, (V-1) * per_round + P)` stage-microbatches between
//! `F` and `W` at its peak (its warm-up, one more forward, and its `r` deferred `W`s): `V*P` when
//! `M` is a multiple of `P`, below interleaved 1F1B's first rank (`V*P + P - 1`).

use super::families::Family;
use super::{Action, Item, Op, Params, Placement, Schedule, ScheduleError};

/// The `interleaved-zb` family as [`FAMILIES`](super::families::FAMILIES) lists it: its name and default
/// `V` are written here only.
pub const FAMILY: Family = Family {
    name: "interleaved-zb",
    placement: Placement::Looped,
    splits_iw: true,
    overlaps: false,
    default_chunks: 2,
    constraints:
        "V >= 2; P >= 1, M >= 1, M a multiple of max(1, M / G); group size G >= P (default P)",
    summary: "zero-bubble on looped placement (PyTorch InterleavedZeroBubble / ZB1P)",
    generate,
};

/// Generates an `interleaved-zb` schedule.
///
/// Refuses `P = 0`, `M = 0`, `V < 2` (use `zb-h1`), a group size below `P`, and `M` not a multiple of
/// its number of rounds (naming the nearest `M` that work).
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    if p.chunks == Some(1) {
        return Err(ScheduleError::refused(
            FAMILY.name,
            "chunks V = 1 is not supported; use V >= 2, or the `zb-h1` family for V = 1",
        ));
    }
    let v = p.checked(FAMILY.name, FAMILY.default_chunks, 2..=usize::MAX)?;
    let (ranks, m) = (p.ranks, p.microbatches);
    let group = p.group_size.unwrap_or(ranks);
    if group < ranks {
        return Err(ScheduleError::refused(
            FAMILY.name,
            format!(
                "group size {group} is below P = {ranks}: the warm-up would be too short and the \
                 order can deadlock; use a group size >= {ranks} (or leave it unset for {ranks})"
            ),
        ));
    }
    let per_round = rounds_fit(m, group).ok_or_else(|| {
        let (below, above) = nearest_fitting(m, group);
        let rounds = (m / group).max(1);
        let below = below.map_or(String::new(), |b| format!("M = {b} or "));
        ScheduleError::refused(
            FAMILY.name,
            format!(
                "M = {m} microbatches in groups of {group} makes {rounds} rounds, and M must be a \
                 multiple of the number of rounds; use {below}M = {above}"
            ),
        )
    })?;
    let actions = (0..ranks)
        .map(|r| rank_list(r, ranks, v, m, per_round))
        .collect();
    Ok(Schedule::looped(FAMILY.name, ranks, v, m, actions))
}

/// Microbatches per round, if `m` splits evenly into `max(1, m / group)` rounds.
fn rounds_fit(m: usize, group: usize) -> Option<usize> {
    let rounds = (m / group).max(1);
    (m % rounds == 0).then_some(m / rounds)
}

/// The nearest microbatch counts below (if any) and above `m` that [`rounds_fit`] accepts.
fn nearest_fitting(m: usize, group: usize) -> (Option<usize>, usize) {
    let below = (1..m).rev().find(|&c| rounds_fit(c, group).is_some());
    // Multiples of `group` always fit (rounds = c / group divides c), so this search ends.
    let above = (m + 1..)
        .find(|&c| rounds_fit(c, group).is_some())
        .unwrap_or(m);
    (below, above)
}

/// Rank `r`'s list. `n`-th forward / backward of the rank run local chunk `(n / per_round) % v`
/// and `v - 1 - (n / per_round) % v`; per stage, microbatches are taken in order.
fn rank_list(r: usize, ranks: usize, v: usize, m: usize, per_round: usize) -> Vec<Item> {
    let total = v * m;
    let warmup = ((v - 1) * per_round + (ranks - 1 - r)).min(total);
    let fwd_chunk = |n: usize| (n / per_round) % v;
    let bwd_chunk = |n: usize| v - 1 - (n / per_round) % v;
    let mut next = vec![[0usize; 3]; v];
    let mut list = Vec::with_capacity(3 * total);
    let mut push = |op: Op, chunk: usize| {
        let slot = match op {
            Op::F => 0,
            Op::I | Op::B => 1,
            Op::W => 2,
        };
        let k = next[chunk][slot];
        next[chunk][slot] += 1;
        list.push(Item::One(Action::new(op, chunk * ranks + r, k)));
    };
    for step in 0..total + warmup {
        if step < total {
            push(Op::F, fwd_chunk(step));
        }
        if let Some(n) = step.checked_sub(warmup) {
            push(Op::I, bwd_chunk(n));
            if let Some(w) = n.checked_sub(r) {
                push(Op::W, bwd_chunk(w));
            }
        }
    }
    for w in total.saturating_sub(r)..total {
        push(Op::W, bwd_chunk(w));
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::zb_h1::lagged_rank_list;

    /// PyTorch's ZB1P rule with one stage per rank is the paper's ZB-H1 (`zb-h1`, written from the
    /// paper's triple `F(x), I(x-(P-1-r)), W(x-(P-1))`): two published descriptions, one order.
    #[test]
    fn one_chunk_is_zb_h1() {
        for ranks in 1..=16 {
            for m in 1..=64 {
                let Some(per_round) = rounds_fit(m, ranks) else {
                    continue;
                };
                for r in 0..ranks {
                    assert_eq!(
                        rank_list(r, ranks, 1, m, per_round),
                        lagged_rank_list(r, m, ranks - 1 - r, ranks - 1),
                        "P={ranks} M={m} rank {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn nearest_fitting_microbatch_counts() {
        assert_eq!(nearest_fitting(9, 4), (Some(8), 10));
        // 13 and 14 make 3 rounds and are not multiples of 3; 12 and 15 are.
        assert_eq!(nearest_fitting(13, 4), (Some(12), 15));
        // 1 always fits (one round); 2..=7 too with P = 4 (one round each).
        assert_eq!(rounds_fit(5, 4), Some(5));
        assert_eq!(rounds_fit(11, 4), None);
    }
}
