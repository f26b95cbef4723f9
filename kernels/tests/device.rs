//! The kernel bodies that the PTX runs, executed on the host by an emulated GPU (one OS thread per GPU
//! thread, a barrier per block, NaN-filled shared memory: see `common::launch`), on awkward sizes.
//!
//! The GEMM kernels are checked against `f64`; the elementwise and loss kernels against the host slice
//! functions bit for bit (they call the same scalar functions, and those are checked against `f64` in
//! the other test files), which checks the kernels' indexing, bounds and grid-stride loops.

mod common;

use common::{act64, dact64, launch, Rng, Shared};
use pipefill_kernels::device::linear::{
    linear_backward_input, linear_backward_weight, linear_forward, LinearBackwardInput,
    LinearBackwardWeight, LinearForward,
};
use pipefill_kernels::device::{elementwise, reduce};
use pipefill_kernels::{
    activation_backward, activation_forward, elementwise_grid, gemm_grid, mse_grad,
    softmax_ce_grad, Activation, AdamW, SgdMomentum,
};

const EPS: f64 = f32::EPSILON as f64;

/// `(rows, inputs, outputs)`: none a multiple of the 64 x 64 x 16 tiling except one control case, plus empty
/// dimensions (`inputs = 0`: `Y = act(b)`, `dX` empty; `rows = 0`: nothing to compute, `dW` and `db` unchanged).
const SHAPES: [(usize, usize, usize); 9] = [
    (1, 1, 1),
    (17, 63, 130),
    (130, 17, 63),
    (63, 130, 17),
    (64, 64, 64),
    (2, 17, 1),
    (65, 15, 33),
    (3, 0, 5),
    (0, 4, 70),
];

/// `|got - want| <= tol` elementwise, naming the case.
fn check(what: &str, got: &[f32], want: &[f64], tol: &[f64]) {
    for (i, ((&g, &w), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= t,
            "{what}[{i}]: got {g}, want {w}, error {err:e} > {t:e}"
        );
    }
}

#[test]
fn linear_forward_matches_f64() {
    let mut rng = Rng::new(51);
    for (rows, inputs, outputs) in SHAPES {
        for act in Activation::ALL {
            let x = rng.vec(rows * inputs, -1.0, 1.0);
            let w = rng.vec(inputs * outputs, -1.0, 1.0);
            let b = rng.vec(outputs, -1.0, 1.0);
            let mut y = vec![f32::NAN; rows * outputs];
            let mut z = vec![f32::NAN; rows * outputs];
            let args = Shared(LinearForward {
                x: x.as_ptr(),
                w: w.as_ptr(),
                b: b.as_ptr(),
                y: y.as_mut_ptr(),
                z: z.as_mut_ptr(),
                rows,
                inputs,
                outputs,
                act,
            });
            launch(gemm_grid(rows, outputs), |g| unsafe {
                linear_forward(g, args.get())
            });

            let (mut z64, mut scale) = (vec![0.0; rows * outputs], vec![0.0; rows * outputs]);
            for r in 0..rows {
                for j in 0..outputs {
                    let mut s = f64::from(b[j]);
                    let mut a = f64::from(b[j]).abs();
                    for p in 0..inputs {
                        let t = f64::from(x[r * inputs + p]) * f64::from(w[p * outputs + j]);
                        s += t;
                        a += t.abs();
                    }
                    z64[r * outputs + j] = s;
                    scale[r * outputs + j] = a;
                }
            }
            // Z: an f32 dot product of `inputs` terms plus the bias: (inputs + 1) eps sum |terms|.
            let ztol: Vec<f64> = scale
                .iter()
                .map(|s| (inputs as f64 + 1.0) * EPS * s)
                .collect();
            let what = format!("forward {act} {rows}x{inputs}x{outputs}");
            check(&format!("{what} z"), &z, &z64, &ztol);
            // Y: Z's error times |act'| <= 1.2, plus the activation's own error (at most 1e-5 relative for
            // |z| <= 64 would be too loose for identity/relu, so use the tested forward bound).
            let y64: Vec<f64> = z64.iter().map(|&z| act64(act, z)).collect();
            let ytol: Vec<f64> = (0..y.len())
                .map(|i| 1.2 * ztol[i] + common::forward_bound(act, z[i]) * y64[i].abs() + 1e-35)
                .collect();
            check(&format!("{what} y"), &y, &y64, &ytol);

            // Without storing Z the output is the same, and the null pointer is never written.
            let mut y2 = vec![f32::NAN; rows * outputs];
            let args = Shared(LinearForward {
                y: y2.as_mut_ptr(),
                z: std::ptr::null_mut(),
                ..*args.get()
            });
            launch(gemm_grid(rows, outputs), |g| unsafe {
                linear_forward(g, args.get())
            });
            assert_eq!(y2, y, "{what}: output depends on storing Z");
        }
    }
}

