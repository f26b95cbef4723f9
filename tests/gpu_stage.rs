//! The device stages ([`CudaStage`]) against the CPU layers: one training step of every schedule
//! family through the threaded executor on the GPU, compared with `sequential_step` on the CPU
//! (losses, accumulated gradients, updated weights; relative norm-wise tolerance 1e-4), 20-step
//! loss curves (relative 1e-3 per step), and the device losses against the host's.
//!
//! Without a GPU every test prints `skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail
//! instead)` and passes; with `PIPEFILL_REQUIRE_GPU=1` it fails instead.

mod gpu_support;

use std::sync::Arc;

use gpu_support::{assert_stage_close, cpu_stages, rel};
use pipefill::cuda::{gpu_or_skip, loss_and_grad, CudaStage, DeviceTarget, DeviceTensor, Gpu};
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::{LayerSpec, ModelSpec, Teacher};
use pipefill_host::runtime::{sequential_step, Executor, Loss, Tensor};
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_kernels::Activation;

const TOL: f64 = 1e-4;

fn spec(stages: usize, loss: LossKind) -> ModelSpec {
    let layers = stages + 1;
    ModelSpec {
        input: 19,
        layers: (0..layers)
            .map(|i| LayerSpec {
                width: if i + 1 == layers { 7 } else { 33 + i },
                activation: [Activation::Gelu, Activation::Silu, Activation::Relu][i % 3],
            })
            .collect(),
        loss,
        batch: 24,
    }
}

fn gpu_stages(gpu: &Arc<Gpu>, cpu: &[LinearStage]) -> Vec<CudaStage> {
    cpu.iter()
        .map(|s| CudaStage::from_host(gpu, s).unwrap())
        .collect()
}

/// One step on the GPU (executor) and on the CPU (sequential); compares everything.
fn check_step(gpu: &Arc<Gpu>, family: &str, sched: Schedule, loss: LossKind, opt: Optimizer) {
    let spec = spec(sched.stages(), loss);
    let what = format!(
        "{family} P={} V={} M={} {loss} {opt}",
        sched.ranks, sched.chunks, sched.microbatches
    );
    let teacher = Teacher::new(&spec, 3);
    let (x, t) = teacher.batch(0, spec.batch, sched.microbatches);
    let mut seq = cpu_stages(&spec, &sched, opt, 3);
    let want = sequential_step(&mut seq, x.clone(), &t, &spec.loss).unwrap();
    let mut ex = Executor::new(
        sched.clone(),
        gpu_stages(gpu, &seq_fresh(&spec, &sched, opt)),
    )
    .unwrap();
    let got = ex.step(x, &t, &spec.loss).unwrap();
    ex.optimizer_step().unwrap();
    assert!(
        rel(&got.losses, &want.losses) <= TOL,
        "losses {:?} vs {:?}: {what}",
        got.losses,
        want.losses
    );
    for (s, (a, b)) in ex.stages().iter().zip(&seq).enumerate() {
        assert_stage_close(s, a, b, TOL, &what);
    }
}

/// The stages as they were before the step (the same seed builds the same weights).
fn seq_fresh(spec: &ModelSpec, s: &Schedule, opt: Optimizer) -> Vec<LinearStage> {
    cpu_stages(spec, s, opt, 3)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn every_family_on_the_gpu_matches_sequential_cpu_training_after_one_step() {
    let Some(gpu) = gpu_or_skip("every_family_on_the_gpu_matches_sequential_cpu_training") else {
        return;
    };
    for family in families::FAMILIES {
        let params = Params {
            ranks: 2,
            microbatches: 4,
            chunks: None,
            group_size: None,
        };
        let sched = families::generate(family.name, &params)
            .unwrap_or_else(|e| panic!("{}: {e}", family.name));
        check_step(
            &gpu,
            family.name,
            sched.clone(),
            LossKind::Mse,
            Optimizer::adamw(0.01),
        );
        check_step(
            &gpu,
            family.name,
            sched,
            LossKind::CrossEntropy,
            Optimizer::sgd(0.05),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn twenty_step_loss_curves_on_the_gpu_follow_the_cpu() {
    let Some(gpu) = gpu_or_skip("twenty_step_loss_curves_on_the_gpu_follow_the_cpu") else {
        return;
    };
    let params = Params {
        ranks: 2,
        microbatches: 4,
        chunks: None,
        group_size: None,
    };
    let sched = families::generate("1f1b", &params).unwrap();
    let spec = spec(sched.stages(), LossKind::Mse);
    let opt = Optimizer::adamw(0.01);
    let teacher = Teacher::new(&spec, 5);
    let mut seq = cpu_stages(&spec, &sched, opt, 5);
    let mut ex = Executor::new(sched.clone(), gpu_stages(&gpu, &seq)).unwrap();
    for step in 0..20 {
        let (x, t) = teacher.batch(step, spec.batch, params.microbatches);
        let a = ex.step(x.clone(), &t, &spec.loss).unwrap().loss;
        ex.optimizer_step().unwrap();
        let b = sequential_step(&mut seq, x, &t, &spec.loss).unwrap().loss;
        assert!(
            (a - b).abs() <= 1e-3 * b.abs().max(1e-3),
            "step {step}: GPU loss {a} vs CPU {b}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn device_losses_match_the_host_losses() {
    let Some(gpu) = gpu_or_skip("device_losses_match_the_host_losses") else {
        return;
    };
    let stream = gpu.new_stream().unwrap();
    let la = pipefill::cuda::Launcher::new(gpu.clone(), stream.clone());
    let (rows, cols) = (29, 11);
    let out: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 37 % 101) as f32 / 25.0) - 2.0)
        .collect();
    let output = Tensor::matrix(rows, cols, out.clone()).unwrap();
    let mse_target =
        Tensor::matrix(rows, cols, out.iter().map(|v| v * 0.5 + 0.1).collect()).unwrap();
    let classes = Tensor::matrix(rows, 1, (0..rows).map(|r| (r % cols) as f32).collect()).unwrap();
    for (kind, target) in [
        (LossKind::Mse, mse_target),
        (LossKind::CrossEntropy, classes),
    ] {
        let (want, want_grad) = kind.loss(&output, &target).unwrap();
        let dev_out = DeviceTensor::from_host(&stream, &output).unwrap();
        let dev_target = DeviceTarget::from_host(&la, kind, &target, cols).unwrap();
        let (got, grad) = loss_and_grad(&la, &dev_out, &dev_target).unwrap();
        assert!(
            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "{kind}: {got} vs {want}"
        );
        let g = grad.to_vec(&stream).unwrap();
        assert!(rel(&g, want_grad.data()) <= 1e-5, "{kind} gradient");
    }
}
