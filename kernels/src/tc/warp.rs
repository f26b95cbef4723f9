//! The warp-level instructions the tensor-core GEMMs use, as the trait [`TensorCore`], and their meaning
//! written out with the fragment layouts of the PTX ISA (section "Matrix Fragments for mma.m16n8k8 /
//! mma.m16n8k16", and `ldmatrix`).
//!
//! On the GPU each method is one PTX instruction (`mma.sync`, `ldmatrix`, `cp.async`, `ld.shared`); on the
//! host the default methods compute the same result from the fragments of all 32 lanes, which they collect
//! with [`TensorCore::warp_gather`] (the host emulator's only warp primitive). So a kernel that puts a value
//! in the wrong fragment slot computes a wrong product on the host too, and the tests see it.
//!
//! Notation (PTX ISA): `lane` is the lane in the warp, `g = lane >> 2` the group, `t = lane % 4` the thread
//! in the group.
//!
//! | operand | register `r` of lane (`g`, `t`) holds |
//! | --- | --- |
//! | TF32 `A` (16 x 8) | `A[g + 8 (r & 1)][t + 4 (r >> 1)]` |
//! | TF32 `B` (8 x 8) | `B[t + 4 r][g]` |
//! | BF16 `A` (16 x 16) | `A[g + 8 (r & 1)][2t + 8 (r >> 1) + {0, 1}]` (low half first) |
//! | BF16 `B` (16 x 8) | `B[2t + 8 r + {0, 1}][g]` (low half first) |
//! | `C`, `D` (16 x 8, f32) | `C[g + 8 (r >> 1)][2t + (r & 1)]` |

use crate::grid::Grid;

/// Lanes in a warp.
pub const WARP: usize = 32;

/// Words a lane hands to [`TensorCore::warp_gather`] (enough for a BF16 or TF32 `A` and `B` fragment).
pub const GATHER_WORDS: usize = 6;

/// The tensor-core instructions of one GPU thread, on top of its [`Grid`].
///
/// Shared memory here is the block's *dynamic* shared memory, addressed by byte offsets from its start
/// ([`TensorCore::tc_shared`]); its size is the launch's `shared_bytes`.
///
/// # Safety
/// Implementations must give every thread of a block the same dynamic shared memory (and no other block
/// access to it), make the warp methods collective over the 32 lanes of a warp (`thread() / 32`), and make
/// `cp_async_wait::<N>` complete every copy committed before the newest `N` groups.
pub unsafe trait TensorCore: Grid {
    /// Start of the block's dynamic shared memory, as a generic pointer.
    fn tc_shared(&self) -> *mut u8;

    /// All 32 lanes' `words`, indexed by lane (host emulator only: the GPU implementation traps, since
    /// every method that needs it is one instruction there). Collective: every lane of the warp calls it.
    fn warp_gather(&self, words: [u32; GATHER_WORDS]) -> [[u32; GATHER_WORDS]; WARP];

    /// `cp.async.cg.shared.global` of 16 bytes: copies `src_bytes` (0 or 16) bytes from `src` to shared
    /// offset `dst` and zero-fills the rest of the 16. Completes at a [`TensorCore::cp_async_wait`].
    ///
    /// # Safety
    /// `dst` 16-byte aligned inside the shared memory; `src` 16-byte aligned and valid for `src_bytes`.
    unsafe fn cp_async16(&self, dst: u32, src: *const u8, src_bytes: u32);

    /// `cp.async.commit_group`: closes the group of copies issued since the last commit.
    fn cp_async_commit(&self);

    /// `cp.async.wait_group N`: waits until at most the newest `N` committed groups are still pending.
    /// `N` must be at most 3.
    fn cp_async_wait<const N: u32>(&self);

    /// Called by the default (host) methods before they touch shared memory: `bytes` at `off`, which must be
    /// `align`-aligned. The host emulator checks it; the GPU implementation never calls it.
    #[inline(always)]
    fn check_shared(&self, off: u32, bytes: u32, align: u32) {
        let _ = (off, bytes, align);
    }

    /// This thread's lane in its warp.
    #[inline(always)]
    fn lane(&self) -> usize {
        self.thread() % WARP
    }

    /// `ld.shared.b32` at byte offset `off`.
    ///
    /// # Safety
    /// `off` 4-byte aligned inside the shared memory.
    #[inline(always)]
    unsafe fn lds32(&self, off: u32) -> u32 {
        self.check_shared(off, 4, 4);
        self.tc_shared().add(off as usize).cast::<u32>().read()
    }

    /// `st.shared.b32` at byte offset `off`.
    ///
    /// # Safety
    /// `off` 4-byte aligned inside the shared memory.
    #[inline(always)]
    unsafe fn sts32(&self, off: u32, v: u32) {
        self.check_shared(off, 4, 4);
        self.tc_shared().add(off as usize).cast::<u32>().write(v)
    }

