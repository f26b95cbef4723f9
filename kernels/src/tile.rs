//! The shared-memory tiling of the GEMM kernels: one block computes a `BM x BN` tile of `C = A B`,
//! stepping through the reduced dimension `BK` columns of `A` (rows of `B`) at a time; each of the
//! [`THREADS`](crate::grid::THREADS) threads keeps a `TM x TN` register block of accumulators.
//!
//! Per `BK` step the block runs two phases separated by barriers:
//! 1. [`load_tiles`]: every thread copies `BM BK / THREADS` elements of `A` and `BK BN / THREADS` of `B` from
//!    global to shared memory, writing `0` outside the matrices, so no size needs to be a tile multiple;
//! 2. [`multiply_tiles`]: every thread accumulates its `TM x TN` block from the shared tiles.
//!
//! Then [`for_each_output`] hands each in-bounds accumulator to the kernel's epilogue.
//!
//! Thread `t` owns rows `ty + 16 i` and columns `tx + 16 c` of the tile (`ty = t / 16`, `tx = t % 16`,
//! `i, c < 4`): within a warp the shared-memory reads of `B` are 16 consecutive words (no bank conflict),
//! those of `A` are broadcasts, and the global stores of a row are 16 consecutive floats.
//!
//! The operands are read through closures `a(i, p)` and `b(p, j)`, so one tiling serves `X W`, `dZ W^T`
//! (with `dZ = dY act'(Z)` computed while loading) and `X^T dZ`. The const parameters say which index
//! of each operand is contiguous in memory, so that consecutive threads load consecutive addresses.

/// Rows of the output tile.
pub const BM: usize = 64;
/// Columns of the output tile.
pub const BN: usize = 64;
/// Depth of one step along the reduced dimension.
pub const BK: usize = 16;
/// Rows of the register block of one thread.
pub const TM: usize = 4;
/// Columns of the register block of one thread.
pub const TN: usize = 4;
/// Threads along a tile's columns (and, equally, along its rows): `BN / TN`.
const TX: usize = BN / TN;
/// Row stride of the shared `A` tile, stored transposed (`[BK][A_STRIDE]`); padded by 4 to spread banks.
const A_STRIDE: usize = BM + 4;
/// Row stride of the shared `B` tile (`[BK][B_STRIDE]`).
const B_STRIDE: usize = BN + 4;
/// Where the `B` tile starts in shared memory.
const B_OFFSET: usize = BK * A_STRIDE;
/// Shared memory of one block, in `f32`: both tiles (8704 bytes).
pub const SHARED_FLOATS: usize = B_OFFSET + BK * B_STRIDE;

/// The register block of one thread: `acc[i][c]` is output row `ty + 16 i`, column `tx + 16 c`.
pub type Accumulators = [[f32; TN]; TM];

const _: () = assert!(BM * BK % crate::grid::THREADS == 0 && BK * BN % crate::grid::THREADS == 0);
const _: () = assert!(TX * TX == crate::grid::THREADS && BM == TX * TM && BN == TX * TN);

/// The problem a block works on: `C` is `m x n`, the reduced dimension is `k`, and this block's tile
/// starts at row `row0`, column `col0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileOrigin {
    /// Rows of `C` (and of `A`).
    pub m: usize,
    /// Columns of `C` (and of `B`).
    pub n: usize,
    /// The reduced dimension.
    pub k: usize,
    /// First row of this block's tile.
    pub row0: usize,
    /// First column of this block's tile.
    pub col0: usize,
}

/// Multiply-add `a b + c`: one fused `fma.rn.f32` on the GPU, `a * b + c` (two roundings) on the host.
#[inline(always)]
pub fn fmadd(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        core::f32::math::mul_add(a, b, c)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a * b + c
    }
}

