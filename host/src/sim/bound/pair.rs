//! Section 8 of the [simulator's docs](crate::sim#lower-bound): two ranks' spans at once (derivation
//! in the parent module's docs).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::jackson::{self, Job};
use super::stair::{Anchor, Copies, Groups, Which};

/// Splits of the range of rank `r`'s start before the search refines (section 8).
const FIRST_SPLITS: usize = 8;

/// Refinements of the range of rank `r`'s start per pair of ranks.
const REFINEMENTS: usize = 40;

/// A lower bound on the longest span when rank `q`'s span and rank `r`'s both bound it, from rank
/// `r`'s machine: every copy on `r` starts after both ranks' first actions allow and ends before
/// both ranks' last actions allow. `r`'s start `d` after `q`'s is unknown; each range of `d`
/// gives a one-machine problem that is easier than every `d` in it, and the least over ranges
/// covering every possible `d` is the bound. `floor`: a bound already known; the search stops
/// once it cannot beat it. 0 when `r`'s forwards need not follow `q`'s.
pub(super) fn pair_term(groups: &Groups, q: usize, r: usize, m: usize, floor: f64) -> f64 {
    let Some(low) = groups.first_head(q, r) else {
        return 0.0;
    };
    let seen_q = groups.copies(r, m, Anchor::Rank(q), Which::All, true);
    let seen_r = groups.copies(r, m, Anchor::Rank(r), Which::All, true);
    if seen_q.len() != seen_r.len() || seen_q.is_empty() {
        return 0.0;
    }
    let value = |from: f64, to: f64| one_range(&seen_q, &seen_r, from, to);
    // Past `cap` every copy on `r` starts `floor` or more after `q`'s first action, so the
    // open range above it is priced as it is (it seldom needs refining).
    let cap = low + floor.max(1.0);
    let mut ranges = BinaryHeap::new();
    ranges.push(Range::new(cap, f64::INFINITY, value(cap, f64::INFINITY)));
    let step = (cap - low) / FIRST_SPLITS as f64;
    for i in 0..FIRST_SPLITS {
        let (from, to) = (low + i as f64 * step, low + (i + 1) as f64 * step);
        ranges.push(Range::new(from, to, value(from, to)));
    }
    for _ in 0..REFINEMENTS {
        let Some(least) = ranges.pop() else { break };
        if least.value <= floor || !least.to.is_finite() {
            return least.value;
        }
        let mid = 0.5 * (least.from + least.to);
        for (from, to) in [(least.from, mid), (mid, least.to)] {
            // A part's problem is no easier than the whole's.
            ranges.push(Range::new(from, to, value(from, to).max(least.value)));
        }
    }
    ranges.pop().map_or(0.0, |r| r.value)
}

/// The one-machine problem for rank `r`'s start in `[from, to]` after `q`'s (`q`'s first action
/// at 0): heads at least the later of `q`'s and `from` plus `r`'s; tails at least the longer of
/// `q`'s and `r`'s less `to` (both spans no longer than the bound sought).
fn one_range(seen_q: &[Copies], seen_r: &[Copies], from: f64, to: f64) -> f64 {
    let jobs: Vec<Job> = seen_q
        .iter()
        .zip(seen_r)
        .filter_map(|(a, b)| {
            let (h, t) = (b.head?, b.tail?);
            Some(Job {
                head: a.head.unwrap_or(f64::NEG_INFINITY).max(from + h),
                work: b.work,
                tail: a.tail.unwrap_or(f64::NEG_INFINITY).max(t - to),
            })
        })
        .collect();
    jackson::preemptive(&jobs)
}

/// A range of `r`'s start and the bound its problem gives, ordered so that the heap's top is the
/// least value.
struct Range {
    from: f64,
    to: f64,
    value: f64,
}

impl Range {
    fn new(from: f64, to: f64, value: f64) -> Range {
        Range { from, to, value }
    }
}

impl PartialEq for Range {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Range {}

impl PartialOrd for Range {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Range {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .value
            .total_cmp(&self.value)
            .then(other.from.total_cmp(&self.from))
    }
}
