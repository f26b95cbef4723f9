//! Tensor-core GEMMs for the three products of a linear layer (`X W`, `dZ W^T`, `X^T dZ`), in TF32 or BF16
//! with `f32` accumulation, and their launch shapes.
//!
//! | module | what |
//! | --- | --- |
//! | [`warp`] | [`TensorCore`]: `mma.sync`, `ldmatrix`, `cp.async`, shared loads; their host meaning |
//! | [`convert`] | TF32 and BF16 rounding |
//! | [`precision`] | [`Tf32`] and [`Bf16`]: storage types and fragment loads |
//! | [`mainloop`] | the block tile: `cp.async` stage ring, warp tiles of `mma`, edges |
//!
//! The kernel bodies are in [`crate::device::linear_tc`]; the entry names in [`crate::entry`].
//!
//! # Launching (the one place the host launcher needs)
//! [`launch`]`(product, precision, rows, inputs, outputs)` gives the grid, the block (always
//! [`THREADS`] x 1 x 1) and the *dynamic* shared memory in bytes; [`entry_name`] gives the PTX entry. Every
//! tensor-core kernel needs more than 48 KiB of dynamic shared memory, so before the first launch the
//! launcher must raise the function's limit: `cuFuncSetAttribute(f,
//! CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.shared_bytes)` (cudarc:
//! `CudaFunction::set_attribute`). [`MAX_SHARED_BYTES`] is the largest any of them asks for (fits sm_80's
//! 163 KiB and sm_90's 227 KiB per block).

pub mod convert;
pub mod mainloop;
pub mod precision;
pub mod warp;

pub use precision::{Bf16, MmaType, SmemTile, Tf32};
pub use warp::TensorCore;

use crate::grid::THREADS;
use mainloop::shared_bytes;

/// Input precision of a tensor-core GEMM (accumulation is always `f32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// `f32` buffers; inputs rounded to TF32 (10-bit mantissa) inside the kernel.
    Tf32,
    /// BF16 activations, gradients of activations and weights (`u16` bits); `f32` bias, `dW`, `db`.
    Bf16,
}

/// One of the three GEMMs of a linear layer `Y = act(X W + b)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Product {
    /// `Z = X W + b`, `Y = act(Z)`: output `rows x outputs`, reduced over `inputs`.
    Forward,
    /// `dZ = dY act'(Z)`, `dX = dZ W^T`: output `rows x inputs`, reduced over `outputs`.
    BackwardInput,
    /// `dW += X^T dZ`, `db += colsum(dZ)`: output `inputs x outputs`, reduced over `rows`.
    BackwardWeight,
}

/// Block tile `(BM, BN)` of a product: 128 x 128 for the two products whose output has a row per sample;
/// 64 x 128 for the weight gradient, whose output (`inputs x outputs`) is often the smallest, so that it
/// still spreads over the GPU's SMs.
pub const fn block_tile(product: Product) -> (usize, usize) {
    match product {
        Product::Forward | Product::BackwardInput => (128, 128),
        Product::BackwardWeight => (64, 128),
    }
}

/// Warp tile `(MI, NI)` in 16 x 8 MMA blocks of a product (8 warps cover the block tile).
pub const fn warp_tile(product: Product) -> (usize, usize) {
    match product {
        Product::Forward | Product::BackwardInput => (4, 4),
        Product::BackwardWeight => (2, 4),
    }
}

/// `BK`, the reduced depth of one shared-memory stage: 64 bytes of each row either way.
pub const fn depth(precision: Precision) -> usize {
    match precision {
        Precision::Tf32 => 16,
        Precision::Bf16 => 32,
    }
}

/// Whether a product's `A` and `B` are stored k-contiguous (`[mn][k]`) in global memory.
pub const fn k_contiguous(product: Product) -> (bool, bool) {
    match product {
        Product::Forward => (true, false),
        Product::BackwardInput => (true, true),
        Product::BackwardWeight => (false, false),
    }
}

/// Dynamic shared memory, in bytes, a product's kernel needs in a precision.
pub const fn shared_bytes_of(product: Product, precision: Precision) -> usize {
    let (bm, bn) = block_tile(product);
    let (ak, bk_contig) = k_contiguous(product);
    let bk = depth(precision);
    match precision {
        Precision::Tf32 => shared_bytes::<Tf32>(ak, bk_contig, bm, bn, bk),
        Precision::Bf16 => shared_bytes::<Bf16>(ak, bk_contig, bm, bn, bk),
    }
}

/// The most dynamic shared memory any tensor-core kernel asks for.
pub const MAX_SHARED_BYTES: usize = {
    let ps = [Precision::Tf32, Precision::Bf16];
    let qs = [
        Product::Forward,
        Product::BackwardInput,
        Product::BackwardWeight,
    ];
    let mut max = 0;
    let mut i = 0;
    while i < 6 {
        let b = shared_bytes_of(qs[i % 3], ps[i / 3]);
        if b > max {
            max = b;
        }
        i += 1;
    }
    max
};

// Every kernel fits an sm_80 block's opt-in maximum (163 KiB; sm_90: 227 KiB).
const _: () = assert!(MAX_SHARED_BYTES <= 163 << 10);

/// Grid, block and dynamic shared memory of one kernel launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Blocks `(x, y, z)`: `x` along the output's columns, `y` along its rows; at least 1 each.
    pub grid: (u32, u32, u32),
    /// Threads per block: always `(THREADS, 1, 1)`.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory in bytes (above 48 KiB: see the module docs).
    pub shared_bytes: u32,
}

/// The launch of `product` in `precision` for a layer of `inputs -> outputs` features on `rows` rows.
pub const fn launch(
    product: Product,
    precision: Precision,
    rows: usize,
    inputs: usize,
    outputs: usize,
) -> Launch {
    let (m, n) = match product {
        Product::Forward => (rows, outputs),
        Product::BackwardInput => (rows, inputs),
        Product::BackwardWeight => (inputs, outputs),
    };
    let (bm, bn) = block_tile(product);
    Launch {
        grid: (
            at_least_one(n.div_ceil(bn)),
            at_least_one(m.div_ceil(bm)),
            1,
        ),
        block: (THREADS as u32, 1, 1),
        shared_bytes: shared_bytes_of(product, precision) as u32,
    }
}

/// The PTX entry of `product` in `precision` (a constant of [`crate::entry`]).
pub const fn entry_name(product: Product, precision: Precision) -> &'static str {
    use crate::entry::*;
    match (product, precision) {
        (Product::Forward, Precision::Tf32) => LINEAR_FORWARD_TF32,
        (Product::BackwardInput, Precision::Tf32) => LINEAR_BACKWARD_INPUT_TF32,
        (Product::BackwardWeight, Precision::Tf32) => LINEAR_BACKWARD_WEIGHT_TF32,
        (Product::Forward, Precision::Bf16) => LINEAR_FORWARD_BF16,
        (Product::BackwardInput, Precision::Bf16) => LINEAR_BACKWARD_INPUT_BF16,
        (Product::BackwardWeight, Precision::Bf16) => LINEAR_BACKWARD_WEIGHT_BF16,
    }
}

/// `blocks` as a grid dimension, at least 1.
const fn at_least_one(blocks: usize) -> u32 {
    if blocks == 0 {
        1
    } else {
        blocks as u32
    }
}