/// Phase 1 of a `BK` step starting at `k0`: thread `tid` copies its share of the `A` tile (`a(i, p)` for
/// rows `row0..row0+BM`, `p` in `k0..k0+BK`) and of the `B` tile (`b(p, j)`, columns `col0..col0+BN`)
/// into shared memory, with `0` outside the matrices. `a` and `b` are only called for in-bounds indices.
///
/// `A_ALONG_K`: `a(i, p)` is contiguous in `p` (else in `i`). `B_ALONG_N`: `b(p, j)` is contiguous in `j`
/// (else in `p`).
///
/// # Safety
/// `smem` must point at [`SHARED_FLOATS`] writable floats shared by the block, with no other thread reading
/// them until the next barrier.
#[inline(always)]
pub unsafe fn load_tiles<const A_ALONG_K: bool, const B_ALONG_N: bool>(
    smem: *mut f32,
    tid: usize,
    o: &TileOrigin,
    k0: usize,
    mut a: impl FnMut(usize, usize) -> f32,
    mut b: impl FnMut(usize, usize) -> f32,
) {
    let threads = crate::grid::THREADS;
    for s in 0..BM * BK / threads {
        let idx = tid + s * threads;
        let (ti, tp) = if A_ALONG_K {
            (idx / BK, idx % BK)
        } else {
            (idx % BM, idx / BM)
        };
        let (gi, gp) = (o.row0 + ti, k0 + tp);
        let v = if gi < o.m && gp < o.k { a(gi, gp) } else { 0.0 };
        smem.add(tp * A_STRIDE + ti).write(v);
    }
    for s in 0..BK * BN / threads {
        let idx = tid + s * threads;
        let (tp, tj) = if B_ALONG_N {
            (idx / BN, idx % BN)
        } else {
            (idx % BK, idx / BK)
        };
        let (gp, gj) = (k0 + tp, o.col0 + tj);
        let v = if gp < o.k && gj < o.n { b(gp, gj) } else { 0.0 };
        smem.add(B_OFFSET + tp * B_STRIDE + tj).write(v);
    }
}

/// Phase 2 of a `BK` step: thread `tid` adds the product of the shared tiles to its register block.
///
/// # Safety
/// `smem` must point at [`SHARED_FLOATS`] floats filled by [`load_tiles`] of every thread of the block,
/// with a barrier in between.
#[inline(always)]
pub unsafe fn multiply_tiles(smem: *const f32, tid: usize, acc: &mut Accumulators) {
    let (ty, tx) = (tid / TX, tid % TX);
    for p in 0..BK {
        let mut a = [0.0f32; TM];
        let mut b = [0.0f32; TN];
        for (i, a) in a.iter_mut().enumerate() {
            *a = smem.add(p * A_STRIDE + ty + TX * i).read();
        }
        for (c, b) in b.iter_mut().enumerate() {
            *b = smem.add(B_OFFSET + p * B_STRIDE + tx + TX * c).read();
        }
        for i in 0..TM {
            for c in 0..TN {
                acc[i][c] = fmadd(a[i], b[c], acc[i][c]);
            }
        }
    }
}

/// The sum of column `tid` of the shared `B` tile (rows `0..BK`; padding rows are `0`), for threads
/// `tid < BN` (others get `0`). The weight-gradient kernel uses it for `db += colsum(dZ)`.
///
/// # Safety
/// As for [`multiply_tiles`].
#[inline(always)]
pub unsafe fn b_column_sum(smem: *const f32, tid: usize) -> f32 {
    let mut sum = 0.0f32;
    if tid < BN {
        for p in 0..BK {
            sum += smem.add(B_OFFSET + p * B_STRIDE + tid).read();
        }
    }
    sum
}

/// Calls `f(row, col, value)` for each of thread `tid`'s accumulators that lies inside the `m x n` output.
#[inline(always)]
pub fn for_each_output(
    o: &TileOrigin,
    tid: usize,
    acc: &Accumulators,
    mut f: impl FnMut(usize, usize, f32),
) {
    let (ty, tx) = (tid / TX, tid % TX);
    for (i, row_acc) in acc.iter().enumerate() {
        let row = o.row0 + ty + TX * i;
        if row >= o.m {
            continue;
        }
        for (c, &value) in row_acc.iter().enumerate() {
            let col = o.col0 + tx + TX * c;
            if col < o.n {
                f(row, col, value);
            }
        }
    }
}
