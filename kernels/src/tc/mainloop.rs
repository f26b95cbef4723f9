//! The block-level GEMM of the tensor-core kernels: a `BM x BN` output tile per block of
//! [`THREADS`] threads (8 warps in a `WARPS_M x WARPS_N` grid, each owning `MI x NI` MMA blocks of 16 x 8),
//! stepping through the reduced dimension `BK` at a time with a ring of [`STAGES`] shared-memory stages
//! filled by `cp.async` (`STAGES - 1` tiles in flight while one is multiplied).
//!
//! Per step `kt`: wait for tile `kt`'s copies and barrier; start filling tile `kt + STAGES - 1` into the
//! stage tile `kt - 1` used (every thread is past it: the barrier); multiply the stage of tile `kt`; then
//! let a register-staged fill (the input-gradient kernel's `dZ`) store what it loaded before the multiply.
//!
//! Edges: every element outside the matrices is written as `0` into shared memory (`cp.async` with a source
//! size of 0, or a plain store), so no size has to be a multiple of a tile. A 16-byte `cp.async` is used
//! when the operand's rows are whole 16-byte chunks and its base is 16-byte aligned; otherwise the copy goes
//! element by element through registers.

use super::precision::{MmaType, SmemTile};
use super::warp::{TensorCore, WARP};
use crate::grid::THREADS;

/// Shared-memory stages of the copy pipeline.
pub const STAGES: usize = 4;

/// Warps per block.
const WARPS: usize = THREADS / WARP;

/// An operand in global memory: a row-major `outer x inner` matrix (rows contiguous along `inner`), read as
/// `A` (output index `m`) or `B` (output index `n`) of the GEMM. Whether its rows are output indices
/// (`[mn][k]`) or reduced indices (`[k][mn]`) is the orientation [`block_gemm`] is given for it, which the
/// stage tiles carry ([`SmemTile::k_contig`]).
#[derive(Clone, Copy, Debug)]
pub struct Operand<E> {
    /// The matrix.
    pub ptr: *const E,
    /// Rows as stored.
    pub outer: usize,
    /// Row length as stored (also the leading dimension).
    pub inner: usize,
}

/// The shape of a block tile: `(rows, row length)` of an operand's stage as stored, and its row stride.
#[inline(always)]
const fn stage_shape<P: MmaType>(
    k_contig: bool,
    mn_tile: usize,
    bk: usize,
) -> (usize, usize, usize) {
    if k_contig {
        (mn_tile, bk, bk + P::PAD_K)
    } else {
        (bk, mn_tile, mn_tile + P::PAD_MN)
    }
}

/// Bytes of one stage of an operand tile.
#[inline(always)]
pub const fn stage_bytes<P: MmaType>(k_contig: bool, mn_tile: usize, bk: usize) -> usize {
    let (rows, _, ld) = stage_shape::<P>(k_contig, mn_tile, bk);
    rows * ld * P::BYTES
}

/// Dynamic shared memory of a kernel: [`STAGES`] stages of both operand tiles.
#[inline(always)]
pub const fn shared_bytes<P: MmaType>(
    a_k_contig: bool,
    b_k_contig: bool,
    bm: usize,
    bn: usize,
    bk: usize,
) -> usize {
    STAGES * (stage_bytes::<P>(a_k_contig, bm, bk) + stage_bytes::<P>(b_k_contig, bn, bk))
}

/// How one operand's stage gets filled: `issue` starts it (at the top of a step), `finish` completes it
/// (after that step's multiply; visible after the next barrier).
pub trait Fill<P: MmaType> {
    /// What `issue` hands to `finish` (registers of a register-staged fill).
    type Pending;
    /// Starts filling `tile` with the operand's block at output index `mn0`, reduced index `k0`.
    ///
    /// # Safety
    /// No thread reads `tile` until after the next barrier that follows `finish` and a `cp.async` wait.
    unsafe fn issue<T: TensorCore>(
        &mut self,
        g: &T,
        tile: SmemTile,
        mn0: usize,
        k0: usize,
    ) -> Self::Pending;
    /// Completes the fill started by `issue`.
    ///
    /// # Safety
    /// As for `issue`.
    unsafe fn finish<T: TensorCore>(&mut self, g: &T, tile: SmemTile, pending: Self::Pending);
}

/// The `cp.async` fill of an [`Operand`] (plain element copies when its rows are not 16-byte chunks).
#[derive(Clone, Copy, Debug)]
pub struct AsyncCopy<E> {
    op: Operand<E>,
    vectorized: bool,
}

impl<E> AsyncCopy<E> {
    /// The fill of `op`, with 16-byte copies when its rows are whole 16-byte chunks at 16-byte alignment.
    #[inline(always)]
    pub fn new(op: Operand<E>) -> Self {
        let bytes = core::mem::size_of::<E>();
        let vectorized = (op.inner * bytes) % 16 == 0 && (op.ptr as usize) % 16 == 0;
        AsyncCopy { op, vectorized }
    }
}