#[test]
fn linear_backward_input_matches_f64_and_stores_dz() {
    let mut rng = Rng::new(52);
    for (rows, inputs, outputs) in SHAPES {
        for act in Activation::ALL {
            let dy = rng.vec(rows * outputs, -1.0, 1.0);
            let z = rng.vec(rows * outputs, -4.0, 4.0);
            let w = rng.vec(inputs * outputs, -1.0, 1.0);
            let mut dx = vec![f32::NAN; rows * inputs];
            let mut dz = vec![f32::NAN; rows * outputs];
            let args = Shared(LinearBackwardInput {
                dy: dy.as_ptr(),
                z: z.as_ptr(),
                w: w.as_ptr(),
                dx: dx.as_mut_ptr(),
                dz: dz.as_mut_ptr(),
                rows,
                inputs,
                outputs,
                act,
            });
            launch(gemm_grid(rows, inputs), |g| unsafe {
                linear_backward_input(g, args.get())
            });

            let dz64: Vec<f64> = dy
                .iter()
                .zip(&z)
                .map(|(&d, &z)| f64::from(d) * dact64(act, f64::from(z)))
                .collect();
            let what = format!("backward-input {act} {rows}x{inputs}x{outputs}");
            // dZ: the derivative within 2e-6 absolute (tests/activation.rs) times |dy| <= 1, one rounding.
            let dztol: Vec<f64> = dz64.iter().map(|v| 2e-6 + EPS * v.abs()).collect();
            check(&format!("{what} dz"), &dz, &dz64, &dztol);

            let (mut dx64, mut tol) = (vec![0.0; rows * inputs], vec![0.0; rows * inputs]);
            for r in 0..rows {
                for i in 0..inputs {
                    let (mut s, mut a) = (0.0, 0.0);
                    for p in 0..outputs {
                        let wv = f64::from(w[i * outputs + p]);
                        s += dz64[r * outputs + p] * wv;
                        a += (dz64[r * outputs + p] * wv).abs() + dztol[r * outputs + p] * wv.abs();
                    }
                    dx64[r * inputs + i] = s;
                    // Each dZ term carries its own error; then an f32 dot product of `outputs` terms.
                    tol[r * inputs + i] = (outputs as f64 + 1.0) * EPS * a + a * 2e-6;
                }
            }
            check(&format!("{what} dx"), &dx, &dx64, &tol);
        }
    }
}

