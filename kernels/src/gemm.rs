//! A plain reference GEMM, for tests and as the definition the fast paths are checked against.
//!
//! The CPU runtime multiplies with the `gemm`/`matrixmultiply` crates and the GPU with the tiled kernels;
//! this triple loop is the readable statement of what they compute, with the two transpositions a linear
//! layer needs (`dX = dZ W^T`, `dW = X^T dZ`).

/// The shape of `C = op(A) op(B) + beta C` on row-major buffers: `op(A)` is `m x k`, `op(B)` is `k x n`,
/// `C` is `m x n`. With `trans_a` the buffer `A` holds the `k x m` matrix whose transpose is used; with
/// `trans_b` the buffer `B` holds an `n x k` matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GemmShape {
    /// Rows of `op(A)` and of `C`.
    pub m: usize,
    /// Columns of `op(B)` and of `C`.
    pub n: usize,
    /// The shared (reduced) dimension.
    pub k: usize,
    /// Use `A^T`: `A` is stored `k x m`.
    pub trans_a: bool,
    /// Use `B^T`: `B` is stored `n x k`.
    pub trans_b: bool,
}

impl GemmShape {
    /// `op(A)[i][p]`.
    #[inline]
    fn a_at(&self, a: &[f32], i: usize, p: usize) -> f32 {
        if self.trans_a {
            a[p * self.m + i]
        } else {
            a[i * self.k + p]
        }
    }

    /// `op(B)[p][j]`.
    #[inline]
    fn b_at(&self, b: &[f32], p: usize, j: usize) -> f32 {
        if self.trans_b {
            b[j * self.k + p]
        } else {
            b[p * self.n + j]
        }
    }
}

/// `C = op(A) op(B) + beta C` (`beta = 0` overwrites `C`, ignoring what was there, NaN included;
/// `beta = 1` accumulates). Each dot product is summed in `f32` in order of `p`.
///
/// # Panics
/// If a buffer is smaller than its matrix.
pub fn gemm_ref(shape: GemmShape, a: &[f32], b: &[f32], beta: f32, c: &mut [f32]) {
    let GemmShape { m, n, k, .. } = shape;
    assert!(
        a.len() >= m * k,
        "A holds {} elements, needs {}",
        a.len(),
        m * k
    );
    assert!(
        b.len() >= k * n,
        "B holds {} elements, needs {}",
        b.len(),
        k * n
    );
    assert!(
        c.len() >= m * n,
        "C holds {} elements, needs {}",
        c.len(),
        m * n
    );
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for p in 0..k {
                acc += shape.a_at(a, i, p) * shape.b_at(b, p, j);
            }
            let cij = &mut c[i * n + j];
            *cij = if beta == 0.0 { acc } else { acc + beta * *cij };
        }
    }
}
