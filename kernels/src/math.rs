//! Scalar `f32` math that `core` does not provide: `exp`, `expm1`, `ln`, `sqrt`, `tanh`, the logistic
//! sigmoid and integer powers.
//!
//! `core` has no transcendental functions (they live in `std`, which calls the platform's libm), and the
//! GPU build of this crate is `no_std`. These are written once, here, and used by both builds so that the
//! CPU path and the PTX compute the same numbers from the same formulas. Each uses a range reduction
//! followed by a short polynomial; accuracies (checked against `f64` in `kernels/tests/math.rs`):
//!
//! | function | bound the tests enforce | worst seen | notes |
//! | --- | --- | --- | --- |
//! | [`exp`] | 2 ulp | 1.15 ulp | `0` below `-87.33`, `+inf` above `88.72` (no subnormal results) |
//! | [`expm1`] | 4 ulp | 1.84 ulp | accurate near zero (no cancellation) |
//! | [`ln`] | 2 ulp | 0.80 ulp | handles subnormals; `ln(0) = -inf`, negative gives NaN |
//! | [`sqrt`] | 1 ulp | 0.75 ulp | Newton iterations from a bit-level guess |
//! | [`tanh`] | 4 ulp | 2.46 ulp | exact `±1` beyond `|x| > 9` |
//! | [`sigmoid`] | 4 ulp | 1.95 ulp | no overflow for any input |
//!
//! NaN inputs give NaN outputs everywhere.

/// `log2(e)`.
const LOG2E: f32 = core::f32::consts::LOG2_E;
/// High part of `ln 2`: few enough significant bits that `k * LN2_HI` is exact for `|k| <= 256`.
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0.693145751953125
/// Low part of `ln 2` (`ln 2 - LN2_HI`).
const LN2_LO: f32 = 1.428_606_8e-6;
/// `sqrt(2)`, the upper end of the mantissa interval used by [`ln`].
const SQRT2: f32 = core::f32::consts::SQRT_2;
/// Above this `exp` overflows `f32`.
const EXP_MAX: f32 = 88.722_83;
/// Below this `exp` is subnormal; we return `0` (flush to zero, as GPUs do by default).
const EXP_MIN: f32 = -87.336_55;
/// Below this magnitude [`expm1`] uses its own series (beyond it `exp(x) - 1` loses under 1.5 bits).
const EXPM1_SERIES: f32 = 0.5;

/// `2^k` for `k` in `-126..=127`, built from the exponent bits.
#[inline]
fn pow2i(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Rounds to the nearest integer (halves away from zero); the argument is already clamped to a small range.
#[inline]
fn round_to_i32(t: f32) -> i32 {
    (t + 0.5f32.copysign(t)) as i32
}

/// `e^x`.
///
/// Range reduction `x = k ln 2 + r` with `|r| <= ln(2)/2` (Cody–Waite, two-part `ln 2`), a degree-7 Taylor
/// polynomial for `e^r`, then scaling by `2^k` in two halves so that `k = 128` does not overflow the
/// exponent field before the multiply.
#[inline]
pub fn exp(x: f32) -> f32 {
    if x > EXP_MAX {
        return f32::INFINITY;
    }
    if x < EXP_MIN {
        return 0.0;
    }
    let k = round_to_i32(x * LOG2E);
    let kf = k as f32;
    let r = (x - kf * LN2_HI) - kf * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let k1 = k >> 1;
    p * pow2i(k1) * pow2i(k - k1)
}

/// `e^x - 1`, accurate for small `|x|` where `exp(x) - 1` would cancel.
///
/// For `|x| < 1/2` a degree-9 Taylor series (no cancellation); elsewhere `exp(x) - 1`, whose
/// subtraction then loses under 1.5 bits.
#[inline]
pub fn expm1(x: f32) -> f32 {
    if x.abs() < EXPM1_SERIES {
        x * (1.0
            + x * (0.5
                + x * (1.0 / 6.0
                    + x * (1.0 / 24.0
                        + x * (1.0 / 120.0
                            + x * (1.0 / 720.0
                                + x * (1.0 / 5040.0
                                    + x * (1.0 / 40320.0 + x * (1.0 / 362_880.0)))))))))
    } else {
        exp(x) - 1.0
    }
}

/// Natural logarithm.
///
/// Splits `x = 2^e m` with `m` in `[sqrt(1/2), sqrt(2))`. With `d = m - 1` (exact) and `s = d/(2 + d)`,
/// `ln m = 2 atanh(s) = d - d^2/2 + s (d^2/2 + R)` where `R = 2 s^2/3 + 2 s^4/5 + ... + 2 s^8/9`
/// (`|s| <= 0.172`); writing it around the exact `d` keeps the rounding of the division out of the
/// leading term. Subnormal inputs are scaled up by `2^23` first.
#[inline]
pub fn ln(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        return x;
    }
    let (x, mut e) = if x < f32::MIN_POSITIVE {
        (x * 8_388_608.0, -23i32)
    } else {
        (x, 0i32)
    };
    let bits = x.to_bits();
    e += ((bits >> 23) as i32) - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > SQRT2 {
        m *= 0.5;
        e += 1;
    }
    let d = m - 1.0;
    let s = d / (2.0 + d);
    let s2 = s * s;
    let r = s2 * (2.0 / 3.0 + s2 * (2.0 / 5.0 + s2 * (2.0 / 7.0 + s2 * (2.0 / 9.0))));
    let half_d2 = 0.5 * d * d;
    let ln_m = d - (half_d2 - s * (half_d2 + r));
    let ef = e as f32;
    ef * LN2_HI + (ln_m + ef * LN2_LO)
}

