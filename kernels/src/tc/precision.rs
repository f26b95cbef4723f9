//! The two input precisions of the tensor-core GEMMs, as types implementing [`MmaType`]: [`Tf32`] (`f32` in
//! memory, rounded to TF32 when a fragment is loaded; `mma.m16n8k8`) and [`Bf16`] (`u16` BF16 bits in
//! memory; fragments loaded with `ldmatrix`; `mma.m16n8k16`). Both accumulate in `f32`.
//!
//! An operand tile in shared memory is an [`SmemTile`]: either "k-contiguous" (`[mn][k]`: rows along the
//! output dimension, the reduced index contiguous) or "mn-contiguous" (`[k][mn]`), whichever the matrix
//! is in global memory, so that `cp.async` copies rows unchanged.

use super::convert::{bf16_to_f32, f32_to_bf16, to_tf32};
use super::warp::TensorCore;

/// An operand tile in the block's dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmemTile {
    /// Byte offset of element `(0, 0)`.
    pub off: u32,
    /// Elements between consecutive rows (the contiguous extent plus padding).
    pub ld: u32,
    /// `true`: stored `[mn][k]`; `false`: stored `[k][mn]`.
    pub k_contig: bool,
    /// Rows of the stage as stored (`BM` or `BN` when k-contiguous, else `BK`).
    pub rows: u32,
    /// Elements of each row that hold data (`BK` when k-contiguous, else `BM` or `BN`).
    pub cols: u32,
}

impl SmemTile {
    /// Byte offset of the element at output index `mn` (row of `A`, column of `B`) and reduced index `k`,
    /// for elements of `bytes` bytes.
    #[inline(always)]
    pub fn at(&self, mn: usize, k: usize, bytes: usize) -> u32 {
        let idx = if self.k_contig {
            mn * self.ld as usize + k
        } else {
            k * self.ld as usize + mn
        };
        self.off + (idx * bytes) as u32
    }
}

/// An input precision of the tensor-core GEMMs: its storage type, MMA shape and fragment loads.
pub trait MmaType {
    /// The element as stored in global and shared memory.
    type Elem: Copy;
    /// Bytes per element.
    const BYTES: usize;
    /// The `k` of one `mma` (`m16n8k{K}`).
    const MMA_K: usize;
    /// Row padding in elements of a k-contiguous shared tile (keeps fragment loads free of bank conflicts).
    const PAD_K: usize;
    /// Row padding in elements of an mn-contiguous shared tile.
    const PAD_MN: usize;
    /// `x` in the storage format (BF16: rounded to nearest even; TF32 storage is plain `f32`).
    fn from_f32(x: f32) -> Self::Elem;
    /// The value of a stored element.
    fn to_f32(e: Self::Elem) -> f32;
    /// Stores `e` at shared byte offset `off`.
    ///
    /// # Safety
    /// `off` aligned for the element, inside the shared memory.
    unsafe fn sts<T: TensorCore>(g: &T, off: u32, e: Self::Elem);
    /// The value of the element at shared byte offset `off`.
    ///
    /// # Safety
    /// `off` aligned for the element, inside the shared memory.
    #[inline(always)]
    unsafe fn lds<T: TensorCore>(g: &T, off: u32) -> f32 {
        let word = g.lds32(off & !3);
        if Self::BYTES == 4 {
            f32::from_bits(word)
        } else {
            bf16_to_f32((word >> ((off & 2) * 8)) as u16)
        }
    }
    /// This lane's `A` fragment of the 16 x `MMA_K` block at tile rows `m0..`, reduced indices `k0..`.
    ///
    /// # Safety
    /// The block inside the tile, which holds valid data (after the copies' wait and a barrier).
    unsafe fn frag_a<T: TensorCore>(g: &T, a: SmemTile, m0: usize, k0: usize) -> [u32; 4];
    /// This lane's `B` fragments of the two `MMA_K` x 8 blocks at reduced indices `k0..`, tile columns
    /// `n0..n0 + 8` and `n0 + 8..n0 + 16`.
    ///
    /// # Safety
    /// As for [`MmaType::frag_a`].
    unsafe fn frag_b<T: TensorCore>(g: &T, b: SmemTile, k0: usize, n0: usize) -> [[u32; 2]; 2];
    /// `D = A B + C` for one `m16n8k{MMA_K}` block.
    fn mma<T: TensorCore>(g: &T, a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4];
}

