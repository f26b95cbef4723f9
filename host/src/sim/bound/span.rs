//! Section 5 of the [simulator's docs](crate::sim#lower-bound): the longest per-rank span under a
//! memory limit (derivation in the parent module's docs).

use super::chain::Chain;
use super::jackson::{self, Job};
use super::nest::Nest;
use super::pair::pair_term;
use super::stair::{Anchor, Groups, Which, MAX_BLOCKS};
use super::{check_limits, BoundError, RankJobs, Slots};
use crate::cost::CostModel;
use crate::schedule::Placement;

/// A lower bound on the longest per-rank span (first action's start to last action's end) of any
/// schedule of `ranks` ranks, `microbatches` microbatches and `costs`' stages placed by
/// `placement`, when rank `r` holds at most `max_in_flight[r]` rank-microbatches (`None`: no
/// limit). Sections 5-10, 12 and 13 of the [simulator's docs](crate::sim#lower-bound); infinite when
/// a limit is below one stage's microbatch, or, with two stages per rank, below two.
///
/// ```
/// use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// use pipefill_host::schedule::Placement;
/// use pipefill_host::sim::span_bound;
/// let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
/// // Without a limit: the busiest rank's work, 8 * 3.
/// assert_eq!(span_bound(4, 8, Placement::Looped, &c, false, None).unwrap(), 24.0);
/// // One microbatch in flight: rank 0 runs 8 round trips (4 F, 3 I up and back, its I and W: 9).
/// let one = span_bound(4, 8, Placement::Looped, &c, false, Some(&[1.0; 4])).unwrap();
/// assert_eq!(one, 72.0);
/// ```
///
/// Errors: as [`super::bound_with_limit`].
pub fn span_bound(
    ranks: usize,
    microbatches: usize,
    placement: Placement,
    costs: &CostModel,
    overlap: bool,
    max_in_flight: Option<&[f64]>,
) -> Result<f64, BoundError> {
    span_bound_with(
        ranks,
        microbatches,
        placement,
        costs,
        overlap,
        max_in_flight,
        Terms::ALL,
    )
}

/// [`span_bound`]'s memory terms with two levels of holding (module docs, section 11), as
/// [`super::bound_with_limit_until_input`]: a whole slot from a forward's start to the end of its
/// `I`, `after_input[r]` of one from there to the end of its `W`, at most `max_in_flight[r]` slots
/// (not rounded) on rank `r`. The terms that do not involve memory are [`span_bound`]'s, so take the
/// larger of the two.
///
/// ```
/// use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// use pipefill_host::schedule::Placement;
/// use pipefill_host::sim::{span_bound, span_bound_until_input};
/// let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
/// let limit = [1.0; 4];
/// // One slot, held whole only up to I: rank 0 waits for 4 F and 4 I per microbatch (8 x 8).
/// let up_to_i = span_bound_until_input(4, 8, Placement::Looped, &c, false, &limit, &[0.0; 4]);
/// assert!(up_to_i.unwrap() >= 8.0 * 8.0);
/// // Held whole to the end of W, it is the plain bound's memory term (which has more terms).
/// let whole = span_bound_until_input(4, 8, Placement::Looped, &c, false, &limit, &[1.0; 4]);
/// assert!(whole.unwrap() <= span_bound(4, 8, Placement::Looped, &c, false, Some(&limit)).unwrap());
/// ```
///
/// Errors: as [`super::bound_with_limit`], for either list.
pub fn span_bound_until_input(
    ranks: usize,
    microbatches: usize,
    placement: Placement,
    costs: &CostModel,
    overlap: bool,
    max_in_flight: &[f64],
    after_input: &[f64],
) -> Result<f64, BoundError> {
    check_limits(ranks, after_input)?;
    span_bound_with(
        ranks,
        microbatches,
        placement,
        costs,
        overlap,
        Some(max_in_flight),
        Terms {
            others: false,
            flow: false,
            after_input: Some(after_input),
        },
    )
}

/// Which of the costlier terms [`span_bound_with`] computes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Terms<'a> {
    /// The other machines' terms of section 7 and the pairs of ranks of section 8 (they cost
    /// `P^2` one-machine problems and more; the makespan bound of every simulation leaves them
    /// out).
    pub others: bool,
    /// Sections 10, 12 and 13 for the rank that holds stage 0 (the makespan bound under a limit
    /// leaves them out: its own terms of those sections are no smaller).
    pub flow: bool,
    /// The second level of holding (section 11), per rank: slots then count to the end of `I`
    /// whole and this share of one to the end of `W`, and sections 9 and 10 are left out.
    pub after_input: Option<&'a [f64]>,
}

