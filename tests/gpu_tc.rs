//! The tensor-core kernels on a GPU ([`Launcher::linear_forward_tc`] and friends, TF32 with `f32`
//! buffers and BF16 with `u16` buffers) against an `f64` host reference on odd sizes, the BF16
//! conversion kernels against the host's rounding, and one training step of the device layers in each
//! [`Precision`] against the CPU layers.
//!
//! Tolerances are the kernel tests' (`kernels/tests/tensor_core_linear.rs`): with `scale = sum |a b|`
//! over the reduced length `k` and `eps = 2^-23`, TF32 `(2^-10 + (k + 2) eps) scale`; BF16 (inputs
//! already BF16 values) `(k + 2) eps scale` plus `2^-8` relative for each BF16-stored result. The
//! training step compares norm-wise relative differences: fp32 1e-4, TF32 1e-2, BF16 5e-2 (chosen,
//! not derived: a few input roundings of 2^-11 / 2^-8 through 3 layers).
//!
//! Without a GPU every test prints `skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail
//! instead)` and passes; with `PIPEFILL_REQUIRE_GPU=1` it fails instead.

mod gpu_support;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use gpu_support::{assert_stage_close, rel};
use pipefill::cuda::{gpu_or_skip, CudaStage, Gpu, Launcher, LinearDims, Precision, TcElem};
use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::{stage_ranges, LayerSpec, ModelSpec, Teacher};
use pipefill_host::runtime::{sequential_step, Executor};
use pipefill_host::schedule::{families, Params};
use pipefill_kernels::tc::convert::{bf16_to_f32, f32_to_bf16};
use pipefill_kernels::Activation;

const EPS: f64 = f32::EPSILON as f64;

/// `(rows, inputs, outputs)`: odd sizes, several blocks each way, a 1-row case, and one whose rows are
/// whole 16-byte chunks in both precisions (the vector copy path).
const SHAPES: [(usize, usize, usize); 5] = [
    (77, 131, 93),
    (301, 257, 129),
    (1, 5, 3),
    (129, 63, 200),
    (128, 256, 64),
];

/// A small deterministic generator (xorshift), values in `[lo, hi)`.
struct Rng(u64);
impl Rng {
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                lo + (hi - lo) * ((self.0 >> 40) as f32 / (1u64 << 24) as f32)
            })
            .collect()
    }
}

/// How a test stores a precision's matrices on the device.
trait Elem: TcElem + Copy + Default + Unpin {
    /// Relative error of one product from the kernel's own input rounding.
    const IN_REL: f64;
    /// Relative error of storing a result.
    const OUT_REL: f64;
    fn store(v: f32) -> Self;
    fn load(self) -> f32;
}
impl Elem for f32 {
    const IN_REL: f64 = 1.01 / 1024.0;
    const OUT_REL: f64 = 0.0;
    fn store(v: f32) -> Self {
        v
    }
    fn load(self) -> f32 {
        self
    }
}
impl Elem for u16 {
    const IN_REL: f64 = 0.0;
    const OUT_REL: f64 = 1.01 / 256.0;
    fn store(v: f32) -> Self {
        f32_to_bf16(v)
    }
    fn load(self) -> f32 {
        bf16_to_f32(self)
    }
}

fn up<T: DeviceRepr>(s: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    s.clone_htod(v).unwrap()
}

fn down<T: DeviceRepr + Default + Clone>(s: &Arc<CudaStream>, v: &CudaSlice<T>) -> Vec<T> {
    let out = s.clone_dtoh(v).unwrap();
    s.synchronize().unwrap();
    out
}

/// Stored values and their `f32` meaning.
fn data<E: Elem>(rng: &mut Rng, n: usize, lo: f32, hi: f32) -> (Vec<E>, Vec<f32>) {
    let stored: Vec<E> = rng.vec(n, lo, hi).into_iter().map(E::store).collect();
    let values = stored.iter().map(|&e| e.load()).collect();
    (stored, values)
}

fn gelu64(z: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (z + 0.044715 * z * z * z);
    0.5 * z * (1.0 + u.tanh())
}

fn dgelu64(z: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let t = (k * (z + 0.044715 * z * z * z)).tanh();
    0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * z * z)
}

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

