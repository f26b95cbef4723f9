//! The six tensor-core kernels (forward, input gradient, weight gradient; TF32 and BF16) run on the host
//! emulator (`common::tc`: real fragment layouts, `cp.async` landing only at its wait) against `f64`, on
//! sizes that are not tile multiples, with empty dimensions, and on both copy paths (16-byte `cp.async`
//! when rows are whole 16-byte chunks, element copies otherwise).
//!
//! Tolerances (`scale = sum |a b|` over the reduced dimension of length `k`, `eps = 2^-23`):
//! - TF32: the kernel rounds each input to 10 mantissa bits (relative `2^-11`), so a product is off by at
//!   most `2^-10` relative; with `f32` accumulation: `(2^-10 + (k + 2) eps) scale`.
//! - BF16: the inputs are BF16 values (exact products), `f32` accumulation `(k + 2) eps scale`, and every
//!   BF16 result (`Y`, `Z`, `dZ`, `dX`) rounded once more: `2^-8` relative.

mod common;

use common::tc::{launch_tc, TcGrid};
use common::{act64, dact64, forward_bound, Rng, Shared};
use pipefill_kernels::device::linear_tc::{
    linear_backward_input_tc, linear_backward_weight_tc, linear_forward_tc, TcBackwardInput,
    TcBackwardWeight, TcForward,
};
use pipefill_kernels::tc::{launch, Bf16, MmaType, Precision, Product, Tf32};
use pipefill_kernels::Activation;

const EPS: f64 = f32::EPSILON as f64;

/// `(rows, inputs, outputs)`: odd sizes, more reduced steps than pipeline stages, several blocks, empty
/// dimensions, and two shapes whose rows are whole 16-byte chunks in both precisions (vectorized copies).
const SHAPES: [(usize, usize, usize); 9] = [
    (1, 1, 1),
    (17, 63, 130),
    (130, 17, 63),
    (63, 130, 17),
    (2, 17, 1),
    (3, 0, 5),
    (0, 4, 70),
    (40, 200, 136),
    (150, 48, 24),
];

/// A precision as the tests see it.
trait TestPrec: MmaType {
    const PRECISION: Precision;
    /// Relative error of one product from the kernel's own input rounding.
    const IN_REL: f64;
    /// Relative error of storing a result.
    const OUT_REL: f64;
    fn store(v: &[f32]) -> Vec<Self::Elem> {
        v.iter().map(|&x| Self::from_f32(x)).collect()
    }
    fn load(e: &[Self::Elem]) -> Vec<f32> {
        e.iter().map(|&x| Self::to_f32(x)).collect()
    }
}
impl TestPrec for Tf32 {
    const PRECISION: Precision = Precision::Tf32;
    const IN_REL: f64 = 1.01 / 1024.0;
    const OUT_REL: f64 = 0.0;
}
impl TestPrec for Bf16 {
    const PRECISION: Precision = Precision::Bf16;
    const IN_REL: f64 = 0.0;
    const OUT_REL: f64 = 1.01 / 256.0;
}

/// `|got - want| <= tol` elementwise, naming the case.
fn check(what: &str, got: &[f32], want: &[f64], tol: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, ((&g, &w), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= t,
            "{what}[{i}]: got {g}, want {w}, error {err:e} > {t:e}"
        );
    }
}

/// The inputs as the kernel stores them, and their values.
fn data<P: TestPrec>(rng: &mut Rng, len: usize, lo: f32, hi: f32) -> (Vec<P::Elem>, Vec<f32>) {
    let stored = P::store(&rng.vec(len, lo, hi));
    let values = P::load(&stored);
    (stored, values)
}

type Fwd<P> = TcForward<<P as MmaType>::Elem>;

