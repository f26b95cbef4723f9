//! Loss kernels that reduce: the MSE forward (per-block partial sums) and the softmax cross-entropy forward
//! and gradient (one thread per row, reusing the host's row functions).
//!
//! Grid: any 1-D grid of 1-D blocks of [`THREADS`] threads (grid-stride loops);
//! [`elementwise_grid`](crate::grid::elementwise_grid) of the element count (MSE) or of the row count
//! (cross-entropy) is the intended one. Results are written per block or per row, never with atomics, so
//! they do not depend on scheduling: the host adds the few partials (in `f64`) and divides.

use crate::grid::{Grid, THREADS};
use crate::loss::{softmax_ce_grad_row, softmax_ce_row};

/// MSE forward, partial sums: `partial[block] = sum (pred[i] - target[i])^2` over the elements this block
/// owns. The loss is `sum(partial) / n` (`partial` has one entry per block of the grid).
///
/// # Safety
/// `pred`, `target` valid for `n` floats, `partial` for `grid_dim().0` floats; blocks of [`THREADS`] threads.
pub unsafe fn mse_forward<G: Grid>(
    g: &G,
    pred: *const f32,
    target: *const f32,
    n: usize,
    partial: *mut f32,
) {
    if g.block_dim() != THREADS {
        g.trap();
    }
    let (mut i, stride) = g.global_1d();
    let mut sum = 0.0f32;
    while i < n {
        let d = pred.add(i).read() - target.add(i).read();
        sum += d * d;
        i += stride;
    }
    let total = block_sum(g, sum);
    if g.thread() == 0 {
        partial.add(g.block().0).write(total);
    }
}

/// The sum of `value` over the block's threads, valid in thread 0 (a shared-memory tree reduction).
#[inline(always)]
unsafe fn block_sum<G: Grid>(g: &G, value: f32) -> f32 {
    let (smem, tid) = (g.shared(), g.thread());
    smem.add(tid).write(value);
    g.sync_threads();
    let mut half = THREADS / 2;
    while half > 0 {
        if tid < half {
            smem.add(tid)
                .write(smem.add(tid).read() + smem.add(tid + half).read());
        }
        g.sync_threads();
        half /= 2;
    }
    smem.read()
}

/// Softmax cross-entropy forward: `row_loss[r] = -log softmax(logits[r])[targets[r]]` for `r < rows`
/// (NaN for a target outside `0..classes`). The mean loss is `sum(row_loss) / rows`.
///
/// # Safety
/// `logits` valid for `rows * classes` floats, `targets` and `row_loss` for `rows`; `classes > 0`.
pub unsafe fn softmax_ce_forward<G: Grid>(
    g: &G,
    logits: *const f32,
    targets: *const u32,
    rows: usize,
    classes: usize,
    row_loss: *mut f32,
) {
    let (mut r, stride) = g.global_1d();
    while r < rows {
        let t = targets.add(r).read() as usize;
        let loss = if t < classes {
            softmax_ce_row(
                core::slice::from_raw_parts(logits.add(r * classes), classes),
                t,
            )
        } else {
            f32::NAN
        };
        row_loss.add(r).write(loss);
        r += stride;
    }
}

/// Softmax cross-entropy gradient: `grad[r][j] = scale (softmax(logits[r])[j] - [j == targets[r]])` for
/// `r < rows` (`scale` is `1 / norm`, the rows the loss is a mean over); a row whose target is outside
/// `0..classes` gets NaN.
///
/// # Safety
/// `logits` and `grad` valid for `rows * classes` floats and not overlapping, `targets` for `rows`;
/// `classes > 0`.
pub unsafe fn softmax_ce_grad<G: Grid>(
    g: &G,
    logits: *const f32,
    targets: *const u32,
    grad: *mut f32,
    rows: usize,
    classes: usize,
    scale: f32,
) {
    let (mut r, stride) = g.global_1d();
    while r < rows {
        let t = targets.add(r).read() as usize;
        let out = core::slice::from_raw_parts_mut(grad.add(r * classes), classes);
        if t < classes {
            softmax_ce_grad_row(
                core::slice::from_raw_parts(logits.add(r * classes), classes),
                t,
                scale,
                out,
            );
        } else {
            out.fill(f32::NAN);
        }
        r += stride;
    }
}
