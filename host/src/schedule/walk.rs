//! The one "advance every rank until it is stuck" walk.
//!
//! Four readers of a schedule run its ranks' lists against each other: the validator's dry run
//! (one slot per item), the stream program's builder (which emits device operations in an order
//! every stream can honour), the simulator's per-rank mode (times under a cost model) and its
//! shared-device mode (which starts, at one instant, everything that can start). Each decides for
//! itself when an item can run and what running it records; the walk around that decision is the
//! same and lives here:
//!
//! - every rank starts runnable; a runnable rank is advanced as far as it can go
//!   ([`Walk::advance`]), which either reaches the end of its list or stops at an item that waits
//!   for something (its *wanted* value);
//! - a rank that stopped sleeps until what it waits for is done: whoever completes it calls
//!   [`Waker::wake`] (exactly that wanted value) or [`Waker::nudge`] (anything);
//! - the walk ends when no rank is runnable. The ranks that still wait are the deadlock (the walk
//!   returns them with their position and what they wait for), or, for the shared-device mode, the
//!   ranks that wait for a later instant.
//!
//! The order in which runnable ranks are taken does not change any reader's result: an item's
//! outcome depends only on what it waits for and on its rank's previous item.
//!
//! ```
//! use pipefill_host::schedule::walk::{walk, Walk, Waker};
//!
//! // Two ranks: rank 1's only item waits for rank 0's first item.
//! struct Two { done: bool }
//! impl Walk for Two {
//!     type Wanted = ();
//!     fn advance(&mut self, rank: usize, pos: &mut usize, waker: &mut Waker<()>) -> Option<()> {
//!         match (rank, *pos) {
//!             (0, 0) => { self.done = true; *pos = 1; waker.wake(1, ()); None }
//!             (1, 0) if !self.done => Some(()),
//!             (1, 0) => { *pos = 1; None }
//!             _ => None,
//!         }
//!     }
//! }
//! let mut pos = vec![0, 0];
//! assert!(walk(&mut Two { done: false }, &mut pos).is_empty());
//! assert_eq!(pos, [1, 1]);
//! ```

/// The ranks that sleep and the ranks that may run, for one walk.
#[derive(Debug)]
pub struct Waker<W> {
    /// Per rank, what it waits for (`None`: runnable or done).
    blocked: Vec<Option<W>>,
    /// Runnable ranks, taken last in, first out.
    ready: Vec<usize>,
}

impl<W: Copy + PartialEq> Waker<W> {
    /// Makes `rank` runnable again if it waits for exactly `wanted`.
    #[inline(always)]
    pub fn wake(&mut self, rank: usize, wanted: W) {
        if let Some(slot) = self.blocked.get_mut(rank) {
            if *slot == Some(wanted) {
                *slot = None;
                self.ready.push(rank);
            }
        }
    }

    /// Makes `rank` runnable again if it waits for anything (it re-checks what it needs).
    #[inline]
    pub fn nudge(&mut self, rank: usize) {
        if let Some(slot) = self.blocked.get_mut(rank) {
            if slot.take().is_some() {
                self.ready.push(rank);
            }
        }
    }

    /// What `rank` waits for now, if it sleeps.
    pub fn waiting_for(&self, rank: usize) -> Option<W> {
        self.blocked.get(rank).copied().flatten()
    }
}

/// One reader's rule for running a rank's items.
pub trait Walk {
    /// What a rank can wait for (compared by [`Waker::wake`]).
    type Wanted: Copy + PartialEq;

    /// Runs `rank`'s items from `*pos` as far as they can go, moving `*pos` past each item run
    /// and waking (through `waker`) the ranks its items complete something for. Returns what the
    /// next item waits for, or `None` when the rank has nothing more to run.
    fn advance(
        &mut self,
        rank: usize,
        pos: &mut usize,
        waker: &mut Waker<Self::Wanted>,
    ) -> Option<Self::Wanted>;
}

/// A rank left waiting when no rank could run any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stuck<W> {
    /// The rank.
    pub rank: usize,
    /// The position of its next item.
    pub pos: usize,
    /// What that item waits for.
    pub wanted: W,
}