    /// `st.shared.b16` at byte offset `off`.
    ///
    /// # Safety
    /// `off` 2-byte aligned inside the shared memory.
    #[inline(always)]
    unsafe fn sts16(&self, off: u32, v: u16) {
        self.check_shared(off, 2, 2);
        self.tc_shared().add(off as usize).cast::<u16>().write(v)
    }

    /// `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`: lane `8 j + i` gives the shared offset of row `i`
    /// of 8 x 8 matrix `j` (16 bytes, 16-byte aligned); register `j` of lane (`g`, `t`) receives, low half
    /// first, elements `[g][2t]`, `[g][2t + 1]` of matrix `j`, or with `TRANS` elements `[2t][g]`,
    /// `[2t + 1][g]`.
    ///
    /// # Safety
    /// Every lane's `row_off` as described, inside the shared memory.
    #[inline(always)]
    unsafe fn ldmatrix_x4<const TRANS: bool>(&self, row_off: u32) -> [u32; 4] {
        self.check_shared(row_off, 16, 16);
        let all = self.warp_gather([row_off, 0, 0, 0, 0, 0]);
        let (g, t) = (self.lane() >> 2, self.lane() % 4);
        let base = self.tc_shared();
        let at = |matrix: usize, row: usize, col: usize| -> u32 {
            let row_start = base.add(all[8 * matrix + row][0] as usize).cast::<u16>();
            u32::from(row_start.add(col).read())
        };
        let mut out = [0u32; 4];
        for (j, word) in out.iter_mut().enumerate() {
            let (lo, hi) = if TRANS {
                (at(j, 2 * t, g), at(j, 2 * t + 1, g))
            } else {
                (at(j, g, 2 * t), at(j, g, 2 * t + 1))
            };
            *word = lo | (hi << 16);
        }
        out
    }

    /// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`: `D = A B + C` with this lane's fragments
    /// (layouts in the module docs). Inputs are TF32: the low 13 bits of each word are ignored.
    #[inline(always)]
    fn mma_tf32(&self, a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        let all = self.warp_gather([a[0], a[1], a[2], a[3], b[0], b[1]]);
        mma_host(
            &all,
            self.lane(),
            c,
            8,
            |all, row, k| {
                let (g, t) = (row % 8, k % 4);
                let w = all[4 * g + t][(row / 8) + 2 * (k / 4)];
                f64::from(f32::from_bits(w & 0xffff_e000))
            },
            |all, k, col| {
                let w = all[4 * col + k % 4][4 + k / 4];
                f64::from(f32::from_bits(w & 0xffff_e000))
            },
        )
    }

    /// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: `D = A B + C` with this lane's fragments
    /// (two BF16 values per word, low half first; layouts in the module docs).
    #[inline(always)]
    fn mma_bf16(&self, a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        let all = self.warp_gather([a[0], a[1], a[2], a[3], b[0], b[1]]);
        mma_host(
            &all,
            self.lane(),
            c,
            16,
            |all, row, k| {
                let (g, t) = (row % 8, (k % 8) / 2);
                let w = all[4 * g + t][(row / 8) + 2 * (k / 8)];
                f64::from(crate::tc::convert::bf16_to_f32(half(w, k % 2)))
            },
            |all, k, col| {
                let w = all[4 * col + (k % 8) / 2][4 + k / 8];
                f64::from(crate::tc::convert::bf16_to_f32(half(w, k % 2)))
            },
        )
    }
}

/// Half `h` (0: low) of a word of two 16-bit values.
#[inline(always)]
fn half(w: u32, h: usize) -> u16 {
    (w >> (16 * h)) as u16
}

/// The host meaning of an `m16n8kK` MMA: this lane's four `D` elements, each `C + sum_k A[row][k] B[k][col]`
/// summed exactly (in `f64`; products of TF32 or BF16 values are exact there) and rounded once to `f32`.
/// `a(all, row, k)` and `b(all, k, col)` read the gathered fragments.
#[inline(always)]
fn mma_host(
    all: &[[u32; GATHER_WORDS]; WARP],
    lane: usize,
    c: [f32; 4],
    k_len: usize,
    a: impl Fn(&[[u32; GATHER_WORDS]; WARP], usize, usize) -> f64,
    b: impl Fn(&[[u32; GATHER_WORDS]; WARP], usize, usize) -> f64,
) -> [f32; 4] {
    let (g, t) = (lane >> 2, lane % 4);
    let mut d = [0.0f32; 4];
    for (r, out) in d.iter_mut().enumerate() {
        let (row, col) = (g + 8 * (r >> 1), 2 * t + (r & 1));
        let mut sum = f64::from(c[r]);
        for k in 0..k_len {
            sum += a(all, row, k) * b(all, k, col);
        }
        *out = sum as f32;
    }
    d
}