impl Terms<'static> {
    /// Every term.
    pub const ALL: Terms<'static> = Terms {
        others: true,
        flow: true,
        after_input: None,
    };
    /// Neither (the span term of the bound without a limit).
    pub const NONE: Terms<'static> = Terms {
        others: false,
        flow: false,
        after_input: None,
    };
}

/// The other machines' terms of section 7 and the pairs of ranks of section 8 each run when their
/// estimated work stays under this (up to P = 16 at V = 2; above it they would take most of a second, and
/// the span bound goes without them).
const RANKS_WORK: f64 = 2e7;

/// [`span_bound`] with the costlier terms that `terms` asks for.
pub(super) fn span_bound_with(
    ranks: usize,
    microbatches: usize,
    placement: Placement,
    costs: &CostModel,
    overlap: bool,
    max_in_flight: Option<&[f64]>,
    terms: Terms,
) -> Result<f64, BoundError> {
    let after_input = terms.after_input;
    let until_input = after_input.is_some();
    if let Some(limits) = max_in_flight {
        check_limits(ranks, limits)?;
    }
    if costs.stages.is_empty() || ranks == 0 || microbatches == 0 {
        return Ok(0.0);
    }
    let mut chain = Chain::new(ranks, placement, costs);
    if until_input {
        chain.release_at_input();
    }
    let groups = Groups::new(ranks, placement, costs, &chain, overlap);
    let chunks = costs.stages.len() as f64 / ranks as f64;
    let first = placement.rank_of(0, ranks);
    // Section 13 (the ranks' own problems to the end of the first rank; on V-shape the tip rank's,
    // as in `limited`) on a thread of its own beside the other sections.
    let own_limits = max_in_flight.filter(|_| !until_input && terms.flow && !overlap);
    let bound = std::thread::scope(|scope| {
        let own = own_limits.map(|limits| {
            let problem = (&chain, &groups, microbatches, chunks);
            super::own_beside(scope, problem, limits, Some(first), |o| o.first_span)
        });
        let own = || own.map_or(0.0, super::joined);
        other_sections(
            (ranks, microbatches, placement, overlap),
            (&chain, &groups, chunks),
            (max_in_flight, terms),
            own,
        )
    });
    Ok(bound)
}

/// [`span_bound_with`]'s sections, section 13's value from `own` (taken before section 8, whose
/// search stops at the bound known by then).
fn other_sections(
    (ranks, microbatches, placement, overlap): (usize, usize, Placement, bool),
    (chain, groups, chunks): (&Chain, &Groups, f64),
    (max_in_flight, terms): (Option<&[f64]>, Terms),
    own: impl FnOnce() -> f64,
) -> f64 {
    let after_input = terms.after_input;
    let until_input = after_input.is_some();
    let m = microbatches as f64;
    let mut bound = 0.0f64;
    for r in 0..ranks {
        let rank = RankJobs::new(r, chain, groups);
        let work: f64 = rank
            .mine
            .iter()
            .map(|&s| m * (rank.forward_work(s) + chain.input[s] + chain.rest[s]))
            .sum();
        let slots = max_in_flight.map_or(
            Slots {
                cap: f64::INFINITY,
                after: None,
            },
            |l| Slots::new(l[r], chunks, after_input.map(|w| w[r])),
        );
        bound = bound
            .max(work)
            .max(rank.span_term(groups, r, microbatches, slots));
    }
    if let Some(limits) = max_in_flight.filter(|_| !until_input) {
        // Section 12: every other rank's memory term, up to the end of the first rank's last action.
        let first = placement.rank_of(0, ranks);
        for r in (0..ranks).filter(|&r| terms.flow && r != first) {
            let rank = RankJobs::new(r, chain, groups);
            let slots = Slots::new(limits[r], chunks, None);
            bound = bound.max(rank.memory_term_for_first(groups, (r, first), microbatches, slots));
        }
        // Section 14: the tip rank with a second rank, to the end of the first rank.
        if terms.flow && !overlap {
            if let Some(o) = super::pair_term(chain, groups, microbatches, limits, chunks) {
                bound = bound.max(o.first_span);
            }
        }
        // Section 9 for the rank that holds stage 0 (its term counts from that rank's first action).
        if let Some(nest) = Nest::new(chain, groups, limits, chunks, microbatches) {
            bound = bound.max(nest.term(first, |s| groups.forward_work(s)));
        }
        // Section 10 for the same rank.
        let section = terms
            .flow
            .then(|| super::flow::flow(chain, groups, limits, chunks, microbatches, overlap))
            .flatten();
        if let Some(f) = section {
            bound = bound.max(f.first_span);
        }
    }
    bound = bound.max(own());
    // Per rank and machine: its groups' staircases against every rank's groups, then a
    // one-machine problem; each pair of ranks runs up to 2 REFINEMENTS + FIRST_SPLITS + 1 more.
    let (p, per_rank) = (ranks as f64, groups.per_rank() as f64);
    let jobs = per_rank * microbatches.min(MAX_BLOCKS) as f64;
    let lines = per_rank * p * (per_rank.min(8.0).powi(2) * per_rank + 3.0 * per_rank);
    if terms.others && p * p * (lines + jobs) <= RANKS_WORK {
        // Every other rank's work between rank r's first forward and its last action (section 7).
        for r in 0..ranks {
            for machine in (0..ranks).filter(|&q| q != r) {
                let jobs = groups.jobs(machine, microbatches, Anchor::Rank(r), Which::All, true);
                bound = bound.max(jackson::preemptive(&jobs));
            }
        }
    }
    if terms.others && p * p * jobs * 100.0 <= RANKS_WORK {
        for q in 0..ranks {
            for r in (0..ranks).filter(|&r| r != q) {
                bound = bound.max(pair_term(groups, q, r, microbatches, bound));
            }
        }
    }
    bound
}

