//! Accuracy of the `no_std` scalar math against `f64`'s (libm) functions, with the bounds stated in
//! `kernels/src/math.rs`.

mod common;

use common::{ulps, Rng};
use pipefill_kernels::math;

/// Evenly spaced and random points in `[lo, hi]`.
fn points(lo: f32, hi: f32, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let grid = (0..=20_000).map(|i| lo + (hi - lo) * i as f32 / 20_000.0);
    grid.chain((0..20_000).map(|_| rng.uniform(lo, hi)))
        .collect()
}

/// The worst ulp error of `f` against `reference` over `xs`, with the worst input.
fn worst(xs: &[f32], f: impl Fn(f32) -> f32, reference: impl Fn(f64) -> f64) -> (f64, f32) {
    xs.iter()
        .map(|&x| (ulps(f(x), reference(f64::from(x))), x))
        .fold((0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a })
}

fn check(
    name: &str,
    xs: &[f32],
    f: impl Fn(f32) -> f32,
    reference: impl Fn(f64) -> f64,
    bound: f64,
) {
    let (err, at) = worst(xs, f, reference);
    println!("{name}: worst {err:.2} ulp at {at:e} (bound {bound})");
    assert!(
        err <= bound,
        "{name}: {err} ulp at x = {at:e} exceeds {bound}"
    );
}

#[test]
fn exp_within_2_ulp() {
    check("exp", &points(-87.3, 88.7, 1), math::exp, f64::exp, 2.0);
    assert_eq!(math::exp(0.0), 1.0);
    assert_eq!(math::exp(100.0), f32::INFINITY);
    assert_eq!(math::exp(-100.0), 0.0);
    assert!(math::exp(f32::NAN).is_nan());
}

#[test]
fn expm1_within_4_ulp() {
    check(
        "expm1 small",
        &points(-0.5, 0.5, 2),
        math::expm1,
        f64::exp_m1,
        4.0,
    );
    check(
        "expm1 wide",
        &points(-20.0, 80.0, 3),
        math::expm1,
        f64::exp_m1,
        4.0,
    );
    assert_eq!(math::expm1(1e-30), 1e-30);
}

#[test]
fn ln_within_2_ulp() {
    let mut xs = points(1e-3, 10.0, 4);
    xs.extend(points(0.5, 2.0, 5));
    xs.extend(
        (-149..128)
            .map(|e| 1.37f32 * 2f32.powi(e))
            .filter(|x| *x > 0.0),
    );
    check("ln", &xs, math::ln, f64::ln, 2.0);
    assert_eq!(math::ln(1.0), 0.0);
    assert_eq!(math::ln(0.0), f32::NEG_INFINITY);
    assert!(math::ln(-1.0).is_nan());
    assert_eq!(math::ln(f32::INFINITY), f32::INFINITY);
}

#[test]
fn sqrt_within_1_ulp() {
    let mut xs = points(0.0, 4.0, 6);
    xs.extend(
        (-149..128)
            .map(|e| 1.9f32 * 2f32.powi(e))
            .filter(|x| x.is_finite() && *x > 0.0),
    );
    check("sqrt", &xs, math::sqrt, f64::sqrt, 1.0);
    assert_eq!(math::sqrt(0.0), 0.0);
    assert!(math::sqrt(-1.0).is_nan());
    assert_eq!(math::sqrt(f32::INFINITY), f32::INFINITY);
}

#[test]
fn tanh_within_4_ulp() {
    check("tanh", &points(-12.0, 12.0, 7), math::tanh, f64::tanh, 4.0);
    check(
        "tanh small",
        &points(-1e-3, 1e-3, 8),
        math::tanh,
        f64::tanh,
        4.0,
    );
    assert_eq!(math::tanh(50.0), 1.0);
    assert_eq!(math::tanh(-50.0), -1.0);
}

#[test]
fn sigmoid_and_complement_within_4_ulp() {
    let xs = points(-80.0, 80.0, 9);
    let s = |t: f64| 1.0 / (1.0 + (-t).exp());
    check("sigmoid", &xs, math::sigmoid, s, 4.0);
    check(
        "1 - sigmoid",
        &xs,
        |t| math::sigmoid_pair(t).1,
        |t| s(-t),
        4.0,
    );
    assert_eq!(math::sigmoid(1000.0), 1.0);
    assert_eq!(math::sigmoid(-1000.0), 0.0);
}

#[test]
fn powi_matches_repeated_multiplication() {
    for &b in &[0.9f32, 0.999, 1.5, -2.0] {
        for n in 0..64u32 {
            let reference = f64::from(b).powi(n as i32);
            let err = ulps(math::powi(b, n), reference);
            // Repeated squaring rounds once per multiply: at most about 2 log2(n) roundings.
            assert!(err <= 12.0, "{b}^{n}: {err} ulp");
        }
    }
}
