//! MSE and softmax cross-entropy against `f64`, including logits large enough to overflow a naive softmax.

mod common;

use common::{assert_close, Rng, SIZES};
use pipefill_kernels::{mse_grad, mse_loss, softmax_ce_grad, softmax_ce_loss};

const EPS: f64 = f32::EPSILON as f64;

#[test]
fn mse_matches_f64() {
    let mut rng = Rng::new(31);
    for &len in &SIZES {
        let p = rng.vec(len, -3.0, 3.0);
        let t = rng.vec(len, -3.0, 3.0);
        let want = p
            .iter()
            .zip(&t)
            .map(|(&p, &t)| (f64::from(p) - f64::from(t)).powi(2))
            .sum::<f64>()
            / len as f64;
        let got = f64::from(mse_loss(&p, &t));
        assert!(
            (got - want).abs() <= EPS * want,
            "mse {len}: {got} vs {want}"
        );

        let norm = (3 * len) as f32; // a microbatch of a minibatch three times larger
        let mut g = vec![0.0; len];
        mse_grad(&p, &t, &mut g, norm);
        let g64: Vec<f64> = (0..len)
            .map(|i| 2.0 * (f64::from(p[i]) - f64::from(t[i])) / f64::from(norm))
            .collect();
        // Three roundings (difference, scaling, 1/norm).
        assert_close(&format!("mse grad {len}"), &g, &g64, |i| {
            3.0 * EPS * g64[i].abs()
        });
    }
    assert_eq!(mse_loss(&[], &[]), 0.0);
}

/// Cross-entropy of each row and its gradient, in `f64` (max-shifted, so exact enough for any logits).
fn ce64(logits: &[f32], targets: &[u32], norm: f64) -> (f64, Vec<f64>) {
    let classes = logits.len() / targets.len();
    let mut loss = 0.0;
    let mut grad = vec![0.0; logits.len()];
    for (r, &t) in targets.iter().enumerate() {
        let row: Vec<f64> = logits[r * classes..(r + 1) * classes]
            .iter()
            .map(|&z| f64::from(z))
            .collect();
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|z| (z - max).exp()).sum();
        loss += max + sum.ln() - row[t as usize];
        for j in 0..classes {
            let onehot = if j == t as usize { 1.0 } else { 0.0 };
            grad[r * classes + j] = ((row[j] - max).exp() / sum - onehot) / norm;
        }
    }
    (loss / targets.len() as f64, grad)
}

#[test]
fn softmax_cross_entropy_matches_f64() {
    let mut rng = Rng::new(32);
    for &rows in &SIZES {
        for &classes in &SIZES {
            // Spread 0 (uniform logits), moderate, and huge logits shifted by 1000 (exp would overflow).
            for (spread, shift) in [(0.0, 0.0), (4.0, 0.0), (30.0, 1000.0)] {
                let logits: Vec<f32> = (0..rows * classes)
                    .map(|_| shift + rng.uniform(-spread, spread + 1e-3))
                    .collect();
                let targets: Vec<u32> = (0..rows).map(|_| rng.below(classes as u32)).collect();
                let norm = rows as f32;
                let (want, g64) = ce64(&logits, &targets, f64::from(norm));
                let got = f64::from(softmax_ce_loss(&logits, &targets));
                let what = format!("ce {rows}x{classes} spread {spread} shift {shift}");
                // Per row: max - z_t is exact-ish, ln(sum) within ~ (classes + 4) eps of ln's scale; shifted
                // logits add the rounding of the logits themselves (ulp(1000) = 6e-5) to the difference.
                let tol = (classes as f64 + 8.0) * EPS * (want.abs() + 1.0)
                    + if shift > 0.0 { 1e-4 } else { 0.0 };
                assert!((got - want).abs() <= tol, "{what}: loss {got} vs {want}");

                let mut g = vec![f32::NAN; rows * classes];
                softmax_ce_grad(&logits, &targets, &mut g, norm);
                // softmax within (classes + 8) eps relative to its value (the sum and exp errors), over norm.
                let gtol = (classes as f64 + 8.0) * EPS / f64::from(norm);
                assert_close(&format!("{what} grad"), &g, &g64, |_| gtol);
                // Each row of the gradient sums to zero (softmax sums to one).
                for row in g.chunks(classes) {
                    let s: f64 = row.iter().map(|&x| f64::from(x)).sum();
                    assert!(
                        s.abs() <= gtol * classes as f64,
                        "{what}: gradient row sums to {s}"
                    );
                }
            }
        }
    }
    assert_eq!(softmax_ce_loss(&[], &[]), 0.0);
}

#[test]
#[should_panic(expected = "out of range")]
fn softmax_cross_entropy_rejects_bad_target() {
    let mut g = [0.0; 3];
    softmax_ce_grad(&[1.0, 2.0, 3.0], &[3], &mut g, 1.0);
}
