//! The `v-half` family: V-Half, the V-shape schedule of "Pipeline Parallelism with Controllable
//! Memory" (Qi et al., 2024) that holds about half of 1F1B's activation memory.
//!
//! Built on the unit grid of [`v_grid`](super::v_grid) (period 6 per microbatch). Rank `r` of `P`
//! takes microbatch 0's ops at
//!
//! | op | slot |
//! | --- | --- |
//! | forward, chunk 0 (stage `r`) | `2r` |
//! | forward, chunk 1 (stage `2P-1-r`) | `3P-2-r` |
//! | input-gradient, chunk 1 | `3P + d - 1 + 2r` |
//! | input-gradient, chunk 0 | `6P + d - 2 - r` |
//!
//! with `d = 3` when `P` is even and 0 otherwise. Chunk 0's forward goes down the ranks two slots
//! apart and chunk 1's gradient (stage `2P-1` first) too, while chunk 1's forward and chunk 0's
//! gradient come back one slot apart: every dependency is one or two slots earlier. A microbatch's activations stay on rank `r` for about
//! `6P - 3r` slots (chunk 0) and `3r` (chunk 1): `6P / 6 = P` chunk-microbatches, half of 1F1B's `P`
//! rank-microbatches (a chunk counts half). The slack of one slot per rank on the way down and up
//! leaves room for the weight-gradient passes, so the bubble is smaller than V-Min's. The four
//! slots differ modulo 6 (their differences are `2 mod 3`, `1 mod 3`, or `3P + d` which `d` keeps
//! off multiples of 6).
//!
//! Valid for every `P >= 1`, `M >= 1`, `V = 2`; the memory saving shows once `M` is about `P` or more.

use super::families::Family;
use super::{Params, Placement, Schedule, ScheduleError};

/// The `v-half` family as [`FAMILIES`](super::families::FAMILIES) lists it.
pub const FAMILY: Family = Family {
    name: "v-half",
    placement: Placement::Vshape,
    splits_iw: true,
    overlaps: false,
    default_chunks: 2,
    constraints: "V = 2; P >= 1, M >= 1",
    summary: "V-Half: V-shape, about 1/2 of 1F1B's activation memory",
    generate,
};

/// Generates a `v-half` schedule; refuses `P = 0`, `M = 0` and `V != 2`.
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    super::v_grid::generate(&FAMILY, p, |n, r| {
        let d = if n % 2 == 0 { 3 } else { 0 };
        [
            2 * r,
            3 * n - 2 - r,
            3 * n + d - 1 + 2 * r,
            6 * n + d - 2 - r,
        ]
    })
}
