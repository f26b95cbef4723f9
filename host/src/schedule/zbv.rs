//! The `zbv` family: ZB-V, the zero-bubble schedule on V-shape placement of "Zero Bubble Pipeline
//! Parallelism" (Qi et al., ICLR 2024, section 6), in the order of PyTorch pipelining's
//! `ScheduleZBVZeroBubble` (the handcrafted V schedule of the sail-sg zero-bubble repository).
//!
//! Rank `r` of `P` holds two stages (`V = 2`): chunk 0 is stage `r` (on the way down) and chunk 1 is
//! stage `2P-1-r` (on the way back up), so the first and last stages share rank 0. With
//! `n = max(M, 2P-1)` microbatches (the pipeline needs `2P-1` to fill), rank `r` runs:
//! 1. `2(P-r)-1` forwards of chunk 0;
//! 2. `r` times: forward of chunk 1, forward of chunk 0;
//! 3. `P-r` times: forward, `I`, `W` of chunk 1;
//! 4. steady, while chunk 0 has forwards left or chunk 1 lags behind it: forward of chunk 0 (while
//!    any are left), `I` and `W` of chunk 0, then forward, `I`, `W` of chunk 1;
//! 5. `r` times: `I` of chunk 0, `I` of chunk 1;
//! 6. `P-r` times: `I` of chunk 0 and the oldest outstanding `W` of chunk 0;
//! 7. the outstanding `W`s of chunk 1, then those of chunk 0.
//!
//! When `M < 2P-1` the schedule is built for `2P-1` microbatches and the actions of the missing
//! ones are dropped (as PyTorch does): the rest keeps its order, so it still runs, with bubbles.
//!
//! Memory: every rank holds at most `2 min(M, P)` stage-microbatches between `F` and `W`, i.e. at
//! most `min(M, P)` in full-stage units (a V-shape stage is half a 1F1B stage): 1F1B's peak (that
//! of its first rank). Bubble: with `F = I = W` and free communication every rank works without a
//! gap from its first action to its last once `M >= 2P-1`.

use super::families::Family;
use super::{Action, Item, Op, Params, Placement, Schedule, ScheduleError};

/// The `zbv` family as [`FAMILIES`](super::families::FAMILIES) lists it: its name and default
/// `V` are written here only.
pub const FAMILY: Family = Family {
    name: "zbv",
    placement: Placement::Vshape,
    splits_iw: true,
    overlaps: false,
    default_chunks: 2,
    constraints: "V = 2; P >= 1, M >= 1",
    summary: "ZB-V on V-shape placement",
    generate,
};

/// Generates a `zbv` schedule; refuses `P = 0`, `M = 0` and `V != 2`.
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    let v = p.checked(FAMILY.name, FAMILY.default_chunks, 2..=2)?;
    let actions = (0..p.ranks)
        .map(|r| rank_list(r, p.ranks, p.microbatches))
        .collect();
    Ok(vshape(FAMILY.name, p.ranks, v, p.microbatches, actions))
}

/// Rank `r`'s list (see the module documentation for the phases).
fn rank_list(r: usize, ranks: usize, m: usize) -> Vec<Item> {
    let n = m.max(2 * ranks - 1);
    let mut q = VRank::new(r, ranks, m);
    for _ in 0..2 * (ranks - r) - 1 {
        q.push(Op::F, 0);
    }
    for _ in 0..r {
        q.push(Op::F, 1);
        q.push(Op::F, 0);
    }
    for _ in 0..ranks - r {
        q.push_all(&[(Op::F, 1), (Op::I, 1), (Op::W, 1)]);
    }
    while q.count(Op::F, 1) < q.count(Op::F, 0) || q.count(Op::F, 0) < n {
        if q.count(Op::F, 0) < n {
            q.push(Op::F, 0);
        }
        q.push_all(&[(Op::I, 0), (Op::W, 0), (Op::F, 1), (Op::I, 1), (Op::W, 1)]);
    }
    for _ in 0..r {
        q.push_all(&[(Op::I, 0), (Op::I, 1)]);
    }
    for _ in 0..ranks - r {
        q.push_all(&[(Op::I, 0), (Op::W, 0)]);
    }
    for chunk in [1, 0] {
        while q.count(Op::W, chunk) < q.count(Op::I, chunk) {
            q.push(Op::W, chunk);
        }
    }
    q.into_items()
}