/// Square root.
///
/// A guess from halving the exponent bits (within about 4 %), then three Newton steps
/// `y = (y + x/y)/2`, which converge quadratically to about 1 ulp. Tiny inputs (including subnormals)
/// are scaled by `2^100` first so the guess stays good. `sqrt(-0) = -0`, negative gives NaN.
#[inline]
pub fn sqrt(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 || x == f32::INFINITY {
        return x;
    }
    const TINY: f32 = 7.888_609e-31; // 2^-100
    let (xs, scale) = if x < TINY {
        (x * 1.267_650_6e30, 8.881_784e-16) // 2^100, 2^-50
    } else {
        (x, 1.0)
    };
    let mut y = f32::from_bits((xs.to_bits() >> 1) + 0x1fbd_1df5);
    y = 0.5 * (y + xs / y);
    y = 0.5 * (y + xs / y);
    y = 0.5 * (y + xs / y);
    y * scale
}

/// Hyperbolic tangent: `tanh(x) = sign(x) e/(e + 2)` with `e = expm1(2|x|)`, which keeps full relative
/// accuracy near zero; exactly `±1` for `|x| > 9` (where `1 - tanh` is below half an ulp of 1).
#[inline]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    if a > 9.0 {
        return 1.0f32.copysign(x);
    }
    let e = expm1(2.0 * a);
    (e / (e + 2.0)).copysign(x)
}

/// The logistic sigmoid `1 / (1 + e^-t)` and its complement `1 - sigmoid(t) = sigmoid(-t)`, both with
/// full relative accuracy (the complement is not computed as `1 - s`, which would cancel for large `t`).
/// One `exp` of a non-positive argument, so nothing overflows.
#[inline]
pub fn sigmoid_pair(t: f32) -> (f32, f32) {
    let e = exp(-t.abs());
    let big = 1.0 / (1.0 + e);
    let small = e / (1.0 + e);
    if t >= 0.0 {
        (big, small)
    } else {
        (small, big)
    }
}

/// The logistic sigmoid `1 / (1 + e^-t)`; see [`sigmoid_pair`].
#[inline]
pub fn sigmoid(t: f32) -> f32 {
    sigmoid_pair(t).0
}

/// `base^n` for a non-negative integer power, by repeated squaring (used for Adam's bias corrections).
#[inline]
pub fn powi(base: f32, n: u32) -> f32 {
    let mut result = 1.0f32;
    let mut b = base;
    let mut n = n;
    while n > 0 {
        if n & 1 == 1 {
            result *= b;
        }
        b *= b;
        n >>= 1;
    }
    result
}
