//! The cuBLAS / cuBLASLt references of the kernels bench, for row-major matrices (cuBLAS is
//! column-major: a row-major `M x N` matrix is its transpose column-major, leading dimension `N`).

use std::sync::Arc;

use cudarc::cublas::sys::{cublasMath_t, cublasOperation_t, cublasStatus_t};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::cublaslt::{Activation as LtAct, CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

/// The three products in row-major terms: `Y = X W`, `dX = dZ W^T`, `dW += X^T dZ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gemm3 {
    /// `Y (rows x out) = X (rows x in) W (in x out)`.
    Forward,
    /// `dX (rows x in) = dZ (rows x out) W^T`.
    InputGrad,
    /// `dW (in x out) += X^T dZ`.
    WeightGrad,
}

/// cuBLAS handles on one stream: plain SGEMM (exact fp32), SGEMM in TF32 math mode, cuBLASLt.
pub struct Blas {
    pub exact: CudaBlas,
    pub tf32: CudaBlas,
    pub lt: CudaBlasLT,
}

/// Whether libcublas and libcublasLt can be loaded (cudarc panics at the first call otherwise).
pub fn present() -> bool {
    // SAFETY: only tries to dlopen the libraries cudarc would use.
    unsafe { cudarc::cublas::sys::is_culib_present() && cudarc::cublaslt::sys::is_culib_present() }
}

impl Blas {
    /// The three handles on `stream`, the second switched to TF32 tensor-core math
    /// (`cublasSetMathMode(CUBLAS_TF32_TENSOR_OP_MATH)`: cudarc's `Gemm<f32>` is SGEMM, and this mode
    /// lets SGEMM round its inputs to TF32).
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self, String> {
        let exact = CudaBlas::new(stream.clone()).map_err(|e| format!("cublasCreate: {e:?}"))?;
        let tf32 = CudaBlas::new(stream.clone()).map_err(|e| format!("cublasCreate: {e:?}"))?;
        // SAFETY: a valid handle; the mode is a plain enum value.
        let rc = unsafe {
            cudarc::cublas::sys::cublasSetMathMode(
                *tf32.handle(),
                cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
            )
        };
        if rc != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(format!("cublasSetMathMode(TF32): {rc:?}"));
        }
        let lt = CudaBlasLT::new(stream.clone()).map_err(|e| format!("cublasLtCreate: {e:?}"))?;
        Ok(Blas { exact, tf32, lt })
    }
}

fn op(t: bool) -> cublasOperation_t {
    if t {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

/// The column-major call of a row-major product: `(transa, transb, m, n, k, lda, ldb, ldc)`, with the
/// operands passed as `(A, B) = (second, first)` of the row-major product.
fn layout(g: Gemm3, rows: usize, inputs: usize, outputs: usize) -> (bool, bool, [usize; 6]) {
    match g {
        // Y^T = W^T X^T: A = W (out x in col-major, ld out), B = X (in x rows, ld in).
        Gemm3::Forward => (
            false,
            false,
            [outputs, rows, inputs, outputs, inputs, outputs],
        ),
        // dX^T = W dZ^T: A = W viewed (out x in), transposed; B = dZ (out x rows, ld out).
        Gemm3::InputGrad => (
            true,
            false,
            [inputs, rows, outputs, outputs, outputs, inputs],
        ),
        // dW^T = dZ^T X: A = dZ (out x rows, ld out); B = X viewed (in x rows), transposed.
        Gemm3::WeightGrad => (
            false,
            true,
            [outputs, inputs, rows, outputs, inputs, outputs],
        ),
    }
}

/// `c = a_row * b_row` (row-major meaning of [`Gemm3`]; `beta` 1 accumulates) with `blas`'s SGEMM.
/// `first` and `second` are the row-major product's left and right operands (`X, W`; `dZ, W`; `X, dZ`).
pub fn sgemm(
    blas: &CudaBlas,
    g: Gemm3,
    (rows, inputs, outputs): (usize, usize, usize),
    first: &CudaSlice<f32>,
    second: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
    beta: f32,
) -> Result<(), String> {
    let (ta, tb, [m, n, k, lda, ldb, ldc]) = layout(g, rows, inputs, outputs);
    let i = |v: usize| i32::try_from(v).map_err(|_| format!("{v} does not fit cuBLAS's int"));
    let cfg = GemmConfig {
        transa: op(ta),
        transb: op(tb),
        m: i(m)?,
        n: i(n)?,
        k: i(k)?,
        alpha: 1.0f32,
        lda: i(lda)?,
        ldb: i(ldb)?,
        beta,
        ldc: i(ldc)?,
    };
    // SAFETY: the sizes above are the buffers' (the bench allocates them for this shape).
    unsafe { blas.gemm(cfg, second, first, c) }.map_err(|e| format!("cublasSgemm: {e:?}"))
}

fn lt_config((rows, inputs, outputs): (usize, usize, usize)) -> MatmulConfig {
    let (_, _, [m, n, k, lda, ldb, ldc]) = layout(Gemm3::Forward, rows, inputs, outputs);
    MatmulConfig {
        transa: false,
        transb: false,
        transc: false,
        m: m as u64,
        n: n as u64,
        k: k as u64,
        alpha: 1.0,
        lda: lda as i64,
        ldb: ldb as i64,
        beta: 0.0,
        ldc: ldc as i64,
        stride_a: None,
        stride_b: None,
        stride_c: None,
        stride_bias: None,
        batch_size: None,
    }
}

/// `Y = gelu(X W + b)` with cuBLASLt's fused GELU + bias epilogue, TF32 compute
/// (`CUBLAS_COMPUTE_32F_FAST_TF32`: cudarc's `Matmul<f32>`).
pub fn lt_gelu_tf32(
    lt: &CudaBlasLT,
    shape: (usize, usize, usize),
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), String> {
    // SAFETY: as in `sgemm`; the bias holds `outputs` values (the rows of column-major `Y^T`).
    unsafe { Matmul::<f32>::matmul(lt, lt_config(shape), w, x, y, Some(b), Some(&LtAct::Gelu)) }
        .map_err(|e| format!("cublasLtMatmul tf32: {e:?}"))
}

/// [`lt_gelu_tf32`] with BF16 inputs, bias and output (`f32` compute).
pub fn lt_gelu_bf16(
    lt: &CudaBlasLT,
    shape: (usize, usize, usize),
    x: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    b: &CudaSlice<bf16>,
    y: &mut CudaSlice<bf16>,
) -> Result<(), String> {
    // SAFETY: as in `lt_gelu_tf32`.
    unsafe { Matmul::<bf16>::matmul(lt, lt_config(shape), w, x, y, Some(b), Some(&LtAct::Gelu)) }
        .map_err(|e| format!("cublasLtMatmul bf16: {e:?}"))
}
