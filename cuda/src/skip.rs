//! The one convention for tests and benches that need a GPU: [`gpu_or_skip`]. Without a usable
//! device it prints [`SKIP_LINE`] and the caller returns early (the test passes); with
//! `PIPEFILL_REQUIRE_GPU=1` (a GPU runner) it panics instead, so a GPU check cannot pass by
//! skipping where a GPU is expected.

use std::sync::Arc;

use super::device::Gpu;

/// What a GPU test prints when it skips.
pub const SKIP_LINE: &str = "skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail instead)";

/// The environment variable that turns a skip into a failure.
pub const REQUIRE_GPU_VAR: &str = "PIPEFILL_REQUIRE_GPU";

/// Whether a value of `PIPEFILL_REQUIRE_GPU` asks for a GPU (any value but unset, empty and `0`).
pub fn gpu_required(value: Option<&str>) -> bool {
    matches!(value, Some(v) if !v.is_empty() && v != "0")
}

/// Device 0 with the embedded PTX loaded, or `None` after printing [`SKIP_LINE`] (and why) when CUDA
/// is unavailable here.
///
/// # Panics
/// When CUDA is unavailable and `PIPEFILL_REQUIRE_GPU` asks for a GPU, and whenever a device is
/// present but unusable for another reason (the PTX missing or refused by the driver): those are
/// failures, not machines without a GPU.
pub fn gpu_or_skip(what: &str) -> Option<Arc<Gpu>> {
    let required = gpu_required(std::env::var(REQUIRE_GPU_VAR).ok().as_deref());
    match Gpu::open(0) {
        Ok(gpu) => {
            if let Err(e) = gpu.module() {
                panic!("{what}: a CUDA device is present but unusable: {e}");
            }
            Some(gpu)
        }
        Err(e) if e.is_unavailable() && !required => {
            println!("{SKIP_LINE}\n  ({what}: {e})");
            None
        }
        Err(e) => panic!(
            "{what}: {e}, and {REQUIRE_GPU_VAR}=1 asks for a GPU: run on a machine with the NVIDIA \
             driver and a device, or unset {REQUIRE_GPU_VAR}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::gpu_required;

    #[test]
    fn only_a_non_zero_value_requires_a_gpu() {
        assert!(!gpu_required(None));
        assert!(!gpu_required(Some("")));
        assert!(!gpu_required(Some("0")));
        assert!(gpu_required(Some("1")));
        assert!(gpu_required(Some("yes")));
    }
}
