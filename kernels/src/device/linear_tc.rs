//! The tensor-core kernels of a linear layer `Y = act(X W + b)` (`X`: `rows x inputs`, `W`:
//! `inputs x outputs`), generic over the input precision [`MmaType`] ([`Tf32`](crate::tc::Tf32) with `f32`
//! buffers, [`Bf16`](crate::tc::Bf16) with `u16` BF16 buffers): the same fused epilogues as the SIMT
//! kernels of [`super::linear`], on the block GEMM of [`crate::tc::mainloop`].
//!
//! Launch each with [`crate::tc::launch`] (grid, [`THREADS`] threads, dynamic
//! shared memory). `BK` must be [`crate::tc::depth`] of the precision (checked at compile time).
//! Any sizes work, zero included, none needs to be a multiple of a tile.

use crate::activation::Activation;
use crate::epilogue::epilogue;
use crate::grid::{Grid, THREADS};
use crate::tc::mainloop::{
    block_gemm, for_each_acc, for_each_chunk, pick, put, AsyncCopy, Block, Fill, Operand,
};
use crate::tc::{block_tile, k_contiguous, warp_tile, MmaType, Product, SmemTile, TensorCore};

// Tiles and operand orientations per product: the same constants `tc::launch` sizes the launch with.
const FWD: (usize, usize) = block_tile(Product::Forward);
const FWD_K: (bool, bool) = k_contiguous(Product::Forward);
const BWI_K: (bool, bool) = k_contiguous(Product::BackwardInput);
const BWW_K: (bool, bool) = k_contiguous(Product::BackwardWeight);
const FWD_W: (usize, usize) = warp_tile(Product::Forward);
const BWI: (usize, usize) = block_tile(Product::BackwardInput);
const BWI_W: (usize, usize) = warp_tile(Product::BackwardInput);
const BWW: (usize, usize) = block_tile(Product::BackwardWeight);
const BWW_W: (usize, usize) = warp_tile(Product::BackwardWeight);

/// Arguments of [`linear_forward_tc`]; `E` is the precision's element (`f32` or BF16 `u16`).
#[derive(Clone, Copy, Debug)]
pub struct TcForward<E> {
    /// `X`, `rows x inputs`.
    pub x: *const E,
    /// `W`, `inputs x outputs`.
    pub w: *const E,
    /// `b`, `outputs` (`f32` in both precisions).
    pub b: *const f32,
    /// Output `Y = act(X W + b)`, `rows x outputs`.
    pub y: *mut E,
    /// Optional output `Z = X W + b`, `rows x outputs` (null: not stored).
    pub z: *mut E,
    /// Rows of `X`.
    pub rows: usize,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
    /// The fused activation.
    pub act: Activation,
}

/// Arguments of [`linear_backward_input_tc`].
#[derive(Clone, Copy, Debug)]
pub struct TcBackwardInput<E> {
    /// `dY`, `rows x outputs`.
    pub dy: *const E,
    /// The forward's `Z`, `rows x outputs`; may be null only when `act` is `Identity`.
    pub z: *const E,
    /// `W`, `inputs x outputs`.
    pub w: *const E,
    /// Output `dX = dZ W^T`, `rows x inputs` (overwritten).
    pub dx: *mut E,
    /// Optional output `dZ = dY act'(Z)`, `rows x outputs`, for the weight pass (null: not stored).
    pub dz: *mut E,
    /// Rows.
    pub rows: usize,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
    /// The activation of the forward.
    pub act: Activation,
}

/// Arguments of [`linear_backward_weight_tc`].
#[derive(Clone, Copy, Debug)]
pub struct TcBackwardWeight<E> {
    /// `X`, `rows x inputs`.
    pub x: *const E,
    /// `dZ`, `rows x outputs`.
    pub dz: *const E,
    /// `dW`, `inputs x outputs`, `f32`, accumulated into.
    pub dw: *mut f32,
    /// Optional `db`, `outputs`, `f32`, accumulated into (null: skipped).
    pub db: *mut f32,
    /// Rows.
    pub rows: usize,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
}

/// This block's tile of an `m x n` output reduced over `k`, for block tiles `bm x bn`.
#[inline(always)]
fn block_of<G: Grid>(g: &G, m: usize, n: usize, k: usize, tile: (usize, usize)) -> Block {
    let (bx, by) = g.block();
    Block {
        m,
        n,
        k,
        row0: by * tile.0,
        col0: bx * tile.1,
    }
}

