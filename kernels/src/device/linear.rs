//! The three GEMM kernels of a linear layer `Y = act(X W + b)` (`X`: `rows x inputs`, `W`: `inputs x outputs`):
//! the forward with the fused bias + activation epilogue, the backward for inputs (I) with
//! `dZ = dY act'(Z)` fused into `dX = dZ W^T`, and the backward for weights (W), `dW += X^T dZ` with
//! `db += colsum(dZ)` fused.
//!
//! All three use the tiling of [`crate::tile`]: a grid of [`gemm_grid`](crate::grid::gemm_grid)`(m, n)`
//! blocks of [`THREADS`] threads, where `m x n` is the output (`rows x outputs`, `rows x inputs`,
//! `inputs x outputs` respectively). Any sizes work, none needs to be a multiple of the tile.

use crate::activation::Activation;
use crate::epilogue::epilogue;
use crate::grid::{Grid, THREADS};
use crate::tile::{
    b_column_sum, for_each_output, load_tiles, multiply_tiles, Accumulators, TileOrigin, BK, BM, BN,
};

/// Arguments of [`linear_forward`].
#[derive(Clone, Copy, Debug)]
pub struct LinearForward {
    /// `X`, `rows x inputs`.
    pub x: *const f32,
    /// `W`, `inputs x outputs`.
    pub w: *const f32,
    /// `b`, `outputs`.
    pub b: *const f32,
    /// Output `Y = act(X W + b)`, `rows x outputs`.
    pub y: *mut f32,
    /// Optional output `Z = X W + b`, `rows x outputs` (null: not stored; backward needs it unless the
    /// activation is `Identity`).
    pub z: *mut f32,
    /// Rows of `X` (the microbatch size).
    pub rows: usize,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
    /// The fused activation.
    pub act: Activation,
}

/// Arguments of [`linear_backward_input`].
#[derive(Clone, Copy, Debug)]
pub struct LinearBackwardInput {
    /// `dY`, `rows x outputs`.
    pub dy: *const f32,
    /// The forward's `Z`, `rows x outputs`; may be null only when `act` is `Identity`.
    pub z: *const f32,
    /// `W`, `inputs x outputs`.
    pub w: *const f32,
    /// Output `dX = dZ W^T`, `rows x inputs` (overwritten).
    pub dx: *mut f32,
    /// Optional output `dZ = dY act'(Z)`, `rows x outputs`, for the W pass (null: not stored).
    pub dz: *mut f32,
    /// Rows (the microbatch size).
    pub rows: usize,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
    /// The activation of the forward.
    pub act: Activation,
}

/// Arguments of [`linear_backward_weight`].
#[derive(Clone, Copy, Debug)]
pub struct LinearBackwardWeight {
    /// `X`, `rows x inputs`.
    pub x: *const f32,
    /// `dZ`, `rows x outputs` (as stored by [`linear_backward_input`]).
    pub dz: *const f32,
    /// `dW`, `inputs x outputs`, accumulated into (`dW += X^T dZ`).
    pub dw: *mut f32,
    /// Optional `db`, `outputs`, accumulated into (`db += colsum(dZ)`; null: skipped).
    pub db: *mut f32,
    /// Rows (the microbatch size).
    pub rows: usize,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
}

/// The tile of the `m x n` output (reduced dimension `k`) that this block computes.
#[inline(always)]
fn origin<G: Grid>(g: &G, m: usize, n: usize, k: usize) -> TileOrigin {
    let (bx, by) = g.block();
    TileOrigin {
        m,
        n,
        k,
        row0: by * BM,
        col0: bx * BN,
    }
}

/// The block's `BM x BN` tile of `op(A) op(B)`: the `BK` steps of load / barrier / multiply / barrier.
/// `on_tile` sees the shared tiles after each load (between the barriers).
#[inline(always)]
unsafe fn gemm_tile<G: Grid, const A_ALONG_K: bool, const B_ALONG_N: bool>(
    g: &G,
    o: &TileOrigin,
    mut a: impl FnMut(usize, usize) -> f32,
    mut b: impl FnMut(usize, usize) -> f32,
    mut on_tile: impl FnMut(*const f32),
) -> Accumulators {
    if g.block_dim() != THREADS {
        g.trap();
    }
    let (smem, tid) = (g.shared(), g.thread());
    let mut acc = [[0.0f32; crate::tile::TN]; crate::tile::TM];
    let mut k0 = 0;
    while k0 < o.k {
        load_tiles::<A_ALONG_K, B_ALONG_N>(smem, tid, o, k0, &mut a, &mut b);
        g.sync_threads();
        multiply_tiles(smem, tid, &mut acc);
        on_tile(smem);
        g.sync_threads();
        k0 += BK;
    }
    acc
}

