#![warn(missing_docs)]
//! # pipefill
//!
//! The root crate: built-in layers (Linear + bias + fused activation) on the CPU, the PTX compiled
//! from `kernels/` by `build.rs` (embedded, checked with `ptxas`), the CUDA backend that runs it
//! ([`cuda`], driver loaded at run time), the model description, and the `pipefill` command line.
//! The engine itself (schedules, simulator, partitioner, runtime, traces) is [`pipefill_host`].

pub mod alloc;
pub mod checkpoint;
pub mod cli;
pub mod cuda;
pub mod layers;
pub mod model;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod ptx;
pub mod trainer;
