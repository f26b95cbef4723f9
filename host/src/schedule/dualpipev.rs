//! The `dualpipev` family: DualPipeV, the V-shape ("cut-in-half") variant of DeepSeek's DualPipe
//! (DeepSeek-V3 technical report; `dualpipev.py` of the deepseek-ai/DualPipe repository), in the
//! order PyTorch pipelining's `ScheduleDualPipeV` ports from it.
//!
//! Rank `r` of `P` holds two stages (`V = 2`): chunk 0 is stage `r`, chunk 1 is stage `2P-1-r`.
//! The steady state runs a forward of one chunk overlapped with a full backward of the other
//! ([`Item::Overlap`], so communication of one hides behind the computation of the other); the
//! ramps split backwards into `I` and `W` to fill bubbles. Rank `r` runs:
//! 1. `2(P-r-1)` forwards of chunk 0;
//! 2. `r+1` times: forward of chunk 0, forward of chunk 1;
//! 3. `P-r-1` times: `I` of chunk 1, its `W`, forward of chunk 1;
//! 4. `M - 2P + r + 1` times: forward of chunk 0 with backward of chunk 1 (overlapped, except the
//!    very first on the last rank, which runs them one after the other), then forward of chunk 1
//!    with backward of chunk 0 (overlapped);
//! 5. `P-r-1` times: backward of chunk 1, then forward of chunk 1 with backward of chunk 0;
//! 6. `r+1` times: backward of chunk 1, backward of chunk 0; from the middle of this phase on, the
//!    backwards are `I` only and their `W`s join a queue (odd ranks switch one backward earlier);
//! 7. `P-r-1` times: the oldest queued `W`, then a backward of chunk 0 (`I`, its `W` queued);
//! 8. `r+1` times: the oldest queued `W`.
//!
//! Needs `M >= 2P` (phase 4 would otherwise run a negative number of times); smaller `M` is
//! refused, as DeepSeek and PyTorch do. Memory: every rank holds `2P + 1` stage-microbatches
//! between `F` and the end of its backward at its peak (one more than ZB-V's `2P`).

use super::families::Family;
use super::zbv::{vshape, VRank};
use super::{Action, Item, Op, Params, Placement, Schedule, ScheduleError};
use std::collections::VecDeque;

/// The `dualpipev` family as [`FAMILIES`](super::families::FAMILIES) lists it: its name and
/// default `V` are written here only.
pub const FAMILY: Family = Family {
    name: "dualpipev",
    placement: Placement::Vshape,
    splits_iw: true,
    overlaps: true,
    default_chunks: 2,
    constraints: "V = 2; P >= 1, M >= 2P",
    summary: "DualPipeV on V-shape placement with overlapped F/B pairs",
    generate,
};

/// Generates a `dualpipev` schedule; refuses `P = 0`, `M = 0`, `V != 2` and `M < 2P`.
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    let v = p.checked(FAMILY.name, FAMILY.default_chunks, 2..=2)?;
    let (ranks, m) = (p.ranks, p.microbatches);
    if m < 2 * ranks {
        let fewer = match m / 2 {
            0 => String::new(),
            most => format!(", fewer ranks (P <= {most})"),
        };
        return Err(ScheduleError::refused(
            FAMILY.name,
            format!(
                "needs at least as many microbatches as stages: M >= 2P = {}, got M = {m}; \
                 use M >= {}{fewer}, or the `zbv` family, which takes any M",
                2 * ranks,
                2 * ranks,
            ),
        ));
    }
    let actions = (0..ranks).map(|r| rank_list(r, ranks, m)).collect();
    Ok(vshape(FAMILY.name, ranks, v, m, actions))
}

/// Rank `r`'s list (see the module documentation for the phases).
fn rank_list(r: usize, ranks: usize, m: usize) -> Vec<Item> {
    let mut q = Builder {
        rank: VRank::new(r, ranks, m),
        weights: VecDeque::new(),
    };
    let last = r + 1 == ranks;
    let down = ranks - r - 1;
    for _ in 0..2 * down {
        q.one(Op::F, 0);
    }
    for _ in 0..=r {
        q.one(Op::F, 0);
        q.one(Op::F, 1);
    }
    for _ in 0..down {
        q.one(Op::I, 1);
        q.weight();
        q.one(Op::F, 1);
    }
    for i in 0..m + r + 1 - 2 * ranks {
        if i == 0 && last {
            q.one(Op::F, 0);
            q.one(Op::B, 1);
        } else {
            q.rank.push_overlap(0, 1);
        }
        q.rank.push_overlap(1, 0);
    }
    for _ in 0..down {
        q.one(Op::B, 1);
        q.rank.push_overlap(1, 0);
    }
    let steps = r + 1;
    let half = steps / 2;
    let mut split = false;
    for i in 0..steps {
        split |= i == half && r % 2 == 1;
        q.one(if split { Op::I } else { Op::B }, 1);
        split |= i == half && r % 2 == 0;
        q.one(if split { Op::I } else { Op::B }, 0);
    }
    for _ in 0..down {
        q.weight();
        q.one(Op::I, 0);
    }
    for _ in 0..=r {
        q.weight();
    }
    q.rank.into_items()
}

/// [`VRank`] plus DualPipe's queue of deferred weight-gradient passes.
struct Builder {
    /// The list being built.
    rank: VRank,
    /// `I`s whose `W` has not run yet, oldest first.
    weights: VecDeque<Action>,
}

impl Builder {
    /// Appends the next `op` of `chunk`; an `I` queues its `W`.
    fn one(&mut self, op: Op, chunk: usize) {
        let a = self.rank.push(op, chunk);
        if op == Op::I {
            self.weights.push_back(a);
        }
    }

    /// Appends the oldest queued `W`, if any.
    fn weight(&mut self) {
        if let Some(i) = self.weights.pop_front() {
            self.rank.push_weight_of(i);
        }
    }
}
