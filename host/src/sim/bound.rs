//! A lower bound on the makespan: no schedule with these costs, ranks, chunks and placement can finish
//! earlier.
//!
//! For every rank `r` whose first stage is `s0` (its lowest stage):
//!
//! - **head**: no action of `r` can start before `F(s0, ·)` can, i.e. before the forward chain
//!   `F(0) + send + F(1) + ... + F(s0-1) + send` has run;
//! - **work**: `r` runs `M * sum(F + min(B, I + W))` over its stages, one item at a time;
//! - **tail**: every `F`, `I` and `B` of `r` ends before the last `I/B(s0, ·)` does (they feed it
//!   through the backward chain); after it, the gradient still has to go down to stage 0 (`I` or `B` of
//!   each lower stage, the transfers, and stage 0's `W` or `B`). Only `W`s can be left for later on `r`.
//!
//! So `makespan >= max_r max(head + work, head + non_deferrable_work + tail)`, and also the whole chain
//! of one microbatch. When the schedule overlaps F/B pairs, each forward may save up to
//! `(1 - overlap_share) * min(F, longest backward on the rank)`, which is subtracted from the work.
//!
//! For GPipe/1F1B-type costs the bound is reached by the zero-bubble schedules (e.g. ZB-H1 with
//! `F = I = W` and zero communication), so `makespan / lower_bound` measures how far a schedule is from
//! the best any schedule could do.

use crate::cost::CostModel;
use crate::schedule::{Item, Placement, Schedule};

/// The lower bound for `schedule`'s `P`, `V`, `M` and placement under `costs` (overlap savings are
/// counted when the schedule contains overlapped pairs). How it is derived: `host/src/sim/bound.rs`.
///
/// `costs` must have `schedule.stages()` stages (as [`super::simulate`] checks); with fewer the bound
/// uses what is there.
pub fn lower_bound(schedule: &Schedule, costs: &CostModel) -> f64 {
    let overlap = schedule
        .actions
        .iter()
        .flatten()
        .any(|i| matches!(i, Item::Overlap { .. }));
    bound_for(
        schedule.ranks,
        schedule.microbatches,
        schedule.placement,
        costs,
        overlap,
    )
}

/// The bound for `ranks` ranks, `microbatches` microbatches and the stages of `costs` placed by
/// `placement`; `overlap` allows overlapped F/B pairs.
pub fn bound_for(
    ranks: usize,
    microbatches: usize,
    placement: Placement,
    costs: &CostModel,
    overlap: bool,
) -> f64 {
    let st = &costs.stages;
    let s_count = st.len();
    if s_count == 0 || ranks == 0 {
        return 0.0;
    }
    let m = microbatches as f64;
    let rank = |s: usize| placement.rank_of(s, ranks);
    let comm = |j: usize| {
        if j + 1 < s_count && rank(j) != rank(j + 1) {
            costs.boundary_time(j)
        } else {
            0.0
        }
    };
    // Backward needed on stage j for the chain to move on: I (or B), and at stage 0 the whole backward.
    let back = |j: usize| {
        let c = &st[j];
        if j == 0 {
            c.backward.min(c.backward_input + c.backward_weight)
        } else {
            c.backward_input.min(c.backward)
        }
    };
    let mut fchain = vec![0.0; s_count];
    let mut gchain = vec![0.0; s_count];
    for s in 1..s_count {
        fchain[s] = fchain[s - 1] + st[s - 1].forward + comm(s - 1);
        gchain[s] = gchain[s - 1] + back(s - 1) + comm(s - 1);
    }
    let last = s_count - 1;
    let mut bound = fchain[last] + st[last].forward + back(last) + gchain[last];
    for r in 0..ranks {
        let mine: Vec<usize> = (0..s_count).filter(|&s| rank(s) == r).collect();
        let Some(&s0) = mine.first() else { continue };
        let longest_back = mine
            .iter()
            .map(|&s| st[s].backward.max(st[s].backward_input))
            .fold(0.0, f64::max);
        let mut work = 0.0;
        let mut non_deferrable = 0.0;
        let mut savings = 0.0;
        for &s in &mine {
            let c = &st[s];
            work += c.forward + c.backward.min(c.backward_input + c.backward_weight);
            non_deferrable += c.forward + c.backward_input.min(c.backward);
            if overlap {
                savings += (1.0 - costs.overlap_share) * c.forward.min(longest_back);
            }
        }
        let head = fchain[s0];
        bound = bound
            .max(head + m * (work - savings))
            .max(head + m * (non_deferrable - savings) + gchain[s0]);
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{LinkCost, StageCost};

    #[test]
    fn one_f_one_b_shape() {
        // P = 4, M = 8, F = 1, I = W = 1: the last rank cannot start before 3 and works 24.
        let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
        assert_eq!(bound_for(4, 8, Placement::Looped, &c, false), 27.0);
        // With latency 0.5 on every hop the head grows by 3 * 0.5.
        let c = CostModel::uniform(
            StageCost::uniform(1.0, 1.0, 1.0),
            4,
            LinkCost {
                latency: 0.5,
                bandwidth: f64::INFINITY,
            },
        );
        assert_eq!(bound_for(4, 8, Placement::Looped, &c, false), 28.5);
    }

    #[test]
    fn single_microbatch_chain() {
        // M = 1: the whole chain F0..F3, I3..I1, B0 (or I0 + W0) is the bound.
        let c = CostModel::uniform(StageCost::uniform(1.0, 2.0, 3.0), 4, LinkCost::default());
        assert_eq!(
            bound_for(4, 1, Placement::Looped, &c, false),
            4.0 + 3.0 * 2.0 + 5.0
        );
    }
}
