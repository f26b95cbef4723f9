//! The `1f1b` family: PipeDream-flush, Megatron's non-interleaved schedule (PyTorch's `Schedule1F1B`).
//!
//! Rank `r` of `P` runs `w = min(P - r - 1, M)` warm-up forwards, then alternates one forward and one
//! backward while forwards remain, then drains the remaining backwards; all in microbatch order.
//! So rank `r` holds at most `min(M, P - r)` activations. Works for every `M >= 1`, including `M < P`
//! (the warm-up is then all of `M`). `V = 1`.

use super::families::Family;
use super::{Action, Item, Op, Params, Placement, Schedule, ScheduleError};

/// The `1f1b` family as [`FAMILIES`](super::families::FAMILIES) lists it: its name and default
/// `V` are written here only.
pub const FAMILY: Family = Family {
    name: "1f1b",
    placement: Placement::Looped,
    splits_iw: false,
    overlaps: false,
    default_chunks: 1,
    constraints: "V = 1; P >= 1, M >= 1",
    summary: "one forward one backward, PipeDream-flush / Megatron non-interleaved",
    generate,
};

/// Generates a `1f1b` schedule; refuses `P = 0`, `M = 0` and `V != 1`.
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    let v = p.checked(FAMILY.name, FAMILY.default_chunks, 1..=1)?;
    let m = p.microbatches;
    let actions = (0..p.ranks).map(|r| rank_list(r, p.ranks, m)).collect();
    Ok(Schedule::looped(FAMILY.name, p.ranks, v, m, actions))
}

/// Rank `r`'s list: warm-up forwards, steady one-forward-one-backward, cool-down backwards.
fn rank_list(r: usize, ranks: usize, m: usize) -> Vec<Item> {
    let f = |k| Item::One(Action::new(Op::F, r, k));
    let b = |k| Item::One(Action::new(Op::B, r, k));
    let warmup = (ranks - r - 1).min(m);
    let steady = m - warmup;
    let mut list: Vec<Item> = (0..warmup).map(f).collect();
    for k in 0..steady {
        list.push(f(warmup + k));
        list.push(b(k));
    }
    list.extend((steady..m).map(b));
    list
}
