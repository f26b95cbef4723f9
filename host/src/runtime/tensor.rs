//! [`Tensor`]: the buffer type that moves between stages, and its storage type [`Dtype`].

use std::fmt;

use thiserror::Error;

use crate::cost::ActivationDtype;

/// How a [`Tensor`]'s values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dtype {
    /// 32-bit floats.
    F32,
    /// BF16 numbers (kept widened in an `f32` buffer, 2 bytes a value on a wire).
    Bf16,
    /// 32-bit integers (token ids, indices).
    I32,
    /// 64-bit integers (token ids, indices).
    I64,
}

impl Dtype {
    /// Bytes of one value.
    pub fn bytes(self) -> usize {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::Bf16 => 2,
            Dtype::I64 => 8,
        }
    }

    /// The name: `f32`, `bf16`, `i32`, `i64`.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
        }
    }

    /// Whether the values are floats ([`Tensor::data`] reads them).
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::Bf16)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<ActivationDtype> for Dtype {
    fn from(d: ActivationDtype) -> Self {
        match d {
            ActivationDtype::F32 => Dtype::F32,
            ActivationDtype::Bf16 => Dtype::Bf16,
        }
    }
}

/// The values of a [`Tensor`], by storage type (BF16 values widened exactly into `f32`s).
#[derive(Debug, Clone, PartialEq)]
enum Values {
    F32(Vec<f32>),
    Bf16(Vec<f32>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::F32(v) | Values::Bf16(v) => v.len(),
            Values::I32(v) => v.len(),
            Values::I64(v) => v.len(),
        }
    }
}

