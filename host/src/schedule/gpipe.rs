//! The `gpipe` family (GPipe, Huang et al. 2019): every rank runs all its forwards, then all its
//! backwards, both in microbatch order (as PyTorch pipelining's `ScheduleGPipe`). `V = 1`.
//! Every rank holds all `M` activations at its peak.

use super::families::Family;
use super::{Action, Item, Op, Params, Placement, Schedule, ScheduleError};

/// The `gpipe` family as [`FAMILIES`](super::families::FAMILIES) lists it: its name and default
/// `V` are written here only.
pub const FAMILY: Family = Family {
    name: "gpipe",
    placement: Placement::Looped,
    splits_iw: false,
    overlaps: false,
    default_chunks: 1,
    constraints: "V = 1; P >= 1, M >= 1",
    summary: "all forwards, then all backwards (GPipe)",
    generate,
};

/// Generates a `gpipe` schedule; refuses `P = 0`, `M = 0` and `V != 1`.
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    let v = p.checked(FAMILY.name, FAMILY.default_chunks, 1..=1)?;
    let m = p.microbatches;
    let actions = (0..p.ranks)
        .map(|r| {
            let fwd = (0..m).map(|k| Item::One(Action::new(Op::F, r, k)));
            let bwd = (0..m).map(|k| Item::One(Action::new(Op::B, r, k)));
            fwd.chain(bwd).collect()
        })
        .collect();
    Ok(Schedule::looped(FAMILY.name, p.ranks, v, m, actions))
}
