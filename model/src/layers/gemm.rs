//! Matrix products for the CPU layers through a well-kept GEMM crate, single-threaded (one rank is
//! one thread): [`matrixmultiply`] or, with the crate feature `gemm`,
//! [`gemm`](https://docs.rs/gemm), chosen by [`GemmBackend`].
//!
//! Both were measured on this project's layer shapes (docs/measurements.md, "GEMM crate"); the default is the
//! faster one there, and the other is left out of the default build (it costs compile time).
//! Transposes are expressed through strides, never copied.

use std::str::FromStr;

/// Which GEMM crate multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmBackend {
    /// `matrixmultiply::sgemm` (built without its threading feature: one thread).
    #[default]
    Matrixmultiply,
    /// `gemm::gemm` with `Parallelism::None` (crate feature `gemm`).
    #[cfg(feature = "gemm")]
    Gemm,
}

pipefill_host::named_enum!(GemmBackend {
    Matrixmultiply => "matrixmultiply",
    #[cfg(feature = "gemm")]
    Gemm => "gemm",
});

impl FromStr for GemmBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(b) = GemmBackend::from_name(s) {
            return Ok(b);
        }
        if s == "gemm" {
            return Err(
                "this build has no `gemm` backend: rebuild with `--features gemm` \
                        (for example `cargo run --release --features gemm -- ...`), or use \
                        `matrixmultiply`"
                    .to_string(),
            );
        }
        let names: Vec<&str> = GemmBackend::ALL.iter().map(|b| b.name()).collect();
        Err(format!(
            "unknown GEMM backend `{s}`: use {}",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(" or ")
        ))
    }
}

/// A read-only `rows x cols` view of row-major data, possibly transposed (by strides).
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// The row-major `rows x cols` matrix in `data`.
    ///
    /// # Panics
    /// If `data.len() != rows * cols` (a bug in the caller: layers check shapes first).
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "matrix data does not fit its shape"
        );
        MatRef {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        MatRef {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }
}

/// `C = beta * C + A B` with `C` row-major `a.rows x b.cols`. With `beta == 0`, `C` is overwritten.
///
/// # Panics
/// If the shapes disagree (a bug in the caller).
pub fn matmul(backend: GemmBackend, a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32], beta: f32) {
    assert_eq!(a.cols, b.rows, "inner dimensions of a product differ");
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(c.len(), m * n, "product output does not fit its shape");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.iter_mut().for_each(|v| *v *= beta);
        return;
    }
    // SAFETY: every index the libraries touch is `i * row_stride + j * col_stride` with `i < rows`,
    // `j < cols` of a view whose data holds `rows * cols` values with exactly those strides (checked
    // in `MatRef::new`, kept by `t`), and `c` holds `m * n` values, row-major (checked above).
    unsafe {
        match backend {
            GemmBackend::Matrixmultiply => matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.data.as_ptr(),
                a.row_stride as isize,
                a.col_stride as isize,
                b.data.as_ptr(),
                b.row_stride as isize,
                b.col_stride as isize,
                beta,
                c.as_mut_ptr(),
                n as isize,
                1,
            ),
            #[cfg(feature = "gemm")]
            GemmBackend::Gemm => gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                beta != 0.0,
                a.data.as_ptr(),
                a.col_stride as isize,
                a.row_stride as isize,
                b.data.as_ptr(),
                b.col_stride as isize,
                b.row_stride as isize,
                beta,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `C = A B` in f64, straight from the definition.
    fn reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                    .sum();
            }
        }
        c
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn both_backends_match_the_definition_with_transposes_and_beta() {
        let (m, k, n) = (7, 13, 5);
        let a = values(m * k, 1);
        let b = values(k * n, 2);
        let want = reference(&a, &b, m, k, n);
        // A^T and B^T stored row-major, then viewed transposed again.
        let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
        let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
        for &backend in GemmBackend::ALL {
            let mut c = vec![0.5f32; m * n];
            matmul(
                backend,
                MatRef::new(&a, m, k),
                MatRef::new(&b, k, n),
                &mut c,
                0.0,
            );
            let mut c2 = vec![1.0f32; m * n];
            matmul(
                backend,
                MatRef::new(&at, k, m).t(),
                MatRef::new(&bt, n, k).t(),
                &mut c2,
                1.0,
            );
            for i in 0..m * n {
                assert!((c[i] as f64 - want[i]).abs() < 1e-5, "{backend} {i}");
                assert!(
                    (c2[i] as f64 - want[i] - 1.0).abs() < 1e-5,
                    "{backend} beta {i}"
                );
            }
        }
    }

    #[test]
    fn backend_names_parse_and_a_missing_backend_names_the_fix() {
        assert_eq!(
            "matrixmultiply".parse::<GemmBackend>(),
            Ok(GemmBackend::Matrixmultiply)
        );
        let e = "blas".parse::<GemmBackend>().unwrap_err();
        assert!(
            e.contains("`blas`") && e.contains("`matrixmultiply`"),
            "{e}"
        );
        #[cfg(feature = "gemm")]
        assert_eq!("gemm".parse::<GemmBackend>(), Ok(GemmBackend::Gemm));
        #[cfg(not(feature = "gemm"))]
        {
            let e = "gemm".parse::<GemmBackend>().unwrap_err();
            assert!(e.contains("--features gemm"), "{e}");
        }
    }
}
