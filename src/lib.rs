//! # pipefill
//!
//! The root crate: built-in layers (Linear + bias + fused activation) for CPU and CUDA using the PTX
//! compiled from `kernels/` by `build.rs`, the model description, and the `pipefill` command line.
//! The engine itself (schedules, simulator, partitioner, runtime, traces) is [`pipefill_host`].

pub mod alloc;
pub mod cli;
pub mod layers;
pub mod model;
pub mod ptx;
