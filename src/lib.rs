#![warn(missing_docs)]
//! # pipefill
//!
//! The root crate: the training loop ([`trainer`]), the `pipefill` command line ([`cli`]) and MPI
//! ranks (`mpi`, with the feature `mpi`),
//! over the workspace's libraries, re-exported here under their short names:
//!
//! | crate | here | what |
//! | --- | --- | --- |
//! | `pipefill-host` | [`pipefill_host`] | the engine: schedules, simulator, partitioner, planner, runtime, traces |
//! | `pipefill-model` | [`layers`], [`model`], [`checkpoint`], [`alloc`] | the built-in model on the CPU and its checkpoints |
//! | `pipefill-cuda` | [`cuda`], [`ptx`] | the CUDA backend and the PTX its build script compiles from `kernels/` |
//! | `pipefill-kernels` | - | the kernels: PTX for the GPU, reference math on the host |

pub mod cli;

/// The README's code samples, compiled and run by `cargo test --doc` so that they cannot drift
/// from the API (its `rust` block; the `sh`, `toml`, `python` and `text` blocks are not Rust).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeSamples;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod trainer;

pub use pipefill_cuda as cuda;
pub use pipefill_cuda::ptx;
pub use pipefill_model::{alloc, checkpoint, layers, model};
