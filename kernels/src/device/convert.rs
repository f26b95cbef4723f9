//! Conversions between `f32` and BF16 buffers, for the BF16 tensor-core kernels: a layer whose buffers
//! are `f32` converts its operands to BF16 before a BF16 GEMM and its results back after it.
//!
//! Grid: any 1-D grid of 1-D blocks (grid-stride loops); [`elementwise_grid`](crate::grid::elementwise_grid)
//! `(n)` is the intended one. Each element is converted by the host's scalar functions
//! ([`f32_to_bf16`], [`bf16_to_f32`]): round to nearest, ties to even, NaN kept; BF16 to `f32` is exact.

use crate::grid::Grid;
use crate::tc::convert::{bf16_to_f32, f32_to_bf16};

/// Calls `f(i)` for every `i < n` this thread owns in a grid-stride loop.
#[inline(always)]
fn grid_stride<G: Grid>(g: &G, n: usize, mut f: impl FnMut(usize)) {
    let (mut i, stride) = g.global_1d();
    while i < n {
        f(i);
        i += stride;
    }
}

/// `y[i] = bf16(x[i])` for `i < n` (BF16 bits in `y`).
///
/// # Safety
/// `x` valid for `n` floats, `y` for `n` `u16`s, not overlapping.
pub unsafe fn f32_to_bf16_kernel<G: Grid>(g: &G, x: *const f32, y: *mut u16, n: usize) {
    grid_stride(g, n, |i| y.add(i).write(f32_to_bf16(x.add(i).read())));
}

/// `y[i] = f32(x[i])` for `i < n` (exact).
///
/// # Safety
/// `x` valid for `n` `u16`s, `y` for `n` floats, not overlapping.
pub unsafe fn bf16_to_f32_kernel<G: Grid>(g: &G, x: *const u16, y: *mut f32, n: usize) {
    grid_stride(g, n, |i| y.add(i).write(bf16_to_f32(x.add(i).read())));
}

/// The host reference: `x` rounded to BF16 bits.
pub fn to_bf16(x: &[f32]) -> impl Iterator<Item = u16> + '_ {
    x.iter().map(|&v| f32_to_bf16(v))
}