fn forward_case<P: TestPrec>(
    run: &(impl Fn(&TcGrid, &Fwd<P>) + Sync),
    rng: &mut Rng,
    (rows, inputs, outputs): (usize, usize, usize),
    act: Activation,
) {
    let (x, xv) = data::<P>(rng, rows * inputs, -1.0, 1.0);
    let (w, wv) = data::<P>(rng, inputs * outputs, -1.0, 1.0);
    let b = rng.vec(outputs, -1.0, 1.0);
    let nan = P::from_f32(f32::NAN);
    let (mut y, mut z) = (vec![nan; rows * outputs], vec![nan; rows * outputs]);
    let args = Shared(TcForward {
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
    let shape = launch(Product::Forward, P::PRECISION, rows, inputs, outputs);
    launch_tc(shape, |g| run(g, args.get()));

    let what = format!("forward {:?} {act} {rows}x{inputs}x{outputs}", P::PRECISION);
    let n = rows * outputs;
    let (mut z64, mut ztol, mut y64, mut ytol) =
        (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for r in 0..rows {
        for j in 0..outputs {
            let (mut s, mut scale) = (f64::from(b[j]), f64::from(b[j]).abs());
            for p in 0..inputs {
                let t = f64::from(xv[r * inputs + p]) * f64::from(wv[p * outputs + j]);
                s += t;
                scale += t.abs();
            }
            let at = r * outputs + j;
            let acc_err = (P::IN_REL + (inputs as f64 + 2.0) * EPS) * scale + 1e-30;
            z64[at] = s;
            ztol[at] = acc_err + P::OUT_REL * (s.abs() + acc_err);
            y64[at] = act64(act, s);
            let fb = forward_bound(act, s as f32) * y64[at].abs();
            ytol[at] =
                1.2 * acc_err + fb + P::OUT_REL * (y64[at].abs() + 1.2 * acc_err + fb) + 1e-30;
        }
    }
    check(&format!("{what} z"), &P::load(&z), &z64, &ztol);
    check(&format!("{what} y"), &P::load(&y), &y64, &ytol);

    // Without Z the output is the same, and the null pointer is never written.
    let mut y2 = vec![nan; n];
    let args = Shared(TcForward {
        y: y2.as_mut_ptr(),
        z: std::ptr::null_mut(),
        ..*args.get()
    });
    launch_tc(shape, |g| run(g, args.get()));
    assert_eq!(P::load(&y2), P::load(&y), "{what}: Y depends on storing Z");
}

fn forward_all<P: TestPrec>(run: impl Fn(&TcGrid, &Fwd<P>) + Sync, seed: u64) {
    let mut rng = Rng::new(seed);
    for (i, shape) in SHAPES.into_iter().enumerate() {
        forward_case::<P>(&run, &mut rng, shape, Activation::ALL[i % 4]);
    }
    for act in Activation::ALL {
        forward_case::<P>(&run, &mut rng, (33, 40, 17), act);
    }
}

#[test]
fn forward_tf32_matches_f64() {
    forward_all::<Tf32>(|g, a| unsafe { linear_forward_tc::<_, Tf32, 16>(g, a) }, 81);
}

#[test]
fn forward_bf16_matches_f64() {
    forward_all::<Bf16>(|g, a| unsafe { linear_forward_tc::<_, Bf16, 32>(g, a) }, 82);
}

type Bwi<P> = TcBackwardInput<<P as MmaType>::Elem>;

fn backward_input_case<P: TestPrec>(
    run: &(impl Fn(&TcGrid, &Bwi<P>) + Sync),
    rng: &mut Rng,
    (rows, inputs, outputs): (usize, usize, usize),
    act: Activation,
) {
    let (dy, dyv) = data::<P>(rng, rows * outputs, -1.0, 1.0);
    let (z, zv) = data::<P>(rng, rows * outputs, -4.0, 4.0);
    let (w, wv) = data::<P>(rng, inputs * outputs, -1.0, 1.0);
    let nan = P::from_f32(f32::NAN);
    let (mut dx, mut dz) = (vec![nan; rows * inputs], vec![nan; rows * outputs]);
    // Identity needs no Z: pass null to check it is never read.
    let zp = if act == Activation::Identity {
        std::ptr::null()
    } else {
        z.as_ptr()
    };
    let args = Shared(TcBackwardInput {
        dy: dy.as_ptr(),
        z: zp,
        w: w.as_ptr(),
        dx: dx.as_mut_ptr(),
        dz: dz.as_mut_ptr(),
        rows,
        inputs,
        outputs,
        act,
    });
    launch_tc(
        launch(Product::BackwardInput, P::PRECISION, rows, inputs, outputs),
        |g| run(g, args.get()),
    );

    let what = format!(
        "backward-input {:?} {act} {rows}x{inputs}x{outputs}",
        P::PRECISION
    );
    let dz64: Vec<f64> = dyv
        .iter()
        .zip(&zv)
        .map(|(&d, &z)| f64::from(d) * dact64(act, f64::from(z)))
        .collect();
    // The derivative within 2e-6 absolute (tests/activation.rs) times |dy| <= 1, one f32 rounding, and
    // the storage rounding.
    let dztol: Vec<f64> = dz64
        .iter()
        .map(|v| 2e-6 + EPS * v.abs() + P::OUT_REL * (v.abs() + 2e-6))
        .collect();
    check(&format!("{what} dz"), &P::load(&dz), &dz64, &dztol);

    let (mut dx64, mut tol) = (vec![0.0; rows * inputs], vec![0.0; rows * inputs]);
    for r in 0..rows {
        for i in 0..inputs {
            let (mut s, mut a, mut e) = (0.0, 0.0, 0.0);
            for p in 0..outputs {
                let wv = f64::from(wv[i * outputs + p]);
                s += dz64[r * outputs + p] * wv;
                a += (dz64[r * outputs + p] * wv).abs();
                e += dztol[r * outputs + p] * wv.abs();
            }
            let acc = e + (P::IN_REL + (outputs as f64 + 2.0) * EPS) * (a + e) + 1e-30;
            dx64[r * inputs + i] = s;
            tol[r * inputs + i] = acc + P::OUT_REL * (s.abs() + acc);
        }
    }
    check(&format!("{what} dx"), &P::load(&dx), &dx64, &tol);
}

fn backward_input_all<P: TestPrec>(run: impl Fn(&TcGrid, &Bwi<P>) + Sync, seed: u64) {
    let mut rng = Rng::new(seed);
    for (i, shape) in SHAPES.into_iter().enumerate() {
        backward_input_case::<P>(&run, &mut rng, shape, Activation::ALL[(i + 1) % 4]);
    }
    for act in Activation::ALL {
        backward_input_case::<P>(&run, &mut rng, (33, 17, 40), act);
    }
}

#[test]
fn backward_input_tf32_matches_f64_and_stores_dz() {
    backward_input_all::<Tf32>(
        |g, a| unsafe { linear_backward_input_tc::<_, Tf32, 16>(g, a) },
        83,
    );
}

#[test]
fn backward_input_bf16_matches_f64_and_stores_dz() {
    backward_input_all::<Bf16>(
        |g, a| unsafe { linear_backward_input_tc::<_, Bf16, 32>(g, a) },
        84,
    );
}

type Bww<P> = TcBackwardWeight<<P as MmaType>::Elem>;

fn backward_weight_case<P: TestPrec>(
    run: &(impl Fn(&TcGrid, &Bww<P>) + Sync),
    rng: &mut Rng,
    (rows, inputs, outputs): (usize, usize, usize),
) {
    let (x, xv) = data::<P>(rng, rows * inputs, -1.0, 1.0);
    let (dz, dzv) = data::<P>(rng, rows * outputs, -1.0, 1.0);
    let dw0 = rng.vec(inputs * outputs, -1.0, 1.0);
    let db0 = rng.vec(outputs, -1.0, 1.0);
    let (mut dw, mut db) = (dw0.clone(), db0.clone());
    let args = Shared(TcBackwardWeight {
        x: x.as_ptr(),
        dz: dz.as_ptr(),
        dw: dw.as_mut_ptr(),
        db: db.as_mut_ptr(),
        rows,
        inputs,
        outputs,
    });
    let shape = launch(Product::BackwardWeight, P::PRECISION, rows, inputs, outputs);
    // Two microbatches of the same data accumulate twice.
    for _ in 0..2 {
        launch_tc(shape, |g| run(g, args.get()));
    }
    let what = format!(
        "backward-weight {:?} {rows}x{inputs}x{outputs}",
        P::PRECISION
    );
    let (mut dw64, mut tol) = (vec![0.0; inputs * outputs], vec![0.0; inputs * outputs]);
    for i in 0..inputs {
        for j in 0..outputs {
            let (mut s, mut a) = (0.0, 0.0);
            for r in 0..rows {
                let t = f64::from(xv[r * inputs + i]) * f64::from(dzv[r * outputs + j]);
                s += t;
                a += t.abs();
            }
            let d0 = f64::from(dw0[i * outputs + j]);
            dw64[i * outputs + j] = d0 + 2.0 * s;
            tol[i * outputs + j] = 2.0 * (P::IN_REL + (rows as f64 + 3.0) * EPS) * a
                + 2.0 * EPS * (d0.abs() + 2.0 * a)
                + 1e-30;
        }
    }
    check(&format!("{what} dw"), &dw, &dw64, &tol);
    let db64: Vec<f64> = (0..outputs)
        .map(|j| {
            f64::from(db0[j])
                + 2.0
                    * (0..rows)
                        .map(|r| f64::from(dzv[r * outputs + j]))
                        .sum::<f64>()
        })
        .collect();
    let dbtol: Vec<f64> = (0..outputs)
        .map(|j| {
            let a: f64 = (0..rows)
                .map(|r| f64::from(dzv[r * outputs + j]).abs())
                .sum();
            (2.0 * rows as f64 + 2.0) * EPS * (2.0 * a + f64::from(db0[j]).abs()) + 1e-30
        })
        .collect();
    check(&format!("{what} db"), &db, &db64, &dbtol);

    // Without db, dW is the same.
    let mut dw2 = dw0.clone();
    let args = Shared(TcBackwardWeight {
        dw: dw2.as_mut_ptr(),
        db: std::ptr::null_mut(),
        ..*args.get()
    });
    for _ in 0..2 {
        launch_tc(shape, |g| run(g, args.get()));
    }
    assert_eq!(dw2, dw, "{what}: dW depends on summing db");
}

fn backward_weight_all<P: TestPrec>(run: impl Fn(&TcGrid, &Bww<P>) + Sync, seed: u64) {
    let mut rng = Rng::new(seed);
    for shape in SHAPES {
        backward_weight_case::<P>(&run, &mut rng, shape);
    }
}

#[test]
fn backward_weight_tf32_accumulates_and_matches_f64() {
    backward_weight_all::<Tf32>(
        |g, a| unsafe { linear_backward_weight_tc::<_, Tf32, 16>(g, a) },
        85,
    );
}

#[test]
fn backward_weight_bf16_accumulates_and_matches_f64() {
    backward_weight_all::<Bf16>(
        |g, a| unsafe { linear_backward_weight_tc::<_, Bf16, 32>(g, a) },
        86,
    );
}