/// Calls `f(row, col, smem_off)` for each of this thread's 16-byte chunks of a stage (`col` is the chunk's
/// first element): chunk `tid + s THREADS` for `s < chunks / THREADS` (a constant, so the loop unrolls and
/// register-staged values keep constant indices).
#[inline(always)]
pub fn for_each_chunk<P: MmaType>(
    tid: usize,
    tile: SmemTile,
    mut f: impl FnMut(usize, usize, u32),
) {
    let per_chunk = 16 / P::BYTES;
    let per_row = tile.cols as usize / per_chunk;
    for s in 0..(tile.rows as usize * per_row) / THREADS {
        let idx = tid + s * THREADS;
        let (r, c) = (idx / per_row, (idx % per_row) * per_chunk);
        f(
            r,
            c,
            tile.off + ((r * tile.ld as usize + c) * P::BYTES) as u32,
        );
    }
}

impl<P: MmaType> Fill<P> for AsyncCopy<P::Elem> {
    type Pending = ();

    #[inline(always)]
    unsafe fn issue<T: TensorCore>(&mut self, g: &T, tile: SmemTile, mn0: usize, k0: usize) {
        let op = self.op;
        let (outer0, inner0) = if tile.k_contig { (mn0, k0) } else { (k0, mn0) };
        let per_chunk = 16 / P::BYTES;
        let vectorized = self.vectorized;
        for_each_chunk::<P>(g.thread(), tile, |r, c, dst| {
            let (go, gi) = (outer0 + r, inner0 + c);
            if vectorized {
                if go < op.outer && gi < op.inner {
                    g.cp_async16(dst, op.ptr.add(go * op.inner + gi).cast(), 16);
                } else {
                    g.cp_async16(dst, op.ptr.cast(), 0);
                }
            } else {
                for e in 0..per_chunk {
                    let v = if go < op.outer && gi + e < op.inner {
                        op.ptr.add(go * op.inner + gi + e).read()
                    } else {
                        P::from_f32(0.0)
                    };
                    P::sts(g, dst + (e * P::BYTES) as u32, v);
                }
            }
        });
    }

    #[inline(always)]
    unsafe fn finish<T: TensorCore>(&mut self, _: &T, _: SmemTile, _: ()) {}
}

/// A stage's [`SmemTile`] for an operand of `mn_tile` output indices, at byte offset `off`.
#[inline(always)]
pub const fn stage_tile<P: MmaType>(
    off: usize,
    k_contig: bool,
    mn_tile: usize,
    bk: usize,
) -> SmemTile {
    let (rows, cols, ld) = stage_shape::<P>(k_contig, mn_tile, bk);
    SmemTile {
        off: off as u32,
        ld: ld as u32,
        k_contig,
        rows: rows as u32,
        cols: cols as u32,
    }
}

/// The block's problem: output `m x n`, reduced dimension `k`, this block's tile at `(row0, col0)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Rows of the output.
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// The reduced dimension.
    pub k: usize,
    /// First output row of this block.
    pub row0: usize,
    /// First output column of this block.
    pub col0: usize,
}

/// The accumulators of one warp: `acc[i][j]` is the 16 x 8 block `i` down, `j` across, in the `C` fragment
/// layout of [`super::warp`].
pub type Acc<const MI: usize, const NI: usize> = [[[f32; 4]; NI]; MI];

/// This thread's warp's first output row and column inside the block tile: warps are laid out
/// `WARPS / (BN / (8 NI))` down by `BN / (8 NI)` across, each `16 MI x 8 NI`.
#[inline(always)]
fn warp_origin<const BN: usize, const MI: usize, const NI: usize>(tid: usize) -> (usize, usize) {
    let warps_n = BN / (8 * NI);
    let w = tid / WARP;
    ((w / warps_n) * 16 * MI, (w % warps_n) * 8 * NI)
}

/// The block tile `acc` of `op(A) op(B)` over the whole reduced dimension (layout in the module docs).
/// `on_stage(b_tile)` runs after each step's multiply with the `B` stage of that step (between barriers).
///
/// # Safety
/// The fills' operands valid for their documented sizes; the dynamic shared memory at least
/// [`shared_bytes`] for this geometry; launched with [`THREADS`] threads (checked: traps otherwise).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn block_gemm<
    T: TensorCore,
    P: MmaType,
    const BM: usize,
    const BN: usize,
    const BK: usize,
    const MI: usize,
    const NI: usize,