#[test]
fn linear_backward_weight_accumulates_and_matches_f64() {
    let mut rng = Rng::new(53);
    for (rows, inputs, outputs) in SHAPES {
        let x = rng.vec(rows * inputs, -1.0, 1.0);
        let dz = rng.vec(rows * outputs, -1.0, 1.0);
        let dw0 = rng.vec(inputs * outputs, -1.0, 1.0);
        let db0 = rng.vec(outputs, -1.0, 1.0);
        let (mut dw, mut db) = (dw0.clone(), db0.clone());
        let args = Shared(LinearBackwardWeight {
            x: x.as_ptr(),
            dz: dz.as_ptr(),
            dw: dw.as_mut_ptr(),
            db: db.as_mut_ptr(),
            rows,
            inputs,
            outputs,
        });
        // Two microbatches of the same data accumulate twice.
        for _ in 0..2 {
            launch(gemm_grid(inputs, outputs), |g| unsafe {
                linear_backward_weight(g, args.get())
            });
        }
        let what = format!("backward-weight {rows}x{inputs}x{outputs}");
        let (mut dw64, mut tol) = (vec![0.0; inputs * outputs], vec![0.0; inputs * outputs]);
        for i in 0..inputs {
            for j in 0..outputs {
                let (mut s, mut a) = (0.0, 0.0);
                for r in 0..rows {
                    let t = f64::from(x[r * inputs + i]) * f64::from(dz[r * outputs + j]);
                    s += t;
                    a += t.abs();
                }
                let d0 = f64::from(dw0[i * outputs + j]);
                dw64[i * outputs + j] = d0 + 2.0 * s;
                tol[i * outputs + j] = (rows as f64 + 2.0) * EPS * (2.0 * a + d0.abs()) * 2.0;
            }
        }
        check(&format!("{what} dw"), &dw, &dw64, &tol);
        let db64: Vec<f64> = (0..outputs)
            .map(|j| {
                f64::from(db0[j])
                    + 2.0
                        * (0..rows)
                            .map(|r| f64::from(dz[r * outputs + j]))
                            .sum::<f64>()
            })
            .collect();
        let dbtol = vec![(2.0 * rows as f64 + 2.0) * EPS * (2.0 * rows as f64 + 1.0); outputs];
        check(&format!("{what} db"), &db, &db64, &dbtol);

        // Without db, dW is the same and nothing else is written.
        let mut dw2 = dw0.clone();
        let args = Shared(LinearBackwardWeight {
            dw: dw2.as_mut_ptr(),
            db: std::ptr::null_mut(),
            ..*args.get()
        });
        launch(gemm_grid(inputs, outputs), |g| unsafe {
            linear_backward_weight(g, args.get())
        });
        launch(gemm_grid(inputs, outputs), |g| unsafe {
            linear_backward_weight(g, args.get())
        });
        assert_eq!(dw2, dw, "{what}: dW depends on summing db");
    }
}

/// Sizes for the elementwise kernels, launched on 2 blocks so most need several grid-stride rounds.
const LENGTHS: [usize; 6] = [1, 17, 130, 511, 512, 1300];
const SMALL_GRID: (u32, u32, u32) = (2, 1, 1);

#[test]
fn elementwise_kernels_equal_host_functions() {
    let mut rng = Rng::new(54);
    for n in LENGTHS {
        for grid in [SMALL_GRID, elementwise_grid(n)] {
            let z = rng.vec(n, -6.0, 6.0);
            let dy = rng.vec(n, -1.0, 1.0);
            for act in Activation::ALL {
                let (mut y, mut want) = (vec![f32::NAN; n], vec![0.0; n]);
                let p = Shared((z.as_ptr(), y.as_mut_ptr()));
                launch(grid, |g| unsafe {
                    elementwise::activation_forward(g, p.get().0, p.get().1, n, act)
                });
                activation_forward(&z, &mut want, act);
                assert_eq!(y, want, "activation forward {act} n={n} grid={grid:?}");

                let (mut dz, mut want) = (vec![f32::NAN; n], vec![0.0; n]);
                let p = Shared((dy.as_ptr(), z.as_ptr(), dz.as_mut_ptr()));
                launch(grid, |g| unsafe {
                    let (dy, z, dz) = *p.get();
                    elementwise::activation_backward(g, dy, z, dz, n, act)
                });
                activation_backward(&dy, &z, &mut want, act);
                assert_eq!(dz, want, "activation backward {act} n={n} grid={grid:?}");
            }

            let (mut grad, mut want) = (vec![f32::NAN; n], vec![0.0; n]);
            let p = Shared((z.as_ptr(), dy.as_ptr(), grad.as_mut_ptr()));
            let norm = 3.0 * n as f32;
            launch(grid, |g| unsafe {
                let (pred, target, grad) = *p.get();
                elementwise::mse_grad(g, pred, target, grad, n, 1.0 / norm)
            });
            mse_grad(&z, &dy, &mut want, norm);
            assert_eq!(grad, want, "mse grad n={n} grid={grid:?}");
        }
    }
}

