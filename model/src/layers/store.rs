//! How a CPU stage stores the activations it keeps between passes: `f32`, or BF16 bits under
//! `--activations bf16` ([`ActivationDtype`]).
//!
//! BF16 is the upper half of an `f32`: rounding to it is `pipefill-kernels`' `f32_to_bf16` (to
//! nearest, ties to even, the rounding of `cvt.rn.bf16.f32` and of the device conversion
//! kernel), widening back is exact. A value rounded once is a BF16 number, so rounding it again,
//! or storing it and widening it, changes nothing.

use std::borrow::Cow;

use pipefill_host::cost::ActivationDtype;
use pipefill_kernels::tc::convert::{bf16_to_f32, f32_to_bf16};

/// One stored tensor's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    /// 4 bytes a value.
    F32(Vec<f32>),
    /// BF16 bit patterns, 2 bytes a value.
    Bf16(Vec<u16>),
}

impl Stored {
    /// `values` stored as `dtype` (rounded to nearest BF16, ties to even, for
    /// [`ActivationDtype::Bf16`]; the `f32` buffer is dropped then).
    pub fn new(dtype: ActivationDtype, values: Vec<f32>) -> Stored {
        match dtype {
            ActivationDtype::F32 => Stored::F32(values),
            ActivationDtype::Bf16 => Stored::Bf16(to_bf16(&values)),
        }
    }

    /// The values as `f32` (widened from BF16: a new buffer; borrowed for `f32`).
    pub fn values(&self) -> Cow<'_, [f32]> {
        match self {
            Stored::F32(v) => Cow::Borrowed(v),
            Stored::Bf16(b) => Cow::Owned(widen(b)),
        }
    }

    /// The values as an owned `f32` buffer.
    pub fn into_values(self) -> Vec<f32> {
        match self {
            Stored::F32(v) => v,
            Stored::Bf16(b) => widen(&b),
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Stored::F32(v) => v.len(),
            Stored::Bf16(b) => b.len(),
        }
    }

    /// `true` when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the values occupy.
    pub fn bytes(&self) -> usize {
        match self {
            Stored::F32(v) => std::mem::size_of_val(&v[..]),
            Stored::Bf16(b) => std::mem::size_of_val(&b[..]),
        }
    }
}

/// Each value rounded to BF16 bits (to nearest, ties to even).
pub fn to_bf16(values: &[f32]) -> Vec<u16> {
    values.iter().map(|&v| f32_to_bf16(v)).collect()
}

/// BF16 bits widened to `f32` (exact).
pub fn widen(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| bf16_to_f32(b)).collect()
}

/// Rounds each value to the nearest BF16 number in place, when `dtype` is BF16 (the values stay
/// `f32`; a layer reads them next, and storing them as BF16 afterwards is exact).
pub fn round_in_place(dtype: ActivationDtype, values: &mut [f32]) {
    if dtype == ActivationDtype::Bf16 {
        values
            .iter_mut()
            .for_each(|v| *v = bf16_to_f32(f32_to_bf16(*v)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nearest BF16 number by definition, in `f64`: the candidates are the value's `f32` bits
    /// truncated to BF16 and the next BF16 number up in magnitude; ties go to the even one.
    fn nearest(v: f32) -> f32 {
        let down = f32::from_bits(v.to_bits() & 0xffff_0000);
        let up = f32::from_bits((v.to_bits() & 0xffff_0000) + 0x1_0000);
        let (dd, du) = ((v as f64 - down as f64).abs(), (up as f64 - v as f64).abs());
        if dd < du || (dd == du && (down.to_bits() >> 16) % 2 == 0) {
            down
        } else {
            up
        }
    }

    #[test]
    fn rounding_is_to_nearest_ties_to_even() {
        // Known bits: 1 + 2^-8 is halfway between 1 (even) and 1 + 2^-7: it goes down; 1 + 3 * 2^-8
        // is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: it goes up; just above the halfway point
        // goes up.
        assert_eq!(to_bf16(&[1.0 + 1.0 / 256.0]), vec![0x3f80]);
        assert_eq!(to_bf16(&[1.0 + 3.0 / 256.0]), vec![0x3f82]);
        assert_eq!(to_bf16(&[f32::from_bits(0x3f80_8001)]), vec![0x3f81]);
        assert_eq!(
            to_bf16(&[-2.0, 0.0, f32::INFINITY]),
            vec![0xc000, 0, 0x7f80]
        );
        // Against the definition over a spread of magnitudes and signs, and the 2^-8 relative bound.
        let mut v = 1.234_567e-20f32;
        while v < 1e20 {
            for x in [v, -v, v * 1.000_123] {
                let r = widen(&to_bf16(&[x]))[0];
                assert_eq!(r, nearest(x), "{x:e}");
                assert!(
                    ((r as f64 - x as f64) / x as f64).abs() <= 2f64.powi(-8),
                    "{x:e}"
                );
            }
            v *= 1.37;
        }
    }

    #[test]
    fn stored_bf16_holds_half_the_bytes_and_widens_to_the_rounded_values() {
        let values: Vec<f32> = (0..10).map(|i| (i as f32 * 0.37).sin()).collect();
        let f = Stored::new(ActivationDtype::F32, values.clone());
        let b = Stored::new(ActivationDtype::Bf16, values.clone());
        assert_eq!((f.bytes(), b.bytes(), b.len()), (40, 20, 10));
        assert_eq!(f.values(), &values[..]);
        let mut rounded = values.clone();
        round_in_place(ActivationDtype::Bf16, &mut rounded);
        assert_eq!(b.values(), &rounded[..]);
        assert_ne!(rounded, values, "rounding changed something");
        // Storing a rounded value again is exact.
        assert_eq!(
            Stored::new(ActivationDtype::Bf16, rounded.clone()).into_values(),
            rounded
        );
    }
}
