//! Elementwise kernels: activation forward/backward, the MSE gradient and the optimizer updates.
//!
//! Grid: any 1-D grid of 1-D blocks (the bodies loop with a grid stride);
//! [`elementwise_grid`](crate::grid::elementwise_grid)`(n)` is the intended one. Each element is computed
//! by the same scalar function the host path uses.

use crate::activation::Activation;
use crate::grid::Grid;
use crate::loss::mse_grad_element;
use crate::optim::{AdamWStep, SgdMomentum};

/// Calls `f(i)` for every `i < n` this thread owns in a grid-stride loop.
#[inline(always)]
fn grid_stride<G: Grid>(g: &G, n: usize, mut f: impl FnMut(usize)) {
    let (mut i, stride) = g.global_1d();
    while i < n {
        f(i);
        i += stride;
    }
}

/// `y[i] = act(z[i])` for `i < n`.
///
/// # Safety
/// `z` and `y` valid for `n` floats (they may be the same buffer).
pub unsafe fn activation_forward<G: Grid>(
    g: &G,
    z: *const f32,
    y: *mut f32,
    n: usize,
    act: Activation,
) {
    grid_stride(g, n, |i| y.add(i).write(act.forward(z.add(i).read())));
}

/// `dz[i] = dy[i] act'(z[i])` for `i < n`.
///
/// # Safety
/// All three valid for `n` floats (`dz` may be `dy`).
pub unsafe fn activation_backward<G: Grid>(
    g: &G,
    dy: *const f32,
    z: *const f32,
    dz: *mut f32,
    n: usize,
    act: Activation,
) {
    grid_stride(g, n, |i| {
        dz.add(i)
            .write(dy.add(i).read() * act.derivative(z.add(i).read()))
    });
}

/// `grad[i] = 2 (pred[i] - target[i]) inv_norm` for `i < n` (the MSE as a mean over `1 / inv_norm` items).
///
/// # Safety
/// All three valid for `n` floats.
pub unsafe fn mse_grad<G: Grid>(
    g: &G,
    pred: *const f32,
    target: *const f32,
    grad: *mut f32,
    n: usize,
    inv_norm: f32,
) {
    grid_stride(g, n, |i| {
        grad.add(i).write(mse_grad_element(
            pred.add(i).read(),
            target.add(i).read(),
            inv_norm,
        ));
    });
}

/// SGD with momentum over `n` parameters: updates `p` and the velocity `v` in place from `grad`.
///
/// # Safety
/// All three valid for `n` floats, `grad` not overlapping the others.
pub unsafe fn sgd_momentum<G: Grid>(
    g: &G,
    p: *mut f32,
    grad: *const f32,
    v: *mut f32,
    n: usize,
    opt: &SgdMomentum,
) {
    grid_stride(g, n, |i| {
        let (np, nv) = opt.update(p.add(i).read(), grad.add(i).read(), v.add(i).read());
        p.add(i).write(np);
        v.add(i).write(nv);
    });
}

/// One AdamW step over `n` parameters: updates `p` and the moments `m`, `v` in place from `grad`.
///
/// # Safety
/// All four valid for `n` floats, `grad` not overlapping the others.
pub unsafe fn adamw<G: Grid>(
    g: &G,
    p: *mut f32,
    grad: *const f32,
    m: *mut f32,
    v: *mut f32,
    n: usize,
    step: &AdamWStep,
) {
    grid_stride(g, n, |i| {
        let (np, nm, nv) = step.update(
            p.add(i).read(),
            grad.add(i).read(),
            m.add(i).read(),
            v.add(i).read(),
        );
        p.add(i).write(np);
        m.add(i).write(nm);
        v.add(i).write(nv);
    });
}