#[test]
fn optimizer_kernels_equal_host_functions() {
    let mut rng = Rng::new(55);
    let sgd = SgdMomentum {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 1e-3,
    };
    let adamw = AdamW::with_lr(1e-2);
    for n in LENGTHS {
        let p0 = rng.vec(n, -1.0, 1.0);
        let (mut p, mut v) = (p0.clone(), vec![0.0; n]);
        let (mut hp, mut hv) = (p0.clone(), vec![0.0; n]);
        for _ in 0..3 {
            let g = rng.vec(n, -1.0, 1.0);
            let a = Shared((p.as_mut_ptr(), g.as_ptr(), v.as_mut_ptr()));
            launch(SMALL_GRID, |gr| unsafe {
                let (p, g, v) = *a.get();
                elementwise::sgd_momentum(gr, p, g, v, n, &sgd)
            });
            sgd.step(&mut hp, &g, &mut hv);
            assert_eq!((&p, &v), (&hp, &hv), "sgd n={n}");
        }

        let (mut p, mut m, mut v) = (p0.clone(), vec![0.0; n], vec![0.0; n]);
        let (mut hp, mut hm, mut hv) = (p0.clone(), vec![0.0; n], vec![0.0; n]);
        for t in 1..=3 {
            let g = rng.vec(n, -1.0, 1.0);
            let step = adamw.at_step(t);
            let a = Shared((p.as_mut_ptr(), g.as_ptr(), m.as_mut_ptr(), v.as_mut_ptr()));
            launch(SMALL_GRID, |gr| unsafe {
                let (p, g, m, v) = *a.get();
                elementwise::adamw(gr, p, g, m, v, n, &step)
            });
            adamw.step(t, &mut hp, &g, &mut hm, &mut hv);
            assert_eq!((&p, &m, &v), (&hp, &hm, &hv), "adamw n={n} t={t}");
        }
    }
}

