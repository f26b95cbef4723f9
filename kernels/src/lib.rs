//! # pipefill-kernels
//!
//! The numerical kernels of pipefill's built-in layer, `Y = act(X W + b)`, its two backward passes,
//! the losses and the optimizers, written once in `no_std` Rust and built twice:
//!
//! - **for the host** (this crate as an ordinary dependency): the reference math the CPU path calls per
//!   row or per element, and that the tests compare against `f64`;
//! - **for the GPU** (`nvptx64-nvidia-cuda`, compiled to PTX by `pipefill-cuda`'s `build.rs`): the
//!   `extern "ptx-kernel"` entry points in the `gpu` module (only present in that build), which call the same
//!   scalar functions, so both paths compute the same formulas.
//!
//! Layout conventions: `f32`, row-major; `X` is `rows x in`, `W` is `in x out`, `b` and `db` have `out`
//! elements, `Y`/`Z`/`dY`/`dZ` are `rows x out`.
//!
//! | module | what |
//! | --- | --- |
//! | [`math`] | `exp`, `ln`, `sqrt`, `tanh`, `sigmoid` without `std` |
//! | [`activation`] | [`Activation`]: identity, ReLU, GELU (tanh form), SiLU; forward and derivative |
//! | [`epilogue`](mod@epilogue) | fused bias + activation (keeping the pre-activation), `dZ = dY act'(Z)`, `db += colsum(dZ)` |
//! | [`loss`] | MSE and softmax cross-entropy, forward and gradient |
//! | [`optim`] | SGD with momentum, AdamW |
//! | [`gemm`] | the reference GEMM (the definition the fast paths are tested against) |
//! | [`grid`] | [`Grid`]: the thread/block/shared-memory context a kernel body runs in; launch shapes |
//! | [`tile`] | the shared-memory tiling with register blocking of the GEMM kernels |
//! | [`tc`] | tensor-core GEMMs (`mma.sync`, `ldmatrix`, `cp.async`; TF32 and BF16): intrinsics with a host emulation, launch shapes |
//! | [`device`] | the kernel bodies (linear forward / backward-input / backward-weight, elementwise, losses) |
//! | [`entry`] | the names of the PTX entry points and their argument lists |
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, core_float_math)
)]
#![warn(missing_docs)]

pub mod activation;
pub mod device;
pub mod entry;
pub mod epilogue;
#[cfg(not(target_arch = "nvptx64"))]
pub mod gemm;
#[cfg(target_arch = "nvptx64")]
mod gpu;
pub mod grid;
pub mod loss;
pub mod math;
pub mod optim;
pub mod tc;
pub mod tile;

pub use activation::Activation;
#[cfg(not(target_arch = "nvptx64"))]
pub use activation::UnknownActivation;
pub use epilogue::{
    activation_backward, activation_backward_in_place, activation_forward, bias_activation,
    bias_grad_accumulate, epilogue,
};
#[cfg(not(target_arch = "nvptx64"))]
pub use gemm::{gemm_ref, GemmShape};
pub use grid::{elementwise_grid, gemm_grid, Grid, THREADS};
pub use loss::{mse_grad, mse_loss, softmax_ce_grad, softmax_ce_loss};
pub use optim::{AdamW, AdamWStep, SgdMomentum};
