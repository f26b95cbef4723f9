//! Jackson's preemptive schedule: the optimum of the preemptive one-machine problem with release
//! times (heads) and delivery times (tails), `1 | r_j, q_j, pmtn | max(C_j + q_j)`.
//!
//! At every moment the machine runs, among the released jobs with work left, one with the largest
//! tail, and switches when a job with a larger tail is released. This is optimal for the preemptive
//! problem (Jackson 1955; Horn 1974), so its value is a lower bound for the non-preemptive problem
//! and for any schedule that respects the heads and tails.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A job of the one-machine relaxation: released at `head`, `work` long, followed by `tail`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Job {
    /// Earliest start.
    pub head: f64,
    /// Machine time.
    pub work: f64,
    /// Time that must pass after it ends before the step can end.
    pub tail: f64,
}

/// A released job with work left, ordered by tail (then by index, for a deterministic run).
struct Ready {
    tail: f64,
    index: usize,
}

impl PartialEq for Ready {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ready {}

impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ready {
    fn cmp(&self, other: &Self) -> Ordering {
        self.tail
            .total_cmp(&other.tail)
            .then_with(|| other.index.cmp(&self.index))
    }
}

/// The optimum `max_j (C_j + q_j)` of Jackson's preemptive schedule of `jobs` (0 when empty).
/// `O(n log n)`.
///
/// It ends on any input: every turn of its loop either finishes a job or moves the clock to the
/// next release exactly (no `now += gap` that rounding could leave short), so it turns at most
/// twice per job; a NaN anywhere gives NaN at once.
pub(super) fn preemptive(jobs: &[Job]) -> f64 {
    if jobs
        .iter()
        .any(|j| j.head.is_nan() || j.work.is_nan() || j.tail.is_nan())
    {
        return f64::NAN;
    }
    let mut order: Vec<usize> = (0..jobs.len()).filter(|&j| jobs[j].work > 0.0).collect();
    order.sort_by(|&a, &b| jobs[a].head.total_cmp(&jobs[b].head));
    // Jobs without work still count: they end no earlier than their head.
    let mut best = jobs
        .iter()
        .filter(|j| j.work <= 0.0)
        .map(|j| j.head + j.tail)
        .fold(0.0, f64::max);
    let mut left: Vec<f64> = jobs.iter().map(|j| j.work).collect();
    let mut heap = BinaryHeap::new();
    let mut next = 0;
    let mut now = 0.0_f64;
    while next < order.len() || !heap.is_empty() {
        if heap.is_empty() {
            now = now.max(jobs[order[next]].head);
        }
        while next < order.len() && jobs[order[next]].head <= now {
            let index = order[next];
            heap.push(Ready {
                tail: jobs[index].tail,
                index,
            });
            next += 1;
        }
        let Some(top) = heap.pop() else { continue };
        match order.get(next).map(|&j| jobs[j].head) {
            // The next release comes first: run until it, exactly.
            Some(release) if left[top.index] > release - now => {
                left[top.index] -= release - now;
                now = release;
                heap.push(top);
            }
            _ => {
                now += left[top.index];
                left[top.index] = 0.0;
                best = best.max(now + top.tail);
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(head: f64, work: f64, tail: f64) -> Job {
        Job { head, work, tail }
    }

    #[test]
    fn one_job() {
        assert_eq!(preemptive(&[job(2.0, 3.0, 4.0)]), 9.0);
        assert_eq!(preemptive(&[]), 0.0);
    }

    #[test]
    fn largest_tail_first() {
        // Both at 0: the long tail goes first, 1 + 10; the other ends at 2 + 1.
        assert_eq!(preemptive(&[job(0.0, 1.0, 1.0), job(0.0, 1.0, 10.0)]), 11.0);
    }

    #[test]
    fn preempts_for_a_larger_tail() {
        // A (work 4, tail 0) from 0; B (work 1, tail 5) released at 1 preempts it: B ends at 2
        // (2 + 5 = 7), A at 5. Running A to the end first would give 5 + 1 + 5 = 11.
        assert_eq!(preemptive(&[job(0.0, 4.0, 0.0), job(1.0, 1.0, 5.0)]), 7.0);
    }

    #[test]
    fn huge_and_tiny_values_end() {
        // Values whose sums lose the small ones, and infinities: the loop still ends.
        let jobs = [
            job(0.0, 1e308, 1.0),
            job(1e-300, 1e-300, 1e308),
            job(1.0, 1.0, 0.0),
            job(f64::INFINITY, 1.0, 0.0),
        ];
        assert!(preemptive(&jobs) >= 1e308);
        let many: Vec<Job> = (0..1000)
            .map(|i| job(i as f64 * 1e-320, 1e300, 1e-300))
            .collect();
        assert!(preemptive(&many).is_finite());
        assert!(preemptive(&[job(f64::NAN, 1.0, 0.0)]).is_nan());
    }

    #[test]
    fn idle_until_a_release() {
        assert_eq!(preemptive(&[job(0.0, 1.0, 0.0), job(5.0, 1.0, 0.0)]), 6.0);
    }
}