/// TF32 inputs (stored as `f32`), `mma.m16n8k8`, fragments read word by word.
#[derive(Clone, Copy, Debug)]
pub struct Tf32;

/// BF16 inputs (stored as `u16` bits), `mma.m16n8k16`, fragments read with `ldmatrix`.
#[derive(Clone, Copy, Debug)]
pub struct Bf16;

impl MmaType for Tf32 {
    type Elem = f32;
    const BYTES: usize = 4;
    const MMA_K: usize = 8;
    const PAD_K: usize = 4;
    const PAD_MN: usize = 8;
    #[inline(always)]
    fn from_f32(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn to_f32(e: f32) -> f32 {
        e
    }
    #[inline(always)]
    unsafe fn sts<T: TensorCore>(g: &T, off: u32, e: f32) {
        g.sts32(off, e.to_bits())
    }
    #[inline(always)]
    unsafe fn frag_a<T: TensorCore>(g: &T, a: SmemTile, m0: usize, k0: usize) -> [u32; 4] {
        let (gr, t) = (g.lane() >> 2, g.lane() % 4);
        let mut f = [0u32; 4];
        for (r, w) in f.iter_mut().enumerate() {
            let off = a.at(m0 + gr + 8 * (r & 1), k0 + t + 4 * (r >> 1), 4);
            *w = to_tf32(f32::from_bits(g.lds32(off)));
        }
        f
    }
    #[inline(always)]
    unsafe fn frag_b<T: TensorCore>(g: &T, b: SmemTile, k0: usize, n0: usize) -> [[u32; 2]; 2] {
        let (gr, t) = (g.lane() >> 2, g.lane() % 4);
        let mut f = [[0u32; 2]; 2];
        for (q, pair) in f.iter_mut().enumerate() {
            for (r, w) in pair.iter_mut().enumerate() {
                let off = b.at(n0 + 8 * q + gr, k0 + t + 4 * r, 4);
                *w = to_tf32(f32::from_bits(g.lds32(off)));
            }
        }
        f
    }
    #[inline(always)]
    fn mma<T: TensorCore>(g: &T, a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        g.mma_tf32(a, b, c)
    }
}

impl MmaType for Bf16 {
    type Elem = u16;
    const BYTES: usize = 2;
    const MMA_K: usize = 16;
    const PAD_K: usize = 8;
    const PAD_MN: usize = 8;
    #[inline(always)]
    fn from_f32(x: f32) -> u16 {
        f32_to_bf16(x)
    }
    #[inline(always)]
    fn to_f32(e: u16) -> f32 {
        bf16_to_f32(e)
    }
    #[inline(always)]
    unsafe fn sts<T: TensorCore>(g: &T, off: u32, e: u16) {
        g.sts16(off, e)
    }
    #[inline(always)]
    unsafe fn frag_a<T: TensorCore>(g: &T, a: SmemTile, m0: usize, k0: usize) -> [u32; 4] {
        // Matrix j of the x4 load: rows m0 + 8 (j & 1), reduced indices k0 + 8 (j >> 1); lane 8 j + r gives
        // the address of that matrix's row r as stored.
        let (j, r) = (g.lane() / 8, g.lane() % 8);
        if a.k_contig {
            g.ldmatrix_x4::<false>(a.at(m0 + r + 8 * (j & 1), k0 + 8 * (j >> 1), 2))
        } else {
            g.ldmatrix_x4::<true>(a.at(m0 + 8 * (j & 1), k0 + r + 8 * (j >> 1), 2))
        }
    }
    #[inline(always)]
    unsafe fn frag_b<T: TensorCore>(g: &T, b: SmemTile, k0: usize, n0: usize) -> [[u32; 2]; 2] {
        // Matrix j: columns n0 + 8 (j >> 1), reduced indices k0 + 8 (j & 1), so registers (0, 1) are the two
        // halves of the first 8 columns and (2, 3) of the next 8.
        let (j, r) = (g.lane() / 8, g.lane() % 8);
        let m = if b.k_contig {
            g.ldmatrix_x4::<false>(b.at(n0 + r + 8 * (j >> 1), k0 + 8 * (j & 1), 2))
        } else {
            g.ldmatrix_x4::<true>(b.at(n0 + 8 * (j >> 1), k0 + r + 8 * (j & 1), 2))
        };
        [[m[0], m[1]], [m[2], m[3]]]
    }
    #[inline(always)]
    fn mma<T: TensorCore>(g: &T, a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        g.mma_bf16(a, b, c)
    }
}
