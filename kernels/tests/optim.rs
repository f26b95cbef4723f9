//! SGD with momentum and AdamW against `f64` implementations of PyTorch's update rules, over several steps.

mod common;

use common::{assert_close, Rng, SIZES};
use pipefill_kernels::{AdamW, SgdMomentum};

const EPS: f64 = f32::EPSILON as f64;
const STEPS: u32 = 5;

#[test]
fn sgd_momentum_matches_f64() {
    let mut rng = Rng::new(41);
    let opt = SgdMomentum {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 1e-3,
    };
    for &len in &SIZES {
        let mut p = rng.vec(len, -1.0, 1.0);
        let mut v = vec![0.0; len];
        let mut p64: Vec<f64> = p.iter().map(|&x| f64::from(x)).collect();
        let mut v64 = vec![0.0f64; len];
        for step in 0..STEPS {
            let g = rng.vec(len, -1.0, 1.0);
            opt.step(&mut p, &g, &mut v);
            // The reference uses the exact values of the f32 hyper-parameters.
            let (lr, mu, wd) = (
                f64::from(opt.lr),
                f64::from(opt.momentum),
                f64::from(opt.weight_decay),
            );
            for i in 0..len {
                v64[i] = mu * v64[i] + (f64::from(g[i]) + wd * p64[i]);
                p64[i] -= lr * v64[i];
            }
            // Each step adds a few roundings of values of size <= 10 (|v| <= 1/(1 - 0.9)); errors carry over.
            let tol = f64::from(step + 1) * 8.0 * EPS * 10.0;
            assert_close(&format!("sgd p {len} step {step}"), &p, &p64, |_| tol);
            assert_close(&format!("sgd v {len} step {step}"), &v, &v64, |_| tol);
        }
    }
}

#[test]
fn adamw_matches_f64() {
    let mut rng = Rng::new(42);
    let opt = AdamW {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    for &len in &SIZES {
        let mut p = rng.vec(len, -1.0, 1.0);
        let mut m = vec![0.0; len];
        let mut v = vec![0.0; len];
        let mut p64: Vec<f64> = p.iter().map(|&x| f64::from(x)).collect();
        let mut m64 = vec![0.0f64; len];
        let mut v64 = vec![0.0f64; len];
        let mut m_scale = vec![0.0f64; len]; // m computed from |g|: the size of the terms that may cancel in m
        for t in 1..=STEPS {
            // Gradients of mixed scale, some tiny (where eps matters).
            let g: Vec<f32> = (0..len)
                .map(|i| rng.uniform(-1.0, 1.0) * if i % 3 == 0 { 1e-6 } else { 1.0 })
                .collect();
            opt.step(t, &mut p, &g, &mut m, &mut v);
            // The reference uses the exact values of the f32 hyper-parameters.
            let (b1, b2, lr) = (
                f64::from(opt.beta1),
                f64::from(opt.beta2),
                f64::from(opt.lr),
            );
            let (eps, wd) = (f64::from(opt.eps), f64::from(opt.weight_decay));
            for i in 0..len {
                let g = f64::from(g[i]);
                p64[i] *= 1.0 - lr * wd;
                m64[i] = b1 * m64[i] + (1.0 - b1) * g;
                m_scale[i] = b1 * m_scale[i] + (1.0 - b1) * g.abs();
                v64[i] = b2 * v64[i] + (1.0 - b2) * g * g;
                let m_hat = m64[i] / (1.0 - b1.powi(t as i32));
                let v_hat = v64[i] / (1.0 - b2.powi(t as i32));
                p64[i] -= lr * m_hat / (v_hat.sqrt() + eps);
            }
            // The step m_hat/(sqrt(v_hat) + eps) is O(1); its relative error is dominated by the bias
            // correction 1/(1 - b2^t): b2^t is rounded (a few eps of 1) and 1 - b2^t ~ t/1000 amplifies
            // that by 1000/t. So ~ 1000 eps per step, times lr, plus a few eps of |p| <= 1; carried over steps.
            let tol = f64::from(t) * (1e-2 * 2e3 * EPS + 4.0 * EPS);
            assert_close(&format!("adamw p {len} t {t}"), &p, &p64, |_| tol);
            assert_close(&format!("adamw m {len} t {t}"), &m, &m64, |i| {
                4.0 * f64::from(t) * EPS * m_scale[i]
            });
            assert_close(&format!("adamw v {len} t {t}"), &v, &v64, |i| {
                4.0 * f64::from(t) * EPS * v64[i]
            });
        }
    }
}
