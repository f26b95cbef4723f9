//! The `v-min` family: V-Min, the V-shape schedule of "Pipeline Parallelism with Controllable
//! Memory" (Qi et al., 2024) that holds about a third of 1F1B's activation memory.
//!
//! Built on the unit grid of [`v_grid`](super::v_grid) (period 6 per microbatch). Rank `r` of `P`
//! takes microbatch 0's ops at
//!
//! | op | slot |
//! | --- | --- |
//! | forward, chunk 0 (stage `r`) | `r` |
//! | forward, chunk 1 (stage `2P-1-r`) | `2P-1-r` |
//! | input-gradient, chunk 1 | `2P + d + r` |
//! | input-gradient, chunk 0 | `4P + d - 1 - r` |
//!
//! with `d = 2` when `P` is a multiple of 3 and 0 otherwise. Each microbatch's chain runs without a
//! wait: the forward goes down the ranks one slot apart and comes back up, the gradient follows at
//! once (every dependency is exactly one slot earlier, on the neighbour rank or on the same rank
//! at the bottom of the V), so the activations of a microbatch stay on rank `r` for about `4P - 2r`
//! slots (chunk 0) and `2r + 1` (chunk 1): `4P / 6` chunk-microbatches in all, a third of 1F1B's `P`
//! rank-microbatches (a chunk counts half). The four slots differ modulo 6 (the odd differences
//! `2r + 1 - 2P`, and `2P + d` which `d` keeps off multiples of 6), so they never collide. The price
//! is bubble: the tight chain leaves free slots in warm-up and cool-down that the weight-gradient
//! passes and the grid's compaction only partly fill (the memory cap keeps forwards from moving
//! far).
//!
//! Valid for every `P >= 1`, `M >= 1`, `V = 2`; the memory saving shows once `M` is about `P` or more.

use super::families::Family;
use super::{Params, Placement, Schedule, ScheduleError};

/// The `v-min` family as [`FAMILIES`](super::families::FAMILIES) lists it.
pub const FAMILY: Family = Family {
    name: "v-min",
    placement: Placement::Vshape,
    splits_iw: true,
    overlaps: false,
    default_chunks: 2,
    constraints: "V = 2; P >= 1, M >= 1",
    summary: "V-Min: V-shape, about 1/3 of 1F1B's activation memory",
    generate,
};

/// Generates a `v-min` schedule; refuses `P = 0`, `M = 0` and `V != 2`.
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    super::v_grid::generate(&FAMILY, p, |n, r| {
        let d = if n % 3 == 0 { 2 } else { 0 };
        [r, 2 * n - 1 - r, 2 * n + d + r, 4 * n + d - 1 - r]
    })
}