/// Forward: `Z = X W + b`, `Y = act(Z)`, storing `Z` when `args.z` is not null.
/// Grid: [`gemm_grid`](crate::grid::gemm_grid)`(rows, outputs)`.
///
/// # Safety
/// The pointers must be valid for the sizes documented on [`LinearForward`]; outputs must not overlap inputs.
pub unsafe fn linear_forward<G: Grid>(g: &G, args: &LinearForward) {
    let LinearForward {
        x,
        w,
        b,
        y,
        z,
        rows,
        inputs,
        outputs,
        act,
    } = *args;
    let o = origin(g, rows, outputs, inputs);
    let acc = gemm_tile::<G, true, true>(
        g,
        &o,
        |i, p| x.add(i * inputs + p).read(),
        |p, j| w.add(p * outputs + j).read(),
        |_| {},
    );
    for_each_output(&o, g.thread(), &acc, |row, col, v| {
        let (zv, yv) = epilogue(v, b.add(col).read(), act);
        let at = row * outputs + col;
        y.add(at).write(yv);
        if !z.is_null() {
            z.add(at).write(zv);
        }
    });
}

/// Backward for inputs: `dZ = dY act'(Z)` computed while loading, `dX = dZ W^T`. The blocks of the first
/// column of the grid also store `dZ` (when `args.dz` is not null), each element once, for the W pass.
/// Grid: [`gemm_grid`](crate::grid::gemm_grid)`(rows, inputs)`.
///
/// # Safety
/// The pointers must be valid for the sizes documented on [`LinearBackwardInput`]; outputs must not overlap
/// inputs.
pub unsafe fn linear_backward_input<G: Grid>(g: &G, args: &LinearBackwardInput) {
    let LinearBackwardInput {
        dy,
        z,
        w,
        dx,
        dz,
        rows,
        inputs,
        outputs,
        act,
    } = *args;
    let o = origin(g, rows, inputs, outputs);
    let store_dz = !dz.is_null() && g.block().0 == 0;
    let acc = gemm_tile::<G, true, false>(
        g,
        &o,
        |i, p| {
            let at = i * outputs + p;
            let grad = dy.add(at).read();
            let v = if z.is_null() {
                grad
            } else {
                grad * act.derivative(z.add(at).read())
            };
            if store_dz {
                dz.add(at).write(v);
            }
            v
        },
        |p, j| w.add(j * outputs + p).read(),
        |_| {},
    );
    for_each_output(&o, g.thread(), &acc, |row, col, v| {
        dx.add(row * inputs + col).write(v)
    });
}

/// Backward for weights, accumulating: `dW += X^T dZ` and (when `args.db` is not null) `db += colsum(dZ)`,
/// the column sums taken by the blocks of the first row of the grid from the `dZ` tiles they load anyway.
/// Grid: [`gemm_grid`](crate::grid::gemm_grid)`(inputs, outputs)`.
///
/// # Safety
/// The pointers must be valid for the sizes documented on [`LinearBackwardWeight`]; outputs must not overlap
/// inputs.
pub unsafe fn linear_backward_weight<G: Grid>(g: &G, args: &LinearBackwardWeight) {
    let LinearBackwardWeight {
        x,
        dz,
        dw,
        db,
        rows,
        inputs,
        outputs,
    } = *args;
    let o = origin(g, inputs, outputs, rows);
    let sum_bias = !db.is_null() && g.block().1 == 0;
    let tid = g.thread();
    let mut bias_sum = 0.0f32;
    let acc = gemm_tile::<G, false, true>(
        g,
        &o,
        |i, p| x.add(p * inputs + i).read(),
        |p, j| dz.add(p * outputs + j).read(),
        |smem| {
            if sum_bias {
                bias_sum += b_column_sum(smem, tid);
            }
        },
    );
    for_each_output(&o, tid, &acc, |row, col, v| {
        let cell = dw.add(row * outputs + col);
        cell.write(cell.read() + v);
    });
    let col = o.col0 + tid;
    if sum_bias && tid < BN && col < outputs {
        let cell = db.add(col);
        cell.write(cell.read() + bias_sum);
    }
}
