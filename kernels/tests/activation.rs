//! Activations against textbook `f64` formulas, and their derivatives against both the hand-derived
//! `f64` derivative and a central difference of the `f64` forward.

mod common;

use common::{act64, dact64, forward_bound, Rng};
use pipefill_kernels::Activation;

/// Inputs from `-12` to `12`: a grid plus random points, plus the kinks and `0`.
fn inputs() -> Vec<f32> {
    let mut rng = Rng::new(11);
    let mut xs: Vec<f32> = (0..=4800).map(|i| -12.0 + i as f32 * 0.005).collect();
    xs.extend((0..5000).map(|_| rng.uniform(-12.0, 12.0)));
    xs.extend([0.0, -0.0, 1e-20, -1e-20, 1e-3, -1e-3]);
    xs
}

#[test]
fn forward_matches_f64() {
    // Relative error at most 8 eps (1 + |exp argument|), or 1e-35 absolute (`exp` flushes below 1.2e-38, times `|z| <= 12`).
    for act in Activation::ALL {
        let mut worst = 0.0f64;
        for z in inputs() {
            let want = act64(act, f64::from(z));
            let got = f64::from(act.forward(z));
            let bound = forward_bound(act, z);
            let err = (got - want).abs() / want.abs().max(1e-35 / bound);
            worst = worst.max(err / bound);
            assert!(err <= bound, "{act}({z}) = {got}, want {want}");
        }
        println!("{act} forward: worst error {worst:.2} of the bound");
    }
}

#[test]
fn derivative_matches_f64() {
    // Absolute 2e-6 (derivatives are O(1) and cross zero, so a relative bound is meaningless there).
    for act in Activation::ALL {
        let mut worst = 0.0f64;
        for z in inputs() {
            let want = dact64(act, f64::from(z));
            let got = f64::from(act.derivative(z));
            worst = worst.max((got - want).abs());
            assert!(
                (got - want).abs() <= 2e-6,
                "{act}'({z}) = {got}, want {want}"
            );
        }
        println!("{act} derivative: worst absolute error {worst:.2e}");
    }
}

#[test]
fn derivative_matches_central_difference() {
    // Checks the hand derivations themselves: away from ReLU's kink, within 1e-6 of a finite difference.
    let h = 1e-5;
    for act in Activation::ALL {
        for z in inputs().into_iter().filter(|z| z.abs() > 1e-3) {
            let z64 = f64::from(z);
            let fd = (act64(act, z64 + h) - act64(act, z64 - h)) / (2.0 * h);
            let got = f64::from(act.derivative(z));
            assert!(
                (got - fd).abs() <= 1e-6,
                "{act}'({z}) = {got}, finite difference {fd}"
            );
        }
    }
}

#[test]
fn names_and_codes_round_trip() {
    for act in Activation::ALL {
        assert_eq!(Activation::from_code(act.code()), Some(act));
        assert_eq!(act.name().parse::<Activation>(), Ok(act));
        assert_eq!(act.name().to_uppercase().parse::<Activation>(), Ok(act));
        assert_eq!(act.to_string(), act.name());
    }
    assert_eq!(Activation::from_code(4), None);
    let err = "tanh".parse::<Activation>().unwrap_err();
    assert!(err.to_string().contains("identity, relu, gelu, silu"));
}

#[test]
fn relu_keeps_nan_and_other_activations_propagate_it() {
    for act in Activation::ALL {
        assert!(act.forward(f32::NAN).is_nan(), "{act} must propagate NaN");
    }
}