/// `sum_p a(p) b(p)` and `sum_p |a(p) b(p)|` in `f64`.
fn dot(k: usize, a: impl Fn(usize) -> f64, b: impl Fn(usize) -> f64) -> (f64, f64) {
    (0..k).fold((0.0, 0.0), |(s, m), p| {
        let t = a(p) * b(p);
        (s + t, m + t.abs())
    })
}

fn forward_case<E: Elem>(
    la: &Launcher,
    rng: &mut Rng,
    (rows, inputs, outputs): (usize, usize, usize),
) {
    let s = la.stream();
    let (x, xv) = data::<E>(rng, rows * inputs, -1.0, 1.0);
    let (w, wv) = data::<E>(rng, inputs * outputs, -1.0, 1.0);
    let b = rng.vec(outputs, -1.0, 1.0);
    let nan = vec![E::store(f32::NAN); rows * outputs];
    let (mut y, mut z) = (up(s, &nan), up(s, &nan));
    let d = LinearDims {
        rows,
        inputs,
        outputs,
        act: Activation::Gelu,
    };
    la.linear_forward_tc(&up(s, &x), &up(s, &w), &up(s, &b), &mut y, Some(&mut z), d)
        .unwrap();
    let (y, z): (Vec<f32>, Vec<f32>) = (
        down(s, &y).into_iter().map(E::load).collect(),
        down(s, &z).into_iter().map(E::load).collect(),
    );
    let n = rows * outputs;
    let (mut z64, mut ztol, mut y64, mut ytol) =
        (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for r in 0..rows {
        for j in 0..outputs {
            let (sum, scale) = dot(
                inputs,
                |p| f64::from(xv[r * inputs + p]),
                |p| f64::from(wv[p * outputs + j]),
            );
            let (zv, scale) = (sum + f64::from(b[j]), scale + f64::from(b[j]).abs());
            let acc = (E::IN_REL + (inputs as f64 + 2.0) * EPS) * scale + 1e-30;
            let at = r * outputs + j;
            z64[at] = zv;
            ztol[at] = acc + E::OUT_REL * (zv.abs() + acc);
            y64[at] = gelu64(zv);
            // GELU's slope is below 1.13; its f32 evaluation is within 8 eps (1 + |2u|) relative
            // (u the tanh argument), as in the kernel tests (`common::forward_bound`).
            let u2 = (2.0 * 0.797_884_6 * (zv + 0.044_715 * zv * zv * zv)).abs();
            let slack = 1.2 * acc + 8.0 * EPS * (1.0 + u2) * y64[at].abs() + 1e-7;
            ytol[at] = slack + E::OUT_REL * (y64[at].abs() + slack);
        }
    }
    let what = format!("forward {:?} {rows}x{inputs}x{outputs}", E::PRECISION);
    check(&format!("{what} z"), &z, &z64, &ztol);
    check(&format!("{what} y"), &y, &y64, &ytol);
}

fn backward_input_case<E: Elem>(
    la: &Launcher,
    rng: &mut Rng,
    (rows, inputs, outputs): (usize, usize, usize),
) {
    let s = la.stream();
    let (dy, dyv) = data::<E>(rng, rows * outputs, -1.0, 1.0);
    let (z, zv) = data::<E>(rng, rows * outputs, -3.0, 3.0);
    let (w, wv) = data::<E>(rng, inputs * outputs, -1.0, 1.0);
    let mut dx = up(s, &vec![E::store(f32::NAN); rows * inputs]);
    let mut dz = up(s, &vec![E::store(f32::NAN); rows * outputs]);
    let d = LinearDims {
        rows,
        inputs,
        outputs,
        act: Activation::Gelu,
    };
    la.linear_backward_input_tc(
        &up(s, &dy),
        Some(&up(s, &z)),
        &up(s, &w),
        &mut dx,
        Some(&mut dz),
        d,
    )
    .unwrap();
    let dx: Vec<f32> = down(s, &dx).into_iter().map(E::load).collect();
    let dz: Vec<f32> = down(s, &dz).into_iter().map(E::load).collect();
    let dz64: Vec<f64> = dyv
        .iter()
        .zip(&zv)
        .map(|(&g, &z)| f64::from(g) * dgelu64(f64::from(z)))
        .collect();
    // The derivative within 2e-6 absolute (kernels/tests/activation.rs) times |dy| <= 1, one f32
    // rounding, and the storage rounding (the kernel tests' bound).
    let dztol: Vec<f64> = dz64
        .iter()
        .map(|v| 2e-6 + EPS * v.abs() + E::OUT_REL * (v.abs() + 2e-6))
        .collect();
    let what = format!(
        "backward input {:?} {rows}x{inputs}x{outputs}",
        E::PRECISION
    );
    check(&format!("{what} dz"), &dz, &dz64, &dztol);
    // dX from the dZ the kernel stored (checked above; the kernel multiplies exactly those values).
    let (mut dx64, mut dxtol) = (vec![0.0; rows * inputs], vec![0.0; rows * inputs]);
    for r in 0..rows {
        for i in 0..inputs {
            let (sum, scale) = dot(
                outputs,
                |j| f64::from(dz[r * outputs + j]),
                |j| f64::from(wv[i * outputs + j]),
            );
            let acc = (E::IN_REL + (outputs as f64 + 2.0) * EPS) * scale + 1e-30;
            dx64[r * inputs + i] = sum;
            dxtol[r * inputs + i] = acc + E::OUT_REL * (sum.abs() + acc);
        }
    }
    check(&format!("{what} dx"), &dx, &dx64, &dxtol);
}

fn backward_weight_case<E: Elem>(
    la: &Launcher,
    rng: &mut Rng,
    (rows, inputs, outputs): (usize, usize, usize),
) {
    let s = la.stream();
    let (x, xv) = data::<E>(rng, rows * inputs, -1.0, 1.0);
    let (dz, dzv) = data::<E>(rng, rows * outputs, -1.0, 1.0);
    let (dw0, db0) = (
        rng.vec(inputs * outputs, -1.0, 1.0),
        rng.vec(outputs, -1.0, 1.0),
    );
    let (mut dw, mut db) = (up(s, &dw0), up(s, &db0));
    let d = LinearDims {
        rows,
        inputs,
        outputs,
        act: Activation::Identity,
    };
    la.linear_backward_weight_tc(&up(s, &x), &up(s, &dz), &mut dw, Some(&mut db), d)
        .unwrap();
    let (dw, db) = (down(s, &dw), down(s, &db));
    let (mut dw64, mut dwtol) = (vec![0.0; inputs * outputs], vec![0.0; inputs * outputs]);
    for i in 0..inputs {
        for j in 0..outputs {
            let (sum, scale) = dot(
                rows,
                |r| f64::from(xv[r * inputs + i]),
                |r| f64::from(dzv[r * outputs + j]),
            );
            let at = i * outputs + j;
            let base = f64::from(dw0[at]);
            dw64[at] = base + sum;
            dwtol[at] = (E::IN_REL + (rows as f64 + 2.0) * EPS) * (scale + base.abs()) + 1e-30;
        }
    }
    let (mut db64, mut dbtol) = (vec![0.0; outputs], vec![0.0; outputs]);
    for j in 0..outputs {
        let (sum, scale) = dot(rows, |_| 1.0, |r| f64::from(dzv[r * outputs + j]));
        db64[j] = f64::from(db0[j]) + sum;
        dbtol[j] =
            (E::IN_REL + (rows as f64 + 2.0) * EPS) * (scale + f64::from(db0[j]).abs()) + 1e-30;
    }
    let what = format!(
        "backward weight {:?} {rows}x{inputs}x{outputs}",
        E::PRECISION
    );
    check(&format!("{what} dw"), &dw, &dw64, &dwtol);
    check(&format!("{what} db"), &db, &db64, &dbtol);
}

fn launcher(gpu: &Arc<Gpu>) -> Launcher {
    Launcher::new(gpu.clone(), gpu.new_stream().unwrap())
}

fn all_products<E: Elem>(gpu: &Arc<Gpu>, seed: u64) {
    let la = launcher(gpu);
    let mut rng = Rng(seed);
    for shape in SHAPES {
        forward_case::<E>(&la, &mut rng, shape);
        backward_input_case::<E>(&la, &mut rng, shape);
        backward_weight_case::<E>(&la, &mut rng, shape);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn tf32_kernels_match_f64_on_odd_sizes() {
    let Some(gpu) = gpu_or_skip("tf32_kernels_match_f64_on_odd_sizes") else {
        return;
    };
    all_products::<f32>(&gpu, 0x9e37_79b9);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn bf16_kernels_match_f64_on_odd_sizes() {
    let Some(gpu) = gpu_or_skip("bf16_kernels_match_f64_on_odd_sizes") else {
        return;
    };
    all_products::<u16>(&gpu, 0x7f4a_7c15);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn bf16_conversions_match_the_host_rounding() {
    let Some(gpu) = gpu_or_skip("bf16_conversions_match_the_host_rounding") else {
        return;
    };
    let la = launcher(&gpu);
    let s = la.stream();
    let mut x = Rng(5).vec(100_003, -1e3, 1e3);
    x[..4].copy_from_slice(&[f32::from_bits(0x3f80_8000), f32::NAN, f32::INFINITY, -0.0]);
    let h = down(s, &la.to_bf16(&up(s, &x)).unwrap());
    // A NaN may come back with any payload (the hardware's cvt.rn.bf16.f32 gives 0x7fff, the
    // host 0x7fc0): NaNs compare as NaNs, every other value bit for bit.
    let is_nan = |b: u16| b & 0x7f80 == 0x7f80 && b & 0x007f != 0;
    let class = |b: u16| if is_nan(b) { 0x7fc0 } else { b };
    let want: Vec<u16> = x.iter().map(|&v| class(f32_to_bf16(v))).collect();
    let got: Vec<u16> = h.iter().map(|&b| class(b)).collect();
    assert_eq!(got, want, "f32 -> bf16");
    assert!(is_nan(h[1]), "NaN -> bf16 gave {:#06x}", h[1]);
    let back = down(s, &la.to_f32(&up(s, &h)).unwrap());
    let want: Vec<u32> = h.iter().map(|&b| u32::from(b) << 16).collect();
    assert_eq!(
        back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want,
        "bf16 -> f32"
    );
}

/// One 1F1B step (2 ranks, 4 microbatches, 3 layers) of the device stages in `precision` against
/// the CPU's sequential step: losses, accumulated gradients and updated weights within `tol`.
fn one_step(gpu: &Arc<Gpu>, precision: Precision, tol: f64) {
    let spec = ModelSpec {
        input: 67,
        layers: [
            (129, Activation::Gelu),
            (95, Activation::Silu),
            (9, Activation::Identity),
        ]
        .into_iter()
        .map(|(width, activation)| LayerSpec { width, activation })
        .collect(),
        loss: LossKind::Mse,
        batch: 64,
    };
    let params = Params {
        ranks: 2,
        microbatches: 4,
        chunks: None,
        group_size: None,
    };
    let sched = families::generate("1f1b", &params).unwrap();
    let opt = Optimizer::sgd(0.05);
    let build = || -> Vec<LinearStage> {
        spec.build_stages(&stage_ranges(&[2, 1]), opt, GemmBackend::default(), 11)
            .unwrap()
    };
    let (x, t) = Teacher::new(&spec, 11).batch(0, spec.batch, sched.microbatches);
    let mut cpu = build();
    let want = sequential_step(&mut cpu, x.clone(), &t, &spec.loss).unwrap();
    let dev = build()
        .iter()
        .map(|s| CudaStage::from_host_in(gpu, s, precision).unwrap())
        .collect();
    let mut ex = Executor::new(sched, dev).unwrap();
    let got = ex.step(x, &t, &spec.loss).unwrap();
    ex.optimizer_step().unwrap();
    let what = format!("one step in {precision}");
    let r = rel(&got.losses, &want.losses);
    assert!(
        r <= tol,
        "{what}: losses differ by {r:e}: {:?} vs {:?}",
        got.losses,
        want.losses
    );
    for (s, (a, b)) in ex.stages().iter().zip(&cpu).enumerate() {
        assert_stage_close(s, a, b, tol, &what);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn one_training_step_in_each_precision_matches_the_cpu_layers() {
    let Some(gpu) = gpu_or_skip("one_training_step_in_each_precision_matches_the_cpu_layers")
    else {
        return;
    };
    for (p, tol) in [
        (Precision::Fp32, 1e-4),
        (Precision::Tf32, 1e-2),
        (Precision::Bf16, 5e-2),
    ] {
        one_step(&gpu, p, tol);
    }
}