/// A dense row-major buffer with a shape: what one stage hands to the next (activations going
/// forward, gradients going backward) and what a [`Stage`](super::Stage) keeps in its stash.
///
/// It is deliberately plain: a `Vec` of values plus the shape, owned, cheap to move through a
/// channel.
/// A trainer whose data lives on a device can still use it for the host copies it exchanges, or carry
/// its own handles inside its stash type. The invariant `data.len() == shape.iter().product()` always
/// holds; [`Tensor::new`] checks it.
///
/// A tensor has a storage type ([`Tensor::dtype`], a [`Dtype`]): `f32`; BF16 for a tensor made by
/// [`Tensor::from_bf16`], whose values are all BF16 numbers (widened exactly into the `f32`
/// buffer); or integers (`i32`, `i64`: token ids for an embedding stage) for one made by
/// [`Tensor::from_i32`] or [`Tensor::from_i64`]. [`Tensor::bytes`] counts each value in its type
/// (2 bytes for BF16, 8 for `i64`), and a transport that serializes the tensor sends those bytes
/// ([`Tensor::bf16_bits`], [`Tensor::as_i32`], [`Tensor::as_i64`]); in-process, a channel moves
/// the buffer without copying it. Changing float values ([`Tensor::data_mut`], [`Tensor::scale`])
/// makes a BF16 tensor `f32` again.
///
/// [`Tensor::data`] reads float values (`f32` or BF16); an integer tensor has none there (an empty
/// slice): read its values with [`Tensor::as_i64`] or [`Tensor::as_i32`].
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
    // Boxed, not a `Vec`: with the storage type (the values' variant) the tensor stays 48 bytes
    // (moved on every hand-on).
    shape: Box<[usize]>,
    values: Values,
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
        Tensor::of(shape, Values::F32(data))
    }

    fn of(shape: Vec<usize>, values: Values) -> Result<Self, ShapeError> {
        let expected = shape.iter().product();
        if values.len() != expected {
            return Err(ShapeError {
                shape,
                expected,
                got: values.len(),
            });
        }
        Ok(Tensor {
            shape: shape.into_boxed_slice(),
            values,
        })
    }

    /// An `i64` tensor of `shape` (token ids, say); refuses data of the wrong length.
    ///
    /// ```
    /// use pipefill_host::runtime::{Dtype, Tensor};
    /// let ids = Tensor::from_i64(vec![3], vec![7, 0, 42]).unwrap();
    /// assert_eq!((ids.dtype(), ids.bytes(), ids.len()), (Dtype::I64, 24, 3));
    /// assert_eq!(ids.as_i64(), Some(&[7, 0, 42][..]));
    /// assert!(ids.data().is_empty() && ids.as_i32().is_none());
    /// ```
    pub fn from_i64(shape: Vec<usize>, data: Vec<i64>) -> Result<Self, ShapeError> {
        Tensor::of(shape, Values::I64(data))
    }

    /// An `i32` tensor of `shape`; refuses data of the wrong length.
    pub fn from_i32(shape: Vec<usize>, data: Vec<i32>) -> Result<Self, ShapeError> {
        Tensor::of(shape, Values::I32(data))
    }

    /// The values of an `i64` tensor (`None` for another type).
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.values {
            Values::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The values of an `i32` tensor (`None` for another type).
    pub fn as_i32(&self) -> Option<&[i32]> {
        match &self.values {
            Values::I32(v) => Some(v),
            _ => None,
        }
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
    /// assert_eq!((t.dtype(), t.bytes()), (ActivationDtype::Bf16.into(), 6));
    /// assert_eq!(t.bf16_bits().unwrap(), vec![0x3f80, 0xc000, 0x3f81]);
    /// ```
    pub fn from_bf16(shape: Vec<usize>, bits: Vec<u16>) -> Result<Self, ShapeError> {
        Tensor::of(
            shape,
            Values::Bf16(bits.into_iter().map(bf16_value).collect()),
        )
    }

    /// How the values are stored: [`Dtype::F32`] unless made by [`Tensor::from_bf16`] (and not
    /// changed since), [`Tensor::from_i32`] or [`Tensor::from_i64`].
    pub fn dtype(&self) -> Dtype {
        match self.values {
            Values::F32(_) => Dtype::F32,
            Values::Bf16(_) => Dtype::Bf16,
            Values::I32(_) => Dtype::I32,
            Values::I64(_) => Dtype::I64,
        }
    }

    /// The BF16 bit patterns of a BF16 tensor (exact: each value is a BF16 number), or `None` for
    /// an `f32` tensor (which would need rounding: the caller decides how).
    pub fn bf16_bits(&self) -> Option<Vec<u16>> {
        match &self.values {
            Values::Bf16(v) => Some(v.iter().map(|v| (v.to_bits() >> 16) as u16).collect()),
            _ => None,
        }
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
            values: Values::F32(vec![0.0; n]),
        }
    }

    /// A tensor with no elements (shape `[0]`): what stages without data pass around, e.g. in benches.
    pub fn empty() -> Self {
        Tensor {
            shape: Box::new([0]),
            values: Values::F32(Vec::new()),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The float values (`f32` or BF16), row-major; empty for an integer tensor (read it with
    /// [`Tensor::as_i64`] or [`Tensor::as_i32`]).
    #[inline]
    pub fn data(&self) -> &[f32] {
        match &self.values {
            Values::F32(v) | Values::Bf16(v) => v,
            Values::I32(_) | Values::I64(_) => &[],
        }
    }

    /// The float values, row-major, for writing in place (the shape cannot change this way). A
    /// BF16 tensor is `f32` from then on (the values written need not be BF16 numbers); an integer
    /// tensor has no float values (an empty slice) and stays as it is.
    pub fn data_mut(&mut self) -> &mut [f32] {
        if let Values::Bf16(v) = &mut self.values {
            self.values = Values::F32(std::mem::take(v));
        }
        match &mut self.values {
            Values::F32(v) | Values::Bf16(v) => v,
            Values::I32(_) | Values::I64(_) => &mut [],
        }
    }

    /// Takes the float values out, dropping the shape (empty for an integer tensor).
    pub fn into_data(self) -> Vec<f32> {
        match self.values {
            Values::F32(v) | Values::Bf16(v) => v,
            Values::I32(_) | Values::I64(_) => Vec::new(),
        }
    }

    /// Number of values, of any type.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// `true` when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first dimension (1 for a scalar of shape `[]`).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// The product of the dimensions after the first.
    pub fn cols(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Bytes of the values in their storage type ([`Tensor::dtype`]): 4 per value, 2 for BF16,
    /// 8 for `i64`. What a transport that serializes the tensor sends.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype().bytes()
    }

    /// Multiplies every float value by `factor` in place (a BF16 tensor is `f32` from then on);
    /// an integer tensor is left as it is.
    pub fn scale(&mut self, factor: f32) {
        self.data_mut().iter_mut().for_each(|v| *v *= factor);
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
        assert_eq!((scaled.dtype(), scaled.bytes()), (Dtype::F32, 16));
        let mut written = t;
        written.data_mut()[0] = 0.1;
        assert_eq!((written.bf16_bits(), written.bytes()), (None, 16));
    }

    #[test]
    fn integer_tensors_keep_their_type_and_count_their_bytes() {
        let ids = Tensor::from_i64(vec![2, 2], vec![1, -3, i64::MAX, 0]).unwrap();
        assert_eq!((ids.dtype(), ids.bytes(), ids.len()), (Dtype::I64, 32, 4));
        assert_eq!(ids.as_i64(), Some(&[1, -3, i64::MAX, 0][..]));
        let small = Tensor::from_i32(vec![3], vec![5, 6, 7]).unwrap();
        assert_eq!((small.dtype(), small.bytes()), (Dtype::I32, 12));
        assert_eq!(
            (small.as_i32(), small.as_i64()),
            (Some(&[5, 6, 7][..]), None)
        );
        assert!(Tensor::from_i64(vec![3], vec![0; 2]).is_err());
        // Float operations leave integers alone.
        let mut scaled = ids.clone();
        scaled.scale(2.0);
        assert_eq!(scaled, ids);
        assert!(scaled.data_mut().is_empty() && ids.clone().into_data().is_empty());
        assert_eq!(std::mem::size_of::<Tensor>(), 48);
    }
}
