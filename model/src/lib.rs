#![warn(missing_docs)]
//! # pipefill-model
//!
//! pipefill's built-in model on the CPU, as a library: the layers (Linear + bias + fused
//! activation, [`layers`]), the model description and its synthetic data ([`model`]), checkpoints
//! of every rank's weights and optimizer state ([`checkpoint`]), and the C allocator's settings
//! for training on threads ([`alloc`]). The same formulas run on the GPU in `pipefill-cuda`; the
//! engine that schedules and runs the stages is `pipefill-host`, and the `pipefill` command line
//! puts them together.

pub mod alloc;
pub mod checkpoint;
pub mod layers;
pub mod model;
