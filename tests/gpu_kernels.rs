//! Every kernel of the embedded PTX on a GPU against the host reference (the CPU layers and the
//! kernels crate's host build) on random data, at sizes that are not multiples of the tiles.
//!
//! Tolerances: GEMM outputs `|gpu - host| <= 1e-4 (1 + |host|)` (fp32, a different summation
//! order); elementwise results, losses and optimizer updates `1e-5 (1 + |host|)` (the same scalar
//! functions, up to fused multiply-adds).
//!
//! Without a GPU every test prints `skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail
//! instead)` and passes; with `PIPEFILL_REQUIRE_GPU=1` it fails instead.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use pipefill::cuda::{gpu_or_skip, Gpu, Launcher, LinearDims};
use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::Linear;
use pipefill_kernels::{
    activation_backward, activation_forward, mse_grad, mse_loss, softmax_ce_grad, softmax_ce_loss,
    Activation, AdamW, SgdMomentum,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const GEMM_TOL: f32 = 1e-4;
const ELEM_TOL: f32 = 1e-5;
const ACTS: [Activation; 4] = [
    Activation::Identity,
    Activation::Relu,
    Activation::Gelu,
    Activation::Silu,
];

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
}

fn launcher(gpu: &Arc<Gpu>) -> Launcher {
    Launcher::new(gpu.clone(), gpu.new_stream().expect("a stream"))
}

fn up(la: &Launcher, v: &[f32]) -> CudaSlice<f32> {
    la.stream().clone_htod(v).expect("copy to device")
}

fn down(la: &Launcher, s: &CudaSlice<f32>) -> Vec<f32> {
    let v = la.stream().clone_dtoh(s).expect("copy to host");
    la.stream().synchronize().expect("sync");
    v
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: gpu {g} vs host {w} (tolerance {tol} relative)"
        );
    }
}

/// Odd sizes: no dimension a multiple of the 64 x 64 tile or of the 256-thread block.
const ROWS: usize = 37;
const INPUTS: usize = 70;
const OUTPUTS: usize = 45;

fn layer(act: Activation, seed: u64) -> Linear {
    Linear::new(
        INPUTS,
        OUTPUTS,
        act,
        random(INPUTS * OUTPUTS, seed),
        random(OUTPUTS, seed + 1),
    )
}

