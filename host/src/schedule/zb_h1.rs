//! The `zb-h1` family: the handcrafted ZB-H1 schedule of "Zero Bubble Pipeline Parallelism"
//! (Qi et al., ICLR 2024, section 2.1, figure 3 top).
//!
//! ZB-H1 splits each backward into `I` (input gradient, on the critical path) and `W` (weight
//! gradient, deferrable) and keeps 1F1B's rhythm, but starts the `W`s late so that the `I`s travel
//! up the pipeline sooner and the deferred `W`s fill the tail that 1F1B leaves idle.
//!
//! In steady state rank `r` of `P` repeats the triple `F(x), I(x - (P-1-r)), W(x - (P-1))`: the
//! input-gradient lag shrinks by one per rank towards the last one (as in 1F1B), while the
//! weight-gradient lag is `P - 1` on every rank. Reading the triple for `x = 0, 1, ..., M+P-2` and
//! dropping the microbatches outside `0..M` gives the whole list, warm-up and cool-down included:
//! `P-1-r` lone forwards, `r` pairs `F, I`, the steady triples, `P-1-r` pairs `I, W`, and `r` lone
//! `W`s. This is the paper's figure, and the same order PyTorch's `ScheduleInterleavedZeroBubble`
//! (ZB1P) produces with one stage per rank.
//!
//! Memory: the first rank holds at most `min(M, P)` microbatches between `F` and `W`, exactly 1F1B's
//! peak; every other rank holds the same number (the paper: "all pipeline stages have the same
//! number of in-flight microbatches"), so rank `r > 0` holds more than 1F1B's `P - r`, but partly
//! consumed ones (after `I` only the `W` inputs remain). Bubble with `B = I + W` and free
//! communication: `(P-1)(F + I - W)` per rank, a third of 1F1B's when `F = I = W` (needs `M >= P`).
//!
//! Valid for every `M >= 1`: a rank's triple for slot `x` only waits on slots before `x` on other
//! ranks, or on forwards of the same slot upstream, so the dry run never stalls. `V = 1`.

use super::families::Family;
use super::{Action, Item, Op, Params, Placement, Schedule, ScheduleError};

/// The `zb-h1` family as [`FAMILIES`](super::families::FAMILIES) lists it: its name and default
/// `V` are written here only.
pub const FAMILY: Family = Family {
    name: "zb-h1",
    placement: Placement::Looped,
    splits_iw: true,
    overlaps: false,
    default_chunks: 1,
    constraints: "V = 1; P >= 1, M >= 1",
    summary: "handcrafted zero-bubble, 1F1B's peak memory",
    generate,
};

/// Generates a `zb-h1` schedule; refuses `P = 0`, `M = 0` and `V != 1`.
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    generate_lagged(&FAMILY, p, 1)
}

/// A handcrafted zero-bubble schedule of `family` (`V = 1`): rank `r` lags its `I`s by
/// `stretch * (P - 1 - r)` slots and its `W`s by `stretch * (P - 1)` ([`lagged_rank_list`]).
/// `zb-h1` is `stretch = 1`; `zb-h2` doubles both lags.
pub(super) fn generate_lagged(
    family: &Family,
    p: &Params,
    stretch: usize,
) -> Result<Schedule, ScheduleError> {
    let v = p.checked(family.name, family.default_chunks, 1..=1)?;
    let last = p.ranks - 1;
    let actions = (0..p.ranks)
        .map(|r| lagged_rank_list(r, p.microbatches, stretch * (last - r), stretch * last))
        .collect();
    Ok(Schedule::looped(
        family.name,
        p.ranks,
        v,
        p.microbatches,
        actions,
    ))
}

/// The list of rank `r` (stage `r`, `V = 1`) of a handcrafted zero-bubble schedule: for each slot
/// `x` in order, `F(x)`, then `I(x - i_lag)`, then `W(x - w_lag)`, each only if its microbatch is in
/// `0..m`. Needs `i_lag <= w_lag`. Shared with `zb-h2`, which doubles both lags.
pub(super) fn lagged_rank_list(r: usize, m: usize, i_lag: usize, w_lag: usize) -> Vec<Item> {
    let mut list = Vec::with_capacity(3 * m);
    for x in 0..m + w_lag {
        let slot = [
            (Op::F, Some(x)),
            (Op::I, x.checked_sub(i_lag)),
            (Op::W, x.checked_sub(w_lag)),
        ];
        for (op, k) in slot {
            if let Some(k) = k.filter(|&k| k < m) {
                list.push(Item::One(Action::new(op, r, k)));
            }
        }
    }
    list
}
