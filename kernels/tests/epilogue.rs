//! The linear layer's elementwise pieces and the reference GEMM against `f64`, on awkward shapes.

mod common;

use common::{act64, assert_close, dact64, forward_bound, gemm64, Rng, SIZES};
use pipefill_kernels::{
    activation_backward, activation_backward_in_place, activation_forward, bias_activation,
    bias_grad_accumulate, gemm_ref, Activation, GemmShape,
};

const EPS: f64 = f32::EPSILON as f64;

#[test]
fn bias_activation_matches_f64_and_keeps_pre_activation() {
    let mut rng = Rng::new(21);
    for act in Activation::ALL {
        for &rows in &SIZES {
            for &n in &SIZES {
                let acc = rng.vec(rows * n, -6.0, 6.0);
                let bias = rng.vec(n, -1.0, 1.0);
                let z64: Vec<f64> = (0..rows * n)
                    .map(|i| f64::from(acc[i]) + f64::from(bias[i % n]))
                    .collect();
                let y64: Vec<f64> = z64.iter().map(|&z| act64(act, z)).collect();

                let mut out = acc.clone();
                let mut pre = vec![f32::NAN; rows * n];
                bias_activation(&mut out, Some(&mut pre), &bias, act);
                // z = acc + b is one rounding: half an ulp. y: the activation's bound at z (see
                // `forward_bound`) plus one ulp for the rounding of z, plus 1e-35 for results flushed to zero.
                let what = format!("{act} {rows}x{n}");
                assert_close(&format!("{what} pre"), &pre, &z64, |i| {
                    0.5 * EPS * z64[i].abs()
                });
                let bound = |i: usize| (forward_bound(act, pre[i]) * 2.0) * y64[i].abs() + 1e-35;
                assert_close(&format!("{what} out"), &out, &y64, bound);

                let mut out_only = acc.clone();
                bias_activation(&mut out_only, None, &bias, act);
                assert_eq!(
                    out_only, out,
                    "{what}: output must not depend on storing the pre-activation"
                );
            }
        }
    }
}

#[test]
fn activation_forward_and_backward_match_f64() {
    let mut rng = Rng::new(22);
    for act in Activation::ALL {
        for &len in &SIZES {
            let z = rng.vec(len, -8.0, 8.0);
            let dy = rng.vec(len, -2.0, 2.0);
            let mut y = vec![0.0; len];
            activation_forward(&z, &mut y, act);
            let y64: Vec<f64> = z.iter().map(|&z| act64(act, f64::from(z))).collect();
            let bound = |i: usize| forward_bound(act, z[i]) * y64[i].abs() + 1e-35;
            assert_close(&format!("{act} forward {len}"), &y, &y64, bound);

            let dz64: Vec<f64> = (0..len)
                .map(|i| f64::from(dy[i]) * dact64(act, f64::from(z[i])))
                .collect();
            let mut dz = vec![0.0; len];
            activation_backward(&dy, &z, &mut dz, act);
            // The derivative is within 2e-6 absolute (tests/activation.rs), times |dy| <= 2, plus one rounding.
            assert_close(&format!("{act} backward {len}"), &dz, &dz64, |i| {
                4e-6 + EPS * dz64[i].abs()
            });
            let mut in_place = dy.clone();
            activation_backward_in_place(&mut in_place, &z, act);
            assert_eq!(
                in_place, dz,
                "{act} {len}: in-place and out-of-place backward differ"
            );
        }
    }
}

#[test]
fn bias_grad_accumulates_column_sums() {
    let mut rng = Rng::new(23);
    for &rows in &SIZES {
        for &n in &SIZES {
            let dz = rng.vec(rows * n, -1.0, 1.0);
            let start = rng.vec(n, -1.0, 1.0);
            let mut db = start.clone();
            bias_grad_accumulate(&mut db, &dz);
            bias_grad_accumulate(&mut db, &dz); // two microbatches of the same gradient
            let want: Vec<f64> = (0..n)
                .map(|j| {
                    f64::from(start[j])
                        + 2.0 * (0..rows).map(|r| f64::from(dz[r * n + j])).sum::<f64>()
                })
                .collect();
            // A sequential f32 sum of 2 rows + 1 terms, each |.| <= 1: error <= (2 rows + 1) eps (2 rows + 1).
            let terms = (2 * rows + 1) as f64;
            assert_close(&format!("db {rows}x{n}"), &db, &want, |_| {
                terms * terms * EPS
            });
        }
    }
}

#[test]
fn gemm_ref_matches_f64_for_all_transpositions() {
    let mut rng = Rng::new(24);
    for trans_a in [false, true] {
        for trans_b in [false, true] {
            for &(m, n, k) in &[
                (1, 1, 1),
                (17, 63, 130),
                (130, 17, 63),
                (63, 130, 17),
                (64, 64, 64),
                (2, 1, 17),
            ] {
                let shape = GemmShape {
                    m,
                    n,
                    k,
                    trans_a,
                    trans_b,
                };
                let a = rng.vec(m * k, -1.0, 1.0);
                let b = rng.vec(k * n, -1.0, 1.0);
                let c0 = rng.vec(m * n, -1.0, 1.0);
                let (ab, scale) = gemm64(shape, &a, &b);
                let what = format!("gemm {shape:?}");
                // An f32 dot product of k terms: error <= k eps sum |a b| (plus one rounding for beta C).
                let tol = |i: usize| (k as f64 + 1.0) * EPS * (scale[i] + 1.0);

                let mut c = vec![f32::NAN; m * n];
                gemm_ref(shape, &a, &b, 0.0, &mut c);
                assert_close(&format!("{what} beta=0"), &c, &ab, tol);

                let mut c = c0.clone();
                gemm_ref(shape, &a, &b, 1.0, &mut c);
                let want: Vec<f64> = ab.iter().zip(&c0).map(|(x, &y)| x + f64::from(y)).collect();
                assert_close(&format!("{what} beta=1"), &c, &want, tol);
            }
        }
    }
}
