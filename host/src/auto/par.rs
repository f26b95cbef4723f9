//! Independent constructions on the machine's cores, results in input order.
//!
//! The constructive phases build dozens of schedules that do not depend on each other (the list
//! rules, the zero-bubble greedy's flags, the V-shape settings under each budget of the ladder) and
//! score each by simulation. [`map_ordered`] runs such a batch on up to
//! [`std::thread::available_parallelism`] threads and returns the results in input order, so every
//! later step (offering, deduplicating, the first error) sees exactly what a sequential loop saw:
//! the schedule `auto` returns does not depend on the number of cores, only the wall time does.

use std::thread;

/// The most threads one batch uses.
const MAX_THREADS: usize = 8;

/// `f` applied to every item, on up to [`MAX_THREADS`] threads (at most the machine's cores); the
/// results in the items' order. Item `i` goes to thread `i mod threads`, so which thread runs what
/// is fixed, and a batch of one item (or a one-core machine) runs on the calling thread.
pub(crate) fn map_ordered<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(MAX_THREADS).min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let f = &f;
    let parts: Vec<Vec<(usize, R)>> = thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (t..items.len())
                        .step_by(threads)
                        .map(|i| (i, f(&items[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut slots: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    for (i, r) in parts.into_iter().flatten() {
        slots[i] = Some(r);
    }
    slots.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_input_order() {
        let items: Vec<u64> = (0..37).collect();
        let out = map_ordered(&items, |&x| x * x + 1);
        assert_eq!(out, items.iter().map(|x| x * x + 1).collect::<Vec<_>>());
        assert!(map_ordered(&[] as &[u64], |&x| x).is_empty());
    }
}