/// A V-shape schedule (`placement = vshape`).
pub(super) fn vshape(
    name: &str,
    ranks: usize,
    chunks: usize,
    microbatches: usize,
    actions: Vec<Vec<Item>>,
) -> Schedule {
    Schedule {
        name: name.to_string(),
        ranks,
        chunks,
        microbatches,
        placement: Placement::Vshape,
        actions,
    }
}

/// Builds one rank's list on V-shape placement, numbering microbatches as it goes: each
/// `(chunk, op)` takes its microbatches in order `0, 1, 2, ...`. Chunk 0 is stage `r`, chunk 1 is
/// stage `2P-1-r`. A full backward `B` takes the next microbatch of both `I` and `W` (it does both).
/// Actions on microbatches `>= m` are counted but not emitted (for schedules built for more
/// microbatches than exist). Shared with `dualpipev`.
pub(super) struct VRank {
    /// Global stage of chunk 0 and chunk 1.
    stages: [usize; 2],
    /// Per chunk, the next microbatch of `F`, of `I` (or `B`) and of `W`.
    next: [[usize; 3]; 2],
    /// Microbatches that exist.
    m: usize,
    /// The list so far.
    items: Vec<Item>,
}

impl VRank {
    /// An empty list for rank `r` of `ranks`, `m` microbatches.
    pub(super) fn new(r: usize, ranks: usize, m: usize) -> Self {
        VRank {
            stages: [r, 2 * ranks - 1 - r],
            next: [[0; 3]; 2],
            m,
            items: Vec::with_capacity(6 * m),
        }
    }

    /// How many `op`s of `chunk` have been numbered (`B` counts as `I`).
    pub(super) fn count(&self, op: Op, chunk: usize) -> usize {
        self.next[chunk][Self::slot(op)]
    }

    /// Numbers the next `op` of `chunk`, without emitting it.
    fn take(&mut self, op: Op, chunk: usize) -> Action {
        let k = self.count(op, chunk);
        self.next[chunk][Self::slot(op)] += 1;
        if op == Op::B {
            self.next[chunk][Self::slot(Op::W)] += 1;
        }
        Action::new(op, self.stages[chunk], k)
    }

    /// Appends the next `op` of `chunk` and returns it.
    pub(super) fn push(&mut self, op: Op, chunk: usize) -> Action {
        let a = self.take(op, chunk);
        self.emit(Item::One(a));
        a
    }

    /// Appends each `(op, chunk)` in turn.
    pub(super) fn push_all(&mut self, ops: &[(Op, usize)]) {
        for &(op, chunk) in ops {
            self.push(op, chunk);
        }
    }

    /// Appends a forward of `f_chunk` overlapped with a full backward `B` of `b_chunk`.
    pub(super) fn push_overlap(&mut self, f_chunk: usize, b_chunk: usize) {
        let forward = self.take(Op::F, f_chunk);
        let backward = self.take(Op::B, b_chunk);
        if forward.microbatch < self.m && backward.microbatch < self.m {
            self.items.push(Item::Overlap { forward, backward });
        } else {
            self.emit(Item::One(forward));
            self.emit(Item::One(backward));
        }
    }

    /// Appends the weight-gradient pass of an input-gradient pass `i` numbered earlier.
    pub(super) fn push_weight_of(&mut self, i: Action) {
        self.emit(Item::One(Action::new(Op::W, i.stage, i.microbatch)));
    }

    /// The finished list.
    pub(super) fn into_items(self) -> Vec<Item> {
        self.items
    }

    /// Appends `item` if its action's microbatch exists.
    fn emit(&mut self, item: Item) {
        if item.actions().all(|a| a.microbatch < self.m) {
            self.items.push(item);
        }
    }

    /// Counter index of `op`.
    fn slot(op: Op) -> usize {
        match op {
            Op::F => 0,
            Op::I | Op::B => 1,
            Op::W => 2,
        }
    }
}
