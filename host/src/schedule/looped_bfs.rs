//! The `looped-bfs` family: the breadth-first looped schedule (Lamy-Poirier 2023, "Breadth-First
//! Pipeline Parallelism"; PyTorch pipelining's `ScheduleLoopedBFS`).
//!
//! Looped placement (rank `r` holds stages `r, r+P, r+2P, ...`). Each rank runs every microbatch through
//! its first local stage, then through its second, and so on; then the backwards local stage by local
//! stage from the last, each in reverse microbatch order (as PyTorch does, so the last microbatch's
//! gradient, the first to arrive, is used first). Every rank holds all `V * M` activations at its
//! peak. `V >= 1`.

use super::families::Family;
use super::{Action, Item, Op, Params, Placement, Schedule, ScheduleError};

/// The `looped-bfs` family as [`FAMILIES`](super::families::FAMILIES) lists it: its name and default
/// `V` are written here only.
pub const FAMILY: Family = Family {
    name: "looped-bfs",
    placement: Placement::Looped,
    splits_iw: false,
    overlaps: false,
    default_chunks: 2,
    constraints: "V >= 1; P >= 1, M >= 1",
    summary:
        "breadth-first looped schedule: every microbatch through a local stage before the next",
    generate,
};

/// Generates a `looped-bfs` schedule; refuses `P = 0`, `M = 0` and `V = 0`.
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    let v = p.checked(FAMILY.name, FAMILY.default_chunks, 1..=usize::MAX)?;
    let (ranks, m) = (p.ranks, p.microbatches);
    let actions = (0..ranks)
        .map(|r| {
            let stages: Vec<usize> = (0..v).map(|c| c * ranks + r).collect();
            let fwd = stages
                .iter()
                .flat_map(|&s| (0..m).map(move |k| Item::One(Action::new(Op::F, s, k))));
            let bwd = stages.iter().rev().flat_map(|&s| {
                (0..m)
                    .rev()
                    .map(move |k| Item::One(Action::new(Op::B, s, k)))
            });
            fwd.chain(bwd).collect()
        })
        .collect();
    Ok(Schedule::looped(FAMILY.name, ranks, v, m, actions))
}