/// Advances every rank (from its position in `pos`, one per rank) until none can run; returns the
/// ranks still waiting, in rank order (empty when every rank ran its whole list).
pub fn walk<K: Walk>(reader: &mut K, pos: &mut [usize]) -> Vec<Stuck<K::Wanted>> {
    let ranks = pos.len();
    let mut waker = Waker {
        blocked: vec![None; ranks],
        ready: (0..ranks).rev().collect(),
    };
    while let Some(rank) = waker.ready.pop() {
        waker.blocked[rank] = reader.advance(rank, &mut pos[rank], &mut waker);
    }
    waker
        .blocked
        .iter()
        .enumerate()
        .filter_map(|(rank, w)| {
            w.map(|wanted| Stuck {
                rank,
                pos: pos[rank],
                wanted,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain: rank `r`'s item `i` needs rank `r - 1`'s item `i` (rank 0 needs nothing), with
    /// `cycle` making rank 0's item 1 also wait for the last rank's item 0.
    struct Chain {
        ranks: usize,
        items: usize,
        done: Vec<Vec<bool>>,
        cycle: bool,
    }

    impl Walk for Chain {
        type Wanted = (usize, usize);
        fn advance(
            &mut self,
            r: usize,
            pos: &mut usize,
            waker: &mut Waker<(usize, usize)>,
        ) -> Option<(usize, usize)> {
            while *pos < self.items {
                let i = *pos;
                if r > 0 && !self.done[r - 1][i] {
                    return Some((r - 1, i));
                }
                if r == 0 && self.cycle && i == 1 && !self.done[self.ranks - 1][1] {
                    return Some((self.ranks - 1, 1));
                }
                self.done[r][i] = true;
                *pos += 1;
                if r + 1 < self.ranks {
                    waker.wake(r + 1, (r, i));
                }
                if r + 1 == self.ranks {
                    waker.wake(0, (r, i));
                }
            }
            None
        }
    }

    fn chain(ranks: usize, items: usize, cycle: bool) -> (Vec<Stuck<(usize, usize)>>, Vec<usize>) {
        let mut c = Chain {
            ranks,
            items,
            done: vec![vec![false; items]; ranks],
            cycle,
        };
        let mut pos = vec![0; ranks];
        let stuck = walk(&mut c, &mut pos);
        (stuck, pos)
    }

    #[test]
    fn a_chain_runs_to_the_end() {
        let (stuck, pos) = chain(4, 5, false);
        assert!(stuck.is_empty());
        assert_eq!(pos, vec![5; 4]);
    }

    #[test]
    fn a_cycle_is_reported_with_every_waiting_rank() {
        // Rank 0 waits at item 1 for rank 3's item 1, which waits down the chain for rank 0's.
        let (stuck, pos) = chain(4, 3, true);
        assert_eq!(pos, vec![1; 4]);
        assert_eq!(
            stuck,
            vec![
                Stuck {
                    rank: 0,
                    pos: 1,
                    wanted: (3, 1)
                },
                Stuck {
                    rank: 1,
                    pos: 1,
                    wanted: (0, 1)
                },
                Stuck {
                    rank: 2,
                    pos: 1,
                    wanted: (1, 1)
                },
                Stuck {
                    rank: 3,
                    pos: 1,
                    wanted: (2, 1)
                },
            ]
        );
    }

    #[test]
    fn nudge_wakes_whatever_a_rank_waits_for_and_wake_only_its_value() {
        let mut w = Waker {
            blocked: vec![Some(1u8), Some(2u8), None],
            ready: Vec::new(),
        };
        w.wake(0, 2);
        assert_eq!(w.waiting_for(0), Some(1));
        w.wake(0, 1);
        w.nudge(1);
        w.nudge(2);
        w.wake(7, 1);
        assert_eq!(w.ready, vec![0, 1]);
        assert_eq!((w.waiting_for(0), w.waiting_for(1)), (None, None));
    }
}
