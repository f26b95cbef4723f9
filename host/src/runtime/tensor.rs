//! [`Tensor`]: the buffer type that moves between stages.

use thiserror::Error;

use crate::cost::ActivationDtype;

/// A dense row-major `f32` buffer with a shape: what one stage hands to the next (activations going
/// forward, gradients going backward) and what a [`Stage`](super::Stage) keeps in its stash.
///
/// It is deliberately plain: a `Vec<f32>` plus the shape, owned, cheap to move through a channel.
/// A trainer whose data lives on a device can still use it for the host copies it exchanges, or carry
/// its own handles inside its stash type. The invariant `data.len() == shape.iter().product()` always
/// holds; [`Tensor::new`] checks it.
///
/// A tensor has a storage type ([`Tensor::dtype`]): `f32`, or BF16 for a tensor made by
/// [`Tensor::from_bf16`], whose values are all BF16 numbers (widened exactly into the `f32`
/// buffer). A BF16 tensor counts 2 bytes per value in [`Tensor::bytes`], and a transport that
/// serializes it sends those 2 bytes ([`Tensor::bf16_bits`]); in-process, the values stay in the
/// `f32` buffer (a channel moves the buffer without copying it). Changing the values
/// ([`Tensor::data_mut`], [`Tensor::scale`]) makes it an `f32` tensor again.
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
    // Boxed, not a `Vec`: with the storage type the tensor stays 48 bytes (moved on every hand-on).
    shape: Box<[usize]>,
    data: Vec<f32>,
    dtype: ActivationDtype,
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
        Ok(Tensor {
            shape: shape.into_boxed_slice(),
            data,
            dtype: ActivationDtype::F32,
        })
    }

    /// A BF16 tensor of `shape` from BF16 bit patterns (row-major); refuses data of the wrong
    /// length.
    ///
    /// ```
    /// use pipefill_host::cost::ActivationDtype;
    /// use pipefill_host::runtime::Tensor;
    /// // 1.0, -2.0 and 1 + 2^-7 (the BF16 number after 1) in BF16.
    /// let t = Tensor::from_bf16(vec![1, 3], vec![0x3f80, 0xc000, 0x3f81]).unwrap();
    /// assert_eq!(t.data(), &[1.0, -2.0, 1.0 + 1.0 / 128.0]);
    /// assert_eq!((t.dtype(), t.bytes()), (ActivationDtype::Bf16, 6));
    /// assert_eq!(t.bf16_bits().unwrap(), vec![0x3f80, 0xc000, 0x3f81]);
    /// ```
    pub fn from_bf16(shape: Vec<usize>, bits: Vec<u16>) -> Result<Self, ShapeError> {
        let data = bits.into_iter().map(bf16_value).collect();
        let mut t = Tensor::new(shape, data)?;
        t.dtype = ActivationDtype::Bf16;
        Ok(t)
    }

    /// How the values are stored: [`ActivationDtype::F32`] unless made by
    /// [`Tensor::from_bf16`] (and not changed since).
    pub fn dtype(&self) -> ActivationDtype {
        self.dtype
    }

    /// The BF16 bit patterns of a BF16 tensor (exact: each value is a BF16 number), or `None` for
    /// an `f32` tensor (which would need rounding: the caller decides how).
    pub fn bf16_bits(&self) -> Option<Vec<u16>> {
        (self.dtype == ActivationDtype::Bf16).then(|| {
            self.data
                .iter()
                .map(|v| (v.to_bits() >> 16) as u16)
                .collect()
        })
    }

    /// A `[rows, cols]` matrix; refuses data of the wrong length.
    pub fn matrix(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self, ShapeError> {
        Tensor::new(vec![rows, cols], data)
    }

    /// A tensor of `shape` filled with zeros.
    pub fn zeros(shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        Tensor {
            shape: shape.into_boxed_slice(),
            data: vec![0.0; n],
            dtype: ActivationDtype::F32,
        }
    }

    /// A tensor with no elements (shape `[0]`): what stages without data pass around, e.g. in benches.
    pub fn empty() -> Self {
        Tensor {
            shape: Box::new([0]),
            data: Vec::new(),
            dtype: ActivationDtype::F32,
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

    /// The values, row-major, for writing in place (the shape cannot change this way). The
    /// tensor is `f32` from then on (the values written need not be BF16 numbers).
    pub fn data_mut(&mut self) -> &mut [f32] {
        self.dtype = ActivationDtype::F32;
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

    /// Bytes of the values in their storage type ([`Tensor::dtype`]): 4 per value, 2 for BF16.
    /// What a transport that serializes the tensor sends.
    pub fn bytes(&self) -> usize {
        self.data.len() * self.dtype.bytes() as usize
    }

    /// Multiplies every value by `factor` in place (the tensor is `f32` from then on).
    pub fn scale(&mut self, factor: f32) {
        self.dtype = ActivationDtype::F32;
        self.data.iter_mut().for_each(|v| *v *= factor);
    }
}

/// The `f32` value of BF16 bits (exact: BF16 is the upper half of an `f32`).
fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
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

    #[test]
    fn bf16_tensors_carry_two_bytes_a_value_until_changed() {
        // Bit patterns with their values: 0.5, -3.0, the smallest normal (2^-126), +infinity.
        let bits = vec![0x3f00, 0xc040, 0x0080, 0x7f80];
        let t = Tensor::from_bf16(vec![2, 2], bits.clone()).unwrap();
        assert_eq!(
            t.data(),
            &[0.5, -3.0, f32::MIN_POSITIVE, f32::INFINITY],
            "widening is exact"
        );
        assert_eq!((t.bytes(), t.bf16_bits()), (8, Some(bits)));
        assert!(Tensor::from_bf16(vec![3], vec![0; 2]).is_err());
        let mut scaled = t.clone();
        scaled.scale(0.5);
        assert_eq!((scaled.dtype(), scaled.bytes()), (ActivationDtype::F32, 16));
        let mut written = t;
        written.data_mut()[0] = 0.1;
        assert_eq!((written.bf16_bits(), written.bytes()), (None, 16));
    }
}