/// Forward: `Z = X W + b`, `Y = act(Z)` (both rounded to the storage format), `Z` stored when not null.
///
/// # Safety
/// Pointers valid for the sizes on [`TcForward`], outputs not overlapping inputs; launched with
/// [`crate::tc::launch`]`(Forward, ..)`.
pub unsafe fn linear_forward_tc<T: TensorCore, P: MmaType, const BK: usize>(
    g: &T,
    args: &TcForward<P::Elem>,
) {
    const { assert!(BK * P::BYTES == 64) };
    let a = *args;
    let blk = block_of(g, a.rows, a.outputs, a.inputs, FWD);
    let mut fa = AsyncCopy::new(Operand {
        ptr: a.x,
        outer: a.rows,
        inner: a.inputs,
    });
    let mut fb = AsyncCopy::new(Operand {
        ptr: a.w,
        outer: a.inputs,
        inner: a.outputs,
    });
    let acc = block_gemm::<T, P, { FWD.0 }, { FWD.1 }, BK, { FWD_W.0 }, { FWD_W.1 }>(
        g,
        &blk,
        FWD_K.0,
        FWD_K.1,
        &mut fa,
        &mut fb,
        |_| {},
    );
    for_each_acc::<{ FWD.1 }, { FWD_W.0 }, { FWD_W.1 }>(&blk, g.thread(), &acc, |row, col, v| {
        let (zv, yv) = forward_epilogue(v, a.b.add(col).read(), a.act);
        let at = row * a.outputs + col;
        a.y.add(at).write(P::from_f32(yv));
        if !a.z.is_null() {
            a.z.add(at).write(P::from_f32(zv));
        }
    });
}

/// Most elements of the `dZ` tile one thread stages in registers (`BM BK / THREADS`).
const DZ_PER_THREAD: usize = 16;

/// The register-staged fill of the input-gradient kernel's `A = dZ = dY act'(Z)`: loads `dY` and `Z` and
/// computes `dZ` when issued (storing it to global memory when asked), writes it to shared memory after the
/// step's multiply.
struct DzFill<E> {
    dy: *const E,
    z: *const E,
    dz: *mut E,
    rows: usize,
    outputs: usize,
    act: Activation,
    store: bool,
}

/// Calls `f(i, row, col, smem_off)` for element `i` of this thread's share of a k-contiguous `A` stage
/// (`row`, `col` relative to the stage).
#[inline(always)]
fn for_each_staged<P: MmaType>(
    tid: usize,
    tile: SmemTile,
    mut f: impl FnMut(usize, usize, usize, u32),
) {
    let per_chunk = 16 / P::BYTES;
    let mut i = 0;
    for_each_chunk::<P>(tid, tile, |r, c, off| {
        for e in 0..per_chunk {
            f(i, r, c + e, off + (e * P::BYTES) as u32);
            i += 1;
        }
    });
}

/// `act'(z)`, kept out of line on the GPU so that the loops around it unroll (their register arrays then
/// stay in registers).
#[cfg_attr(target_arch = "nvptx64", inline(never))]
fn derivative(act: Activation, z: f32) -> f32 {
    act.derivative(z)
}

/// The forward epilogue [`epilogue`], out of line on the GPU for the same reason.
#[cfg_attr(target_arch = "nvptx64", inline(never))]
fn forward_epilogue(acc: f32, b: f32, act: Activation) -> (f32, f32) {
    epilogue(acc, b, act)
}

impl<P: MmaType> Fill<P> for DzFill<P::Elem> {
    type Pending = [P::Elem; DZ_PER_THREAD];

    #[inline(always)]
    unsafe fn issue<T: TensorCore>(
        &mut self,
        g: &T,
        tile: SmemTile,
        mn0: usize,
        k0: usize,
    ) -> Self::Pending {
        let mut regs = [P::from_f32(0.0); DZ_PER_THREAD];
        for_each_staged::<P>(g.thread(), tile, |i, r, c, _| {
            let (row, col) = (mn0 + r, k0 + c);
            if row < self.rows && col < self.outputs {
                let at = row * self.outputs + col;
                let grad = P::to_f32(self.dy.add(at).read());
                let v = if self.z.is_null() {
                    grad
                } else {
                    grad * derivative(self.act, P::to_f32(self.z.add(at).read()))
                };
                let e = P::from_f32(v);
                if self.store {
                    self.dz.add(at).write(e);
                }
                put(&mut regs, i, e);
            }
        });
        regs
    }

