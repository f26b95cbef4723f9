//! Where a kernel body runs: the [`Grid`] a body asks for its thread and block, its shared memory and its
//! barrier; plus the launch shapes every kernel expects ([`THREADS`], [`gemm_grid`], [`elementwise_grid`]).
//!
//! The kernel bodies in [`crate::device`] are written once against this trait. On the GPU the
//! `extern "ptx-kernel"` entry points implement it with the PTX special registers, `bar.sync` and a static
//! `.shared` array. On the host the tests implement it with one OS thread per GPU thread and a
//! `std::sync::Barrier` per block, which runs the very same bodies (index math, bounds checks, tiling,
//! shared-memory phases) on awkward sizes against an `f64` reference.

/// Threads per block for every kernel in this crate (1-D blocks). The bodies rely on it: launching with
/// another block size is refused (the GEMM kernels trap).
pub const THREADS: usize = 256;

/// `f32` elements of shared memory a block needs (the largest kernel's need: the two GEMM tiles).
pub const SHARED_FLOATS: usize = crate::tile::SHARED_FLOATS;

/// The execution context of one GPU thread, as a kernel body sees it.
///
/// # Safety
/// Implementations must make [`Grid::shared`] point at [`SHARED_FLOATS`] `f32` that every thread of the
/// block sees and no other block does, and [`Grid::sync_threads`] must be a barrier over the block's
/// threads that orders their memory accesses (as `__syncthreads()` does).
pub unsafe trait Grid {
    /// This thread's index in its block, `0..block_dim()`.
    fn thread(&self) -> usize;
    /// This block's index in the grid, `(x, y)`.
    fn block(&self) -> (usize, usize);
    /// Threads per block.
    fn block_dim(&self) -> usize;
    /// Blocks in the grid, `(x, y)`.
    fn grid_dim(&self) -> (usize, usize);
    /// Waits until every thread of the block has reached this point; shared-memory writes before it are
    /// visible to every thread after it.
    fn sync_threads(&self);
    /// The block's shared memory ([`SHARED_FLOATS`] floats).
    fn shared(&self) -> *mut f32;
    /// Aborts the kernel: a launch-contract violation (wrong block size) that must not compute garbage.
    fn trap(&self) -> !;

    /// This thread's index in a 1-D grid of 1-D blocks, and the total number of threads (the stride of a
    /// grid-stride loop).
    #[inline]
    fn global_1d(&self) -> (usize, usize) {
        (
            self.block().0 * self.block_dim() + self.thread(),
            self.grid_dim().0 * self.block_dim(),
        )
    }
}

/// The grid of a GEMM kernel producing an `m x n` output: `(ceil(n / 64), ceil(m / 64), 1)` blocks of
/// [`THREADS`] threads (one 64 x 64 output tile per block), at least one block per dimension (CUDA refuses an
/// empty grid; a block over an empty output writes nothing, and an empty reduced dimension gives `0` sums).
#[inline]
pub const fn gemm_grid(m: usize, n: usize) -> (u32, u32, u32) {
    (
        at_least_one(n.div_ceil(crate::tile::BN)),
        at_least_one(m.div_ceil(crate::tile::BM)),
        1,
    )
}

/// `blocks` as a grid dimension, at least 1.
#[inline]
const fn at_least_one(blocks: usize) -> u32 {
    if blocks == 0 {
        1
    } else {
        blocks as u32
    }
}

/// Most blocks an elementwise or reduction kernel is launched with; the bodies loop (grid-stride) over
/// whatever is left, so any grid size is correct.
pub const MAX_ELEMENTWISE_BLOCKS: usize = 1024;

/// The grid of an elementwise or reduction kernel over `n` items: enough blocks of [`THREADS`] threads for one
/// item per thread, capped at [`MAX_ELEMENTWISE_BLOCKS`], at least one.
#[inline]
pub const fn elementwise_grid(n: usize) -> (u32, u32, u32) {
    let blocks = n.div_ceil(THREADS);
    let blocks = if blocks > MAX_ELEMENTWISE_BLOCKS {
        MAX_ELEMENTWISE_BLOCKS
    } else {
        blocks
    };
    (at_least_one(blocks), 1, 1)
}
