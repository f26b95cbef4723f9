//! The host emulator of the tensor-core instructions: a block of 256 OS threads (as `launch` in the parent
//! module) whose warps exchange fragments through a per-warp scratch and barrier, so the crate's default
//! [`TensorCore`] methods compute `mma` and `ldmatrix` from the fragments of all 32 lanes.
//!
//! `cp.async` is performed as late as the PTX allows: a copy lands in shared memory only when a
//! `cp.async.wait_group` releases its group. A kernel that reads a stage before waiting for it reads the
//! NaN fill (or an older tile), and its results are wrong. Every shared access is bounds- and
//! alignment-checked.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Barrier;

use pipefill_kernels::grid::{Grid, SHARED_FLOATS, THREADS};
use pipefill_kernels::tc::warp::{GATHER_WORDS, WARP};
use pipefill_kernels::tc::{Launch, TensorCore};

use super::Shared;

/// One pending 16-byte copy: shared offset, source, bytes to copy (the rest of the 16 is zeroed).
type Copy16 = (u32, *const u8, u32);

/// What a warp's lanes share: a barrier over the 32 and a slot per lane.
struct WarpShared {
    barrier: Barrier,
    slots: Shared<*mut [u32; GATHER_WORDS]>,
}

/// One emulated GPU thread with the tensor-core instructions.
pub struct TcGrid<'a> {
    tid: usize,
    block: (usize, usize),
    grid: (usize, usize),
    barrier: &'a Barrier,
    warp: &'a WarpShared,
    smem: *mut u8,
    smem_bytes: u32,
    static_smem: *mut f32,
    open: RefCell<Vec<Copy16>>,
    committed: RefCell<VecDeque<Vec<Copy16>>>,
}

impl TcGrid<'_> {
    /// Performs a copy (as the hardware would when it completes).
    fn perform(&self, (dst, src, bytes): Copy16) {
        // SAFETY: checked at issue: dst..dst+16 inside the shared memory, src valid for `bytes`.
        unsafe {
            let d = self.smem.add(dst as usize);
            std::ptr::copy_nonoverlapping(src, d, bytes as usize);
            std::ptr::write_bytes(d.add(bytes as usize), 0, 16 - bytes as usize);
        }
    }
}

// SAFETY: the block's threads share `smem` (`smem_bytes`) and `barrier`; a warp's 32 threads share `warp`;
// copies complete at the wait that releases their group.
unsafe impl Grid for TcGrid<'_> {
    fn thread(&self) -> usize {
        self.tid
    }
    fn block(&self) -> (usize, usize) {
        self.block
    }
    fn block_dim(&self) -> usize {
        THREADS
    }
    fn grid_dim(&self) -> (usize, usize) {
        self.grid
    }
    fn sync_threads(&self) {
        self.barrier.wait();
    }
    fn shared(&self) -> *mut f32 {
        self.static_smem
    }
    fn trap(&self) -> ! {
        panic!("kernel trapped")
    }
}

// SAFETY: see the `Grid` impl.
unsafe impl TensorCore for TcGrid<'_> {
    fn tc_shared(&self) -> *mut u8 {
        self.smem
    }

    fn check_shared(&self, off: u32, bytes: u32, align: u32) {
        assert!(
            off % align == 0 && off + bytes <= self.smem_bytes,
            "shared access of {bytes} bytes at {off} (alignment {align}) outside {} bytes",
            self.smem_bytes
        );
    }

    fn warp_gather(&self, words: [u32; GATHER_WORDS]) -> [[u32; GATHER_WORDS]; WARP] {
        let slots = *self.warp.slots.get();
        // SAFETY: each lane writes its own slot, reads all after the barrier, and nobody writes again
        // before the second barrier.
        unsafe {
            slots.add(self.lane()).write(words);
            self.warp.barrier.wait();
            let mut all = [[0u32; GATHER_WORDS]; WARP];
            for (lane, w) in all.iter_mut().enumerate() {
                *w = slots.add(lane).read();
            }
            self.warp.barrier.wait();
            all
        }
    }

    unsafe fn cp_async16(&self, dst: u32, src: *const u8, src_bytes: u32) {
        self.check_shared(dst, 16, 16);
        assert!(
            src_bytes == 0 || src_bytes == 16,
            "cp.async of {src_bytes} bytes"
        );
        assert!(
            src_bytes == 0 || (src as usize) % 16 == 0,
            "cp.async source {src:?} not 16-byte aligned"
        );
        self.open.borrow_mut().push((dst, src, src_bytes));
    }

    fn cp_async_commit(&self) {
        let group = std::mem::take(&mut *self.open.borrow_mut());
        self.committed.borrow_mut().push_back(group);
    }

    fn cp_async_wait<const N: u32>(&self) {
        loop {
            let group = {
                let mut committed = self.committed.borrow_mut();
                if committed.len() <= N as usize {
                    break;
                }
                committed.pop_front()
            };
            for copy in group.into_iter().flatten() {
                self.perform(copy);
            }
        }
    }
}

/// Runs `body` as a CUDA launch of `launch` would (block `(THREADS, 1, 1)` required): each block as
/// `THREADS` OS threads with a barrier, warps of 32 with their own, and `launch.shared_bytes` of dynamic
/// shared memory filled with `0xff` bytes (NaN as `f32` and as BF16). Blocks run one after another.
pub fn launch_tc(launch: Launch, body: impl Fn(&TcGrid) + Sync) {
    assert_eq!(launch.block, (THREADS as u32, 1, 1), "block shape");
    let dims = (launch.grid.0 as usize, launch.grid.1 as usize);
    let bytes = launch.shared_bytes as usize;
    for by in 0..dims.1 {
        for bx in 0..dims.0 {
            // u128 storage: 16-byte aligned, as CUDA's dynamic shared memory is.
            let mut smem = vec![u128::MAX; bytes.div_ceil(16)];
            let mut static_smem = vec![f32::NAN; SHARED_FLOATS];
            let mut slots = vec![[0u32; GATHER_WORDS]; THREADS];
            let ptrs = Shared((
                smem.as_mut_ptr().cast::<u8>(),
                static_smem.as_mut_ptr(),
                slots.as_mut_ptr(),
            ));
            let barrier = Barrier::new(THREADS);
            let warps: Vec<WarpShared> = (0..THREADS / WARP)
                .map(|w| WarpShared {
                    barrier: Barrier::new(WARP),
                    // SAFETY: each warp's 32 slots lie inside `slots`.
                    slots: Shared(unsafe { ptrs.get().2.add(w * WARP) }),
                })
                .collect();
            std::thread::scope(|s| {
                for tid in 0..THREADS {
                    let (body, barrier, warp, ptrs) = (&body, &barrier, &warps[tid / WARP], &ptrs);
                    s.spawn(move || {
                        body(&TcGrid {
                            tid,
                            block: (bx, by),
                            grid: dims,
                            barrier,
                            warp,
                            smem: ptrs.get().0,
                            smem_bytes: bytes as u32,
                            static_smem: ptrs.get().1,
                            open: RefCell::new(Vec::new()),
                            committed: RefCell::new(VecDeque::new()),
                        })
                    });
                }
            });
        }
    }
}
