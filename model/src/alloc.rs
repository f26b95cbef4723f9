//! The C allocator's settings for training on CPU threads.
//!
//! `matrixmultiply` allocates a packing buffer on every GEMM call (288 KiB for the built-in layer's
//! 32 x 256 x 256 products) and frees it at the end. glibc's `malloc` hands such a buffer out from
//! the top of the heap and, on a worker thread's arena, gives the pages back to the kernel when it is
//! freed, so the next call takes a page fault for every 4 KiB page it touches again: about 800 page
//! faults per step of `pipefill train` (measured with `/usr/bin/time`; `perf record -e page-faults`
//! puts 97 % of them in `matrixmultiply`'s packing), a quarter of the process's system time.
//! [`keep_freed_memory`] tells glibc to keep freed memory for reuse instead.
//!
//! The `pipefill` command and the benches call it first thing. A trainer embedding
//! `pipefill-host` with the built-in layers can call it too, or set the same through the environment
//! (`MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_MMAP_THRESHOLD_=33554432`), or use an allocator that
//! caches per thread.

/// Makes glibc's `malloc` keep freed memory in the process (blocks up to 32 MiB come from the heap,
/// and the heap is not trimmed below 1 GiB of free space) rather than return it to the kernel and
/// fault it back in on the next allocation. Returns `true` if the settings were applied; on other
/// C libraries it does nothing and returns `false`.
///
/// Call it before starting threads. The cost: up to the step's peak of freed memory stays
/// mapped (for the built-in model, a few MiB per thread).
///
/// ```
/// let applied = pipefill_model::alloc::keep_freed_memory();
/// assert_eq!(applied, cfg!(all(target_os = "linux", target_env = "gnu")));
/// ```
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // 32 MiB is glibc's largest mmap threshold on 64-bit targets (a larger value is refused).
        // Setting either value also turns off glibc's dynamic adjustment of both.
        // SAFETY: mallopt only changes allocator parameters; it is safe to call at any time.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