#[test]
fn mse_forward_partials_sum_to_the_loss() {
    let mut rng = Rng::new(56);
    for n in LENGTHS {
        for grid in [SMALL_GRID, elementwise_grid(n)] {
            let pred = rng.vec(n, -2.0, 2.0);
            let target = rng.vec(n, -2.0, 2.0);
            let mut partial = vec![f32::NAN; grid.0 as usize];
            let a = Shared((pred.as_ptr(), target.as_ptr(), partial.as_mut_ptr()));
            launch(grid, |g| unsafe {
                let (p, t, out) = *a.get();
                reduce::mse_forward(g, p, t, n, out)
            });
            let got = partial.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
            let want = pred
                .iter()
                .zip(&target)
                .map(|(&p, &t)| (f64::from(p) - f64::from(t)).powi(2))
                .sum::<f64>()
                / n as f64;
            // f32 sums: per thread over ceil(n / threads) terms, then a tree of 8 levels: (n + 8) eps relative.
            let tol = (n as f64 + 8.0) * EPS * want;
            assert!(
                (got - want).abs() <= tol,
                "mse forward n={n} grid={grid:?}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn softmax_cross_entropy_kernels_equal_host_functions() {
    let mut rng = Rng::new(57);
    for rows in [1usize, 17, 130, 600] {
        for classes in [1usize, 2, 10, 17] {
            let logits = rng.vec(rows * classes, -8.0, 8.0);
            let mut targets: Vec<u32> = (0..rows).map(|_| rng.below(classes as u32)).collect();
            let mut loss = vec![0.0f32; rows];
            let mut grad = vec![0.0f32; rows * classes];
            let a = Shared((
                logits.as_ptr(),
                targets.as_ptr(),
                loss.as_mut_ptr(),
                grad.as_mut_ptr(),
            ));
            let scale = 1.0 / rows as f32;
            launch(SMALL_GRID, |g| unsafe {
                let (l, t, out, gr) = *a.get();
                reduce::softmax_ce_forward(g, l, t, rows, classes, out);
                reduce::softmax_ce_grad(g, l, t, gr, rows, classes, scale);
            });
            let host_rows: Vec<f32> = logits
                .chunks(classes)
                .zip(&targets)
                .map(|(row, &t)| pipefill_kernels::loss::softmax_ce_row(row, t as usize))
                .collect();
            assert_eq!(loss, host_rows, "ce forward {rows}x{classes}");
            let mut want = vec![0.0; rows * classes];
            softmax_ce_grad(&logits, &targets, &mut want, rows as f32);
            assert_eq!(grad, want, "ce grad {rows}x{classes}");

            // An out-of-range target gives NaN for that row only, never a wild read.
            targets[0] = classes as u32;
            let a = Shared((
                logits.as_ptr(),
                targets.as_ptr(),
                loss.as_mut_ptr(),
                grad.as_mut_ptr(),
            ));
            launch(SMALL_GRID, |g| unsafe {
                let (l, t, out, gr) = *a.get();
                reduce::softmax_ce_forward(g, l, t, rows, classes, out);
                reduce::softmax_ce_grad(g, l, t, gr, rows, classes, scale);
            });
            assert!(
                loss[0].is_nan() && grad[..classes].iter().all(|x| x.is_nan()),
                "bad target {rows}x{classes}"
            );
            assert_eq!(
                &loss[1..],
                &host_rows[1..],
                "ce forward {rows}x{classes} after a bad target"
            );
        }
    }
}

#[test]
fn bf16_conversion_kernels_equal_host_functions() {
    use pipefill_kernels::device::convert::{bf16_to_f32_kernel, f32_to_bf16_kernel, to_bf16};
    let mut rng = Rng::new(57);
    for n in LENGTHS {
        for grid in [SMALL_GRID, elementwise_grid(n)] {
            let mut x = rng.vec(n, -3.0, 3.0);
            // A tie (rounds to even), a value that rounds up, NaN and infinity.
            let specials = [f32::from_bits(0x3f80_8000), f32::from_bits(0x3f80_8001)];
            for (v, s) in x
                .iter_mut()
                .zip(specials.into_iter().chain([f32::NAN, f32::INFINITY]))
            {
                *v = s;
            }
            let mut h = vec![0xdead_u16; n];
            let p = Shared((x.as_ptr(), h.as_mut_ptr()));
            launch(grid, |g| unsafe {
                f32_to_bf16_kernel(g, p.get().0, p.get().1, n)
            });
            let want: Vec<u16> = to_bf16(&x).collect();
            assert_eq!(h, want, "f32 -> bf16 n={n} grid={grid:?}");
            for (&b, &v) in h.iter().zip(&x) {
                // Against f64: within half a BF16 ulp (at most 2^-8 relative), NaN kept.
                let back = f64::from(f32::from_bits(u32::from(b) << 16));
                let v = f64::from(v);
                assert!(
                    (v.is_nan() && back.is_nan())
                        || back == v
                        || (back - v).abs() <= v.abs() / 256.0,
                    "bf16({v}) = {back}"
                );
            }

            let mut y = vec![f32::NAN; n];
            let p = Shared((h.as_ptr(), y.as_mut_ptr()));
            launch(grid, |g| unsafe {
                bf16_to_f32_kernel(g, p.get().0, p.get().1, n)
            });
            for (i, (&b, &got)) in h.iter().zip(&y).enumerate() {
                assert_eq!(got.to_bits(), u32::from(b) << 16, "bf16 -> f32 [{i}] n={n}");
            }
        }
    }
}