fn dims(act: Activation) -> LinearDims {
    LinearDims {
        rows: ROWS,
        inputs: INPUTS,
        outputs: OUTPUTS,
        act,
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn linear_forward_matches_the_cpu_layer() {
    let Some(gpu) = gpu_or_skip("linear_forward_matches_the_cpu_layer") else {
        return;
    };
    let la = launcher(&gpu);
    for (k, act) in ACTS.into_iter().enumerate() {
        let l = layer(act, 10 + k as u64);
        let x = random(ROWS * INPUTS, 20 + k as u64);
        let (y_host, z_host) = l.forward(GemmBackend::default(), &x, ROWS);
        let mut y = la.stream().alloc_zeros::<f32>(ROWS * OUTPUTS).unwrap();
        let mut z = la.stream().alloc_zeros::<f32>(ROWS * OUTPUTS).unwrap();
        let (dx, dw, db) = (up(&la, &x), up(&la, &l.weight), up(&la, &l.bias));
        la.linear_forward(&dx, &dw, &db, &mut y, Some(&mut z), dims(act))
            .unwrap();
        assert_close(&format!("Y ({act:?})"), &down(&la, &y), &y_host, GEMM_TOL);
        if let Some(z_host) = z_host {
            assert_close(&format!("Z ({act:?})"), &down(&la, &z), &z_host, GEMM_TOL);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn linear_backward_input_matches_the_cpu_layer() {
    let Some(gpu) = gpu_or_skip("linear_backward_input_matches_the_cpu_layer") else {
        return;
    };
    let la = launcher(&gpu);
    for (k, act) in ACTS.into_iter().enumerate() {
        let l = layer(act, 30 + k as u64);
        let x = random(ROWS * INPUTS, 40 + k as u64);
        let (_, z_host) = l.forward(GemmBackend::default(), &x, ROWS);
        let dy = random(ROWS * OUTPUTS, 50 + k as u64);
        let mut dz_host = dy.clone();
        let dx_host = l.backward_input(
            GemmBackend::default(),
            &mut dz_host,
            z_host.clone(),
            ROWS,
            true,
        );
        let z = z_host.as_ref().map(|z| up(&la, z));
        let mut dx = la.stream().alloc_zeros::<f32>(ROWS * INPUTS).unwrap();
        let mut dz = la.stream().alloc_zeros::<f32>(ROWS * OUTPUTS).unwrap();
        la.linear_backward_input(
            &up(&la, &dy),
            z.as_ref(),
            &up(&la, &l.weight),
            &mut dx,
            Some(&mut dz),
            dims(act),
        )
        .unwrap();
        assert_close(
            &format!("dX ({act:?})"),
            &down(&la, &dx),
            &dx_host,
            GEMM_TOL,
        );
        let dz_got = down(&la, &dz);
        assert_close(&format!("dZ ({act:?})"), &dz_got, &dz_host, ELEM_TOL);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn linear_backward_weight_accumulates_like_the_cpu_layer() {
    let Some(gpu) = gpu_or_skip("linear_backward_weight_accumulates_like_the_cpu_layer") else {
        return;
    };
    let la = launcher(&gpu);
    let mut l = layer(Activation::Gelu, 60);
    let mut dw = la.stream().alloc_zeros::<f32>(INPUTS * OUTPUTS).unwrap();
    let mut db = la.stream().alloc_zeros::<f32>(OUTPUTS).unwrap();
    // Two microbatches accumulate.
    for mb in 0..2u64 {
        let x = random(ROWS * INPUTS, 70 + mb);
        let dz = random(ROWS * OUTPUTS, 80 + mb);
        l.backward_weight(GemmBackend::default(), &x, &dz, ROWS);
        la.linear_backward_weight(
            &up(&la, &x),
            &up(&la, &dz),
            &mut dw,
            Some(&mut db),
            dims(Activation::Gelu),
        )
        .unwrap();
    }
    assert_close("dW", &down(&la, &dw), l.weight_grad().unwrap(), GEMM_TOL);
    assert_close("db", &down(&la, &db), l.bias_grad().unwrap(), GEMM_TOL);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn activation_kernels_match_the_host_build() {
    let Some(gpu) = gpu_or_skip("activation_kernels_match_the_host_build") else {
        return;
    };
    let la = launcher(&gpu);
    let n = 3 * 256 + 17;
    for (k, act) in ACTS.into_iter().enumerate() {
        let z: Vec<f32> = random(n, 90 + k as u64).iter().map(|v| v * 4.0).collect();
        let dy = random(n, 100 + k as u64);
        let (mut y_host, mut dz_host) = (vec![0.0; n], vec![0.0; n]);
        activation_forward(&z, &mut y_host, act);
        activation_backward(&dy, &z, &mut dz_host, act);
        let (zd, dyd) = (up(&la, &z), up(&la, &dy));
        let mut y = la.stream().alloc_zeros::<f32>(n).unwrap();
        let mut dz = la.stream().alloc_zeros::<f32>(n).unwrap();
        la.activation_forward(&zd, &mut y, act).unwrap();
        la.activation_backward(&dyd, &zd, &mut dz, act).unwrap();
        assert_close(&format!("act ({act:?})"), &down(&la, &y), &y_host, ELEM_TOL);
        assert_close(
            &format!("act' ({act:?})"),
            &down(&la, &dz),
            &dz_host,
            ELEM_TOL,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn mse_kernels_match_the_host_build() {
    let Some(gpu) = gpu_or_skip("mse_kernels_match_the_host_build") else {
        return;
    };
    let la = launcher(&gpu);
    let n = 5000;
    let (p, t) = (random(n, 110), random(n, 111));
    let mut g_host = vec![0.0; n];
    mse_grad(&p, &t, &mut g_host, n as f32);
    let (pd, td) = (up(&la, &p), up(&la, &t));
    let mut partial = la
        .stream()
        .alloc_zeros::<f32>(Launcher::mse_partials(n))
        .unwrap();
    let mut g = la.stream().alloc_zeros::<f32>(n).unwrap();
    la.mse_forward(&pd, &td, &mut partial).unwrap();
    la.mse_grad(&pd, &td, &mut g, 1.0 / n as f32).unwrap();
    let sum: f64 = down(&la, &partial).iter().map(|&v| f64::from(v)).sum();
    let loss = (sum / n as f64) as f32;
    assert_close("MSE", &[loss], &[mse_loss(&p, &t)], ELEM_TOL);
    assert_close("MSE gradient", &down(&la, &g), &g_host, ELEM_TOL);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn softmax_cross_entropy_kernels_match_the_host_build() {
    let Some(gpu) = gpu_or_skip("softmax_cross_entropy_kernels_match_the_host_build") else {
        return;
    };
    let la = launcher(&gpu);
    let (rows, classes) = (300, 13);
    let logits: Vec<f32> = random(rows * classes, 120)
        .iter()
        .map(|v| v * 5.0)
        .collect();
    let mut r = ChaCha8Rng::seed_from_u64(121);
    let labels: Vec<u32> = (0..rows)
        .map(|_| r.random_range(0..classes as u32))
        .collect();
    let mut g_host = vec![0.0; rows * classes];
    softmax_ce_grad(&logits, &labels, &mut g_host, rows as f32);
    let ld = up(&la, &logits);
    let td = la.stream().clone_htod(&labels).unwrap();
    let mut row_loss = la.stream().alloc_zeros::<f32>(rows).unwrap();
    let mut g = la.stream().alloc_zeros::<f32>(rows * classes).unwrap();
    la.softmax_ce_forward(&ld, &td, classes, &mut row_loss)
        .unwrap();
    la.softmax_ce_grad(&ld, &td, &mut g, classes, 1.0 / rows as f32)
        .unwrap();
    let sum: f64 = down(&la, &row_loss).iter().map(|&v| f64::from(v)).sum();
    let loss = (sum / rows as f64) as f32;
    assert_close(
        "CE",
        &[loss],
        &[softmax_ce_loss(&logits, &labels)],
        ELEM_TOL,
    );
    assert_close("CE gradient", &down(&la, &g), &g_host, ELEM_TOL);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn optimizer_kernels_match_the_host_build() {
    let Some(gpu) = gpu_or_skip("optimizer_kernels_match_the_host_build") else {
        return;
    };
    let la = launcher(&gpu);
    let n = 2 * 256 * 1024 + 5; // more than the grid's 1024 blocks cover in one stride
    let (p0, g) = (random(n, 130), random(n, 131));
    // SGD with momentum and weight decay, two steps.
    let sgd = SgdMomentum {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 0.01,
    };
    let (mut p_host, mut v_host) = (p0.clone(), vec![0.0; n]);
    let (mut p, mut v, gd) = (
        up(&la, &p0),
        la.stream().alloc_zeros::<f32>(n).unwrap(),
        up(&la, &g),
    );
    for _ in 0..2 {
        sgd.step(&mut p_host, &g, &mut v_host);
        la.sgd_momentum(&mut p, &gd, &mut v, &sgd).unwrap();
    }
    assert_close("SGD parameters", &down(&la, &p), &p_host, ELEM_TOL);
    assert_close("SGD velocity", &down(&la, &v), &v_host, ELEM_TOL);
    // AdamW, three steps.
    let adam = AdamW::with_lr(0.01);
    let (mut p_host, mut m_host, mut v_host) = (p0.clone(), vec![0.0; n], vec![0.0; n]);
    let mut p = up(&la, &p0);
    let mut m = la.stream().alloc_zeros::<f32>(n).unwrap();
    let mut v = la.stream().alloc_zeros::<f32>(n).unwrap();
    for t in 1..=3 {
        adam.step(t, &mut p_host, &g, &mut m_host, &mut v_host);
        la.adamw(&mut p, &gd, &mut m, &mut v, &adam.at_step(t))
            .unwrap();
    }
    assert_close("AdamW parameters", &down(&la, &p), &p_host, ELEM_TOL);
    assert_close("AdamW first moment", &down(&la, &m), &m_host, ELEM_TOL);
    assert_close("AdamW second moment", &down(&la, &v), &v_host, ELEM_TOL);
}