impl RankJobs<'_> {
    /// Per stage of the rank (in `mine`'s order), the earliest start of its forwards relative to
    /// the rank's first action: the forward chain from the rank's lowest stage, whose forward comes
    /// first on the rank (every action of the rank needs it).
    pub(super) fn relative_heads(&self) -> Vec<f64> {
        let c = self.chain;
        let base = self.mine.first().map_or(0.0, |&s| c.head_f[s]);
        self.mine.iter().map(|&s| c.head_f[s] - base).collect()
    }

    /// Section 5: the rank's span with at most `held` stage-microbatches (`m` microbatches): the
    /// larger of the per-stage relaxation (no memory), the memory relaxation and the holding
    /// argument.
    fn span_term(&self, groups: &Groups, r: usize, m: usize, slots: Slots) -> f64 {
        let c = self.chain;
        if self.mine.is_empty() {
            return 0.0;
        }
        if slots.cap < 1.0 {
            return f64::INFINITY;
        }
        // Per stage and microbatch: its forwards from their relative heads, followed by their own
        // round trip on this rank; its inputs and rests as in section 3; staircases (section 7).
        let anchor = Anchor::Rank(r);
        let free = jackson::preemptive(&groups.jobs(r, m, anchor, Which::All, true));
        let count = self.mine.len() * m;
        if slots.binds_none(count) {
            return free;
        }
        let heads = self.relative_heads();
        let x = self.forward_starts(m, slots, &heads);
        let work = self.min_over(|s| self.forward_work(s));
        // From a forward's start to the end of the last action of this rank that needs it.
        let trip = self.min_over(|s| c.forward[s] + c.up[s] + c.input[s] + self.own_tail(s));
        let mut jobs: Vec<Job> = x
            .iter()
            .map(|&head| Job {
                head,
                work,
                tail: trip - work,
            })
            .collect();
        jobs.extend(groups.jobs(r, m, anchor, Which::Backward, true));
        free.max(jackson::preemptive(&jobs))
            .max(self.holding(m, slots))
    }

    /// From the end of `I(s, k)` to the end of the last action of this rank that depends on it:
    /// its own rest (`W`), or the gradient chain down to a lower stage `t` of the rank (on
    /// V-shape, the rank's first chunk), that stage's input gradient and its rest.
    fn own_tail(&self, s: usize) -> f64 {
        let c = self.chain;
        self.mine
            .iter()
            .filter(|&&t| t <= s)
            .map(|&t| match t {
                _ if t == s => c.rest[s],
                // `down` already holds stage 0's whole backward.
                0 => c.down[s] - c.down[0],
                _ => c.down[s] - c.down[t] + c.rest[t],
            })
            .fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{LinkCost, StageCost};

    #[test]
    fn vshape_first_rank_waits_for_its_last_chunk() {
        // P = 4, V-shape, chunks of F = I = W = 0.5, M = 4: rank 0 runs its 4 first-chunk forwards
        // (2) and then waits until the first microbatch has climbed to stage 7 (3.5), then works
        // the remaining 10: 13.5, not the rank's work 12 (the schedules reach it: proven in
        // `bench auto --part vshape`).
        let c = CostModel::uniform(StageCost::uniform(0.5, 0.5, 0.5), 8, LinkCost::default());
        let free = span_bound(4, 4, Placement::Vshape, &c, false, None).unwrap();
        assert_eq!(free, 13.5);
    }
}