    #[inline(always)]
    unsafe fn finish<T: TensorCore>(&mut self, g: &T, tile: SmemTile, regs: Self::Pending) {
        for_each_staged::<P>(g.thread(), tile, |i, _, _, off| {
            P::sts(g, off, pick(&regs, i))
        });
    }
}

/// Backward for inputs: `dZ = dY act'(Z)` computed while staging (rounded to the storage format; stored by
/// the blocks of the grid's first column when `dz` is not null), `dX = dZ W^T`.
///
/// # Safety
/// Pointers valid for the sizes on [`TcBackwardInput`], outputs not overlapping inputs; launched with
/// [`crate::tc::launch`]`(BackwardInput, ..)`.
pub unsafe fn linear_backward_input_tc<T: TensorCore, P: MmaType, const BK: usize>(
    g: &T,
    args: &TcBackwardInput<P::Elem>,
) {
    // `DzFill` stages `dZ` k-contiguous (`[row][output]`), as it is in memory.
    const { assert!(BK * P::BYTES == 64 && BWI.0 * BK <= DZ_PER_THREAD * THREADS && BWI_K.0) };
    let a = *args;
    let blk = block_of(g, a.rows, a.inputs, a.outputs, BWI);
    let mut fa = DzFill {
        dy: a.dy,
        z: a.z,
        dz: a.dz,
        rows: a.rows,
        outputs: a.outputs,
        act: a.act,
        store: !a.dz.is_null() && g.block().0 == 0,
    };
    let mut fb = AsyncCopy::new(Operand {
        ptr: a.w,
        outer: a.inputs,
        inner: a.outputs,
    });
    let acc = block_gemm::<T, P, { BWI.0 }, { BWI.1 }, BK, { BWI_W.0 }, { BWI_W.1 }>(
        g,
        &blk,
        BWI_K.0,
        BWI_K.1,
        &mut fa,
        &mut fb,
        |_| {},
    );
    for_each_acc::<{ BWI.1 }, { BWI_W.0 }, { BWI_W.1 }>(&blk, g.thread(), &acc, |row, col, v| {
        a.dx.add(row * a.inputs + col).write(P::from_f32(v))
    });
}

/// Backward for weights, accumulating in `f32`: `dW += X^T dZ`, and (when `db` is not null)
/// `db += colsum(dZ)`, summed by the blocks of the grid's first row from the `dZ` stages they load anyway.
///
/// # Safety
/// Pointers valid for the sizes on [`TcBackwardWeight`], outputs not overlapping inputs; launched with
/// [`crate::tc::launch`]`(BackwardWeight, ..)`.
pub unsafe fn linear_backward_weight_tc<T: TensorCore, P: MmaType, const BK: usize>(
    g: &T,
    args: &TcBackwardWeight<P::Elem>,
) {
    const { assert!(BK * P::BYTES == 64 && BWW.1 <= THREADS) };
    let a = *args;
    let blk = block_of(g, a.inputs, a.outputs, a.rows, BWW);
    let sum_bias = !a.db.is_null() && g.block().1 == 0;
    let tid = g.thread();
    let mut bias_sum = 0.0f32;
    let mut fa = AsyncCopy::new(Operand {
        ptr: a.x,
        outer: a.rows,
        inner: a.inputs,
    });
    let mut fb = AsyncCopy::new(Operand {
        ptr: a.dz,
        outer: a.rows,
        inner: a.outputs,
    });
    let acc = block_gemm::<T, P, { BWW.0 }, { BWW.1 }, BK, { BWW_W.0 }, { BWW_W.1 }>(
        g,
        &blk,
        BWW_K.0,
        BWW_K.1,
        &mut fa,
        &mut fb,
        |tb| {
            if sum_bias && tid < BWW.1 {
                for p in 0..BK {
                    bias_sum += P::lds(g, tb.at(tid, p, P::BYTES));
                }
            }
        },
    );
    for_each_acc::<{ BWW.1 }, { BWW_W.0 }, { BWW_W.1 }>(&blk, tid, &acc, |row, col, v| {
        let cell = a.dw.add(row * a.outputs + col);
        cell.write(cell.read() + v);
    });
    let col = blk.col0 + tid;
    if sum_bias && tid < BWW.1 && col < a.outputs {
        let cell = a.db.add(col);
        cell.write(cell.read() + bias_sum);
    }
}
