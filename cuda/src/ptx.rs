//! The PTX compiled from `kernels/` by `build.rs`, embedded in the binary, and the names of its entry points.
//!
//! `build.rs` compiles the `pipefill-kernels` crate for `nvptx64-nvidia-cuda` (`sm_80`, which also loads on
//! every later architecture) with rustc's own NVPTX backend. When it cannot (most often because the
//! `rust-src` component is missing) the build still succeeds, [`PTX`] is `None`, and [`ptx`] returns
//! [`PtxError::NotBuilt`] with the fix. The CPU path never needs the PTX.
//!
//! Every entry point's arguments, launch shape and meaning are documented on the kernel itself in
//! `kernels/src/gpu/` and summarised in [`entry`].

/// The PTX text as `build.rs` wrote it (empty when it was not built).
const RAW: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// Why the PTX was not built (empty when it was).
const NOTE: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels-ptx-note.txt"));

/// The embedded PTX module (one module with every kernel), or `None` when `build.rs` could not build it.
pub const PTX: Option<&str> = if RAW.is_empty() { None } else { Some(RAW) };

/// The PTX could not be provided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PtxError {
    /// `build.rs` did not build the PTX; `reason` is what it reported (for example that `rust-src` is missing).
    #[error("PTX not built: run `rustup component add rust-src` and rebuild (build.rs reported: {reason})")]
    NotBuilt {
        /// The reason `build.rs` gave.
        reason: &'static str,
    },
}

/// The embedded PTX, or [`PtxError::NotBuilt`] saying how to get it.
pub fn ptx() -> Result<&'static str, PtxError> {
    PTX.ok_or(PtxError::NotBuilt {
        reason: NOTE.trim(),
    })
}

/// The names of the kernels in [`PTX`] (the `.entry` symbols), one constant per kernel, so host code never
/// spells them by hand. Arguments and launch shapes are documented on each kernel in `kernels/src/gpu/`.
pub mod entry {
    pub use pipefill_kernels::entry::*;
}

/// Launch shapes of the tensor-core kernels (`*_TF32`, `*_BF16` in [`entry`]): [`launch`](tensor_core::launch)
/// gives grid, block and dynamic shared memory (above 48 KiB: raise the function's
/// `MAX_DYNAMIC_SHARED_SIZE_BYTES` before the first launch), [`entry_name`](tensor_core::entry_name) the
/// entry for a product and precision. Documented in `pipefill_kernels::tc`.
pub mod tensor_core {
    pub use pipefill_kernels::tc::{
        entry_name, launch, Launch, Precision, Product, MAX_SHARED_BYTES,
    };
}
