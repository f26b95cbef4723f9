//! The `zb-h2` family: the handcrafted ZB-H2 schedule of "Zero Bubble Pipeline Parallelism"
//! (Qi et al., ICLR 2024, section 2.2, figure 3 bottom).
//!
//! ZB-H2 trades memory for the last bubble: it runs extra forwards in the warm-up to fill the idle
//! time before the first input gradient arrives, and pushes the weight gradients of the last ranks
//! to the tail, so the schedule becomes a parallelogram instead of a trapezoid.
//!
//! In steady state rank `r` of `P` repeats the triple `F(x), I(x - 2(P-1-r)), W(x - 2(P-1))`: both
//! lags are twice ZB-H1's. Reading it for `x = 0, ..., M + 2P - 3` and dropping microbatches outside
//! `0..M` gives the whole list: `2(P-1-r)` lone forwards, `2r` pairs `F, I`, the steady triples,
//! `2(P-1-r)` pairs `I, W`, and `2r` lone `W`s.
//!
//! Memory: every rank holds at most `min(M, 2P - 1)` microbatches between `F` and `W` (the first rank
//! at the start, the last rank at the end). Bubble: with `F = I = W` and free communication, every
//! rank works without a gap from its first action to its last once `M >= 2P - 1`; the only idle
//! time left is the `r` slots before rank `r` can start and the `P-1-r` slots after it finishes,
//! which the paper overlaps with the neighbouring iterations (its optimizer post-validation). With
//! `M < 2P - 1` the warm-up cannot be filled: the schedule is still valid and generated (it is
//! correct, only slower), but it has gaps and can take longer than `zb-h1` (unit times, `P = 4`,
//! `M = 4`: 16 slots against 15), so prefer `zb-h1` there. `V = 1`.

use super::families::Family;
use super::zb_h1::generate_lagged;
use super::{Params, Placement, Schedule, ScheduleError};

/// The `zb-h2` family as [`FAMILIES`](super::families::FAMILIES) lists it: its name and default
/// `V` are written here only.
pub const FAMILY: Family = Family {
    name: "zb-h2",
    placement: Placement::Looped,
    splits_iw: true,
    overlaps: false,
    default_chunks: 1,
    constraints: "V = 1; P >= 1, M >= 1 (no bubble with F = I = W needs M >= 2P-1)",
    summary: "handcrafted zero-bubble, up to 2P-1 in flight, no bubble when F = I = W",
    generate,
};

/// Generates a `zb-h2` schedule; refuses `P = 0`, `M = 0` and `V != 1`.
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    generate_lagged(&FAMILY, p, 2)
}
