//! [`Tensor`]: the buffer type that moves between stages.

use thiserror::Error;

/// A dense row-major `f32` buffer with a shape: what one stage hands to the next (activations going
/// forward, gradients going backward) and what a [`Stage`](super::Stage) keeps in its stash.
///
/// It is deliberately plain: a `Vec<f32>` plus the shape, owned, cheap to move through a channel.
/// A trainer whose data lives on a device can still use it for the host copies it exchanges, or carry
/// its own handles inside its stash type. The invariant `data.len() == shape.iter().product()` always
/// holds; [`Tensor::new`] checks it.
///
/// For the matrix layers of the built-in model the first dimension is the batch: a `[rows, cols]`
/// tensor holds one sample per row. [`Tensor::rows`] and [`Tensor::cols`] read any shape that way
/// (`cols` is the product of the trailing dimensions).
///
/// ```
/// use pipefill_host::runtime::Tensor;
/// let t = Tensor::new(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
/// assert_eq!((t.rows(), t.cols()), (2, 3));
/// assert_eq!(t.bytes(), 24);
/// assert!(Tensor::new(vec![2, 2], vec![0.0; 3]).is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

/// A tensor whose data does not fit its shape.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("tensor shape {shape:?} needs {expected} values, got {got}")]
pub struct ShapeError {
    /// The shape asked for.
    pub shape: Vec<usize>,
    /// `shape.iter().product()`.
    pub expected: usize,
    /// `data.len()`.
    pub got: usize,
}

impl Tensor {
    /// A tensor of `shape` holding `data` (row-major); refuses data of the wrong length.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self, ShapeError> {
        let expected = shape.iter().product();
        if data.len() != expected {
            return Err(ShapeError {
                shape,
                expected,
                got: data.len(),
            });
        }
        Ok(Tensor { shape, data })
    }

    /// A `[rows, cols]` matrix; refuses data of the wrong length.
    pub fn matrix(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self, ShapeError> {
        Tensor::new(vec![rows, cols], data)
    }

    /// A tensor of `shape` filled with zeros.
    pub fn zeros(shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        Tensor {
            shape,
            data: vec![0.0; n],
        }
    }

    /// A tensor with no elements (shape `[0]`): what stages without data pass around, e.g. in benches.
    pub fn empty() -> Self {
        Tensor {
            shape: vec![0],
            data: Vec::new(),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The values, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The values, row-major, for writing in place (the shape cannot change this way).
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Takes the values out, dropping the shape.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// `true` when there are no values.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The first dimension (1 for a scalar of shape `[]`).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// The product of the dimensions after the first.
    pub fn cols(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Bytes held by the values.
    pub fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }

    /// Multiplies every value by `factor` in place.
    pub fn scale(&mut self, factor: f32) {
        self.data.iter_mut().for_each(|v| *v *= factor);
    }
}

impl Default for Tensor {
    fn default() -> Self {
        Tensor::empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_is_checked() {
        let e = Tensor::new(vec![2, 3], vec![0.0; 5]).unwrap_err();
        assert_eq!((e.expected, e.got), (6, 5));
        assert!(Tensor::new(vec![], vec![1.0]).is_ok());
        assert!(Tensor::new(vec![0, 4], vec![]).is_ok());
    }

    #[test]
    fn matrix_view_and_scale() {
        let mut t = Tensor::new(vec![2, 2, 3], (0..12).map(|v| v as f32).collect()).unwrap();
        assert_eq!((t.rows(), t.cols(), t.len()), (2, 6, 12));
        t.scale(0.5);
        assert_eq!(t.data()[11], 5.5);
        assert_eq!(Tensor::empty().len(), 0);
        assert_eq!(Tensor::zeros(vec![3, 1]).data(), &[0.0; 3]);
    }
}