>(
    g: &T,
    blk: &Block,
    a_k_contig: bool,
    b_k_contig: bool,
    a: &mut impl Fill<P>,
    b: &mut impl Fill<P>,
    mut on_stage: impl FnMut(SmemTile),
) -> Acc<MI, NI> {
    const {
        assert!((BM / (16 * MI)) * (BN / (8 * NI)) == WARPS && NI % 2 == 0 && BK % 16 == 0);
        // Every thread copies the same number of whole 16-byte chunks of each stage.
        assert!(
            (BM * BK * P::BYTES / 16) % THREADS == 0 && (BN * BK * P::BYTES / 16) % THREADS == 0
        );
    };
    if g.block_dim() != THREADS {
        g.trap();
    }
    let a_bytes = stage_bytes::<P>(a_k_contig, BM, BK);
    let stride = a_bytes + stage_bytes::<P>(b_k_contig, BN, BK);
    let tiles = |s: usize| {
        (
            stage_tile::<P>(s * stride, a_k_contig, BM, BK),
            stage_tile::<P>(s * stride + a_bytes, b_k_contig, BN, BK),
        )
    };
    let ktiles = blk.k.div_ceil(BK);
    for s in 0..STAGES - 1 {
        if s < ktiles {
            let (ta, tb) = tiles(s);
            let pa = a.issue(g, ta, blk.row0, s * BK);
            let pb = b.issue(g, tb, blk.col0, s * BK);
            a.finish(g, ta, pa);
            b.finish(g, tb, pb);
        }
        g.cp_async_commit();
    }
    let mut acc = [[[0.0f32; 4]; NI]; MI];
    let (wm, wn) = warp_origin::<BN, MI, NI>(g.thread());
    for kt in 0..ktiles {
        g.cp_async_wait::<{ (STAGES - 2) as u32 }>();
        g.sync_threads();
        let next = kt + STAGES - 1;
        let (na, nb) = tiles(next % STAGES);
        let pending = if next < ktiles {
            Some((
                a.issue(g, na, blk.row0, next * BK),
                b.issue(g, nb, blk.col0, next * BK),
            ))
        } else {
            None
        };
        g.cp_async_commit();
        let (ta, tb) = tiles(kt % STAGES);
        multiply_stage::<T, P, BK, MI, NI>(g, ta, tb, wm, wn, &mut acc);
        on_stage(tb);
        if let Some((pa, pb)) = pending {
            a.finish(g, na, pa);
            b.finish(g, nb, pb);
        }
    }
    g.cp_async_wait::<0>();
    acc
}

/// Adds one stage's product to the warp's accumulators.
#[inline(always)]
unsafe fn multiply_stage<
    T: TensorCore,
    P: MmaType,
    const BK: usize,
    const MI: usize,
    const NI: usize,
>(
    g: &T,
    ta: SmemTile,
    tb: SmemTile,
    wm: usize,
    wn: usize,
    acc: &mut Acc<MI, NI>,
) {
    let mut kk = 0;
    while kk < BK {
        let mut af = [[0u32; 4]; MI];
        for (i, f) in af.iter_mut().enumerate() {
            *f = P::frag_a(g, ta, wm + 16 * i, kk);
        }
        let mut bf = [[0u32; 2]; NI];
        for jp in 0..NI / 2 {
            let two = P::frag_b(g, tb, kk, wn + 16 * jp);
            bf[2 * jp] = two[0];
            bf[2 * jp + 1] = two[1];
        }
        for (i, row) in acc.iter_mut().enumerate() {
            for (j, c) in row.iter_mut().enumerate() {
                *c = P::mma(g, af[i], bf[j], *c);
            }
        }
        kk += P::MMA_K;
    }
}

/// Calls `f(row, col, value)` for each of this thread's accumulators inside the `m x n` output.
#[inline(always)]
pub fn for_each_acc<const BN: usize, const MI: usize, const NI: usize>(
    blk: &Block,
    tid: usize,
    acc: &Acc<MI, NI>,
    mut f: impl FnMut(usize, usize, f32),
) {
    let (wm, wn) = warp_origin::<BN, MI, NI>(tid);
    let lane = tid % WARP;
    let (gr, t) = (lane >> 2, lane % 4);
    for i in 0..MI {
        let row_blocks = pick(acc, i);
        for j in 0..NI {
            let c = pick(&row_blocks, j);
            for r in 0..4 {
                let row = blk.row0 + wm + 16 * i + gr + 8 * (r >> 1);
                let col = blk.col0 + wn + 8 * j + 2 * t + (r & 1);
                if row < blk.m && col < blk.n {
                    f(row, col, pick(&c, r));
                }
            }
        }
    }
}

/// `arr[i]` for `i < N`, written as a chain of selects over constant indices: when the loop around it does
/// not unroll, the array still never needs an address (it stays in registers instead of local memory).
#[inline(always)]
pub fn pick<T: Copy, const N: usize>(arr: &[T; N], i: usize) -> T {
    let mut out = arr[0];
    for (k, &v) in arr.iter().enumerate().skip(1) {
        if k == i {
            out = v;
        }
    }
    out
}

/// `arr[i] = v` for `i < N` (nothing for larger `i`), as selects over constant indices (see [`pick`]).
#[inline(always)]
pub fn put<T: Copy, const N: usize>(arr: &mut [T; N], i: usize, v: T) {
    for (k, slot) in arr.iter_mut().enumerate() {
        if k == i {
            *slot = v;
        }
    }
}
