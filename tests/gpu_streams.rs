//! `train --backend cuda`'s runtime: the stream program ([`StreamExecutor`]) on [`CudaStreams`]
//! (one host thread, per-rank streams, events between them) against sequential CPU training: every
//! family at P = 2 and 3 with each family's V, one step, losses, gradients and updated weights within
//! a relative (norm-wise) 1e-4; and a 20-step loss curve within 1e-3 per step.
//!
//! Without a GPU every test prints `skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail
//! instead)` and passes; with `PIPEFILL_REQUIRE_GPU=1` it fails instead.

mod gpu_support;

use std::sync::Arc;

use gpu_support::{assert_stage_close, cpu_stages, rel, spec, streams_executor, upload_batch};
use pipefill::cuda::{gpu_or_skip, Gpu};
use pipefill::layers::{LossKind, Optimizer};
use pipefill::model::Teacher;
use pipefill_host::runtime::sequential_step;
use pipefill_host::schedule::{families, Params, Schedule};

const TOL: f64 = 1e-4;

fn check_step(gpu: &Arc<Gpu>, family: &str, sched: Schedule, loss: LossKind, opt: Optimizer) {
    let spec = spec(sched.stages(), loss);
    let what = format!(
        "{family} P={} V={} M={} {loss} {opt}",
        sched.ranks, sched.chunks, sched.microbatches
    );
    let teacher = Teacher::new(&spec, 9);
    let (x, t) = teacher.batch(0, spec.batch, sched.microbatches);
    let mut seq = cpu_stages(&spec, &sched, opt, 9);
    let (mut ex, device) = streams_executor(gpu, &sched, &seq);
    let want = sequential_step(&mut seq, x.clone(), &t, &spec.loss).unwrap();
    let (inputs, targets) = upload_batch(gpu, loss, &x, &t);
    let got = ex.step(inputs, &targets, &device.loss(loss)).unwrap();
    ex.optimizer_step().unwrap();
    assert!(
        rel(&got.losses, &want.losses) <= TOL,
        "losses {:?} vs {:?}: {what}",
        got.losses,
        want.losses
    );
    for (s, (a, b)) in ex.stages().iter().zip(&seq).enumerate() {
        let a = a.inner();
        assert_stage_close(s, a, b, TOL, &what);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn every_family_through_cuda_streams_matches_sequential_cpu_training() {
    let Some(gpu) =
        gpu_or_skip("every_family_through_cuda_streams_matches_sequential_cpu_training")
    else {
        return;
    };
    for family in families::FAMILIES {
        for ranks in [2, 3] {
            let params = Params {
                ranks,
                microbatches: 2 * ranks,
                chunks: None,
                group_size: None,
            };
            let Ok(sched) = families::generate(family.name, &params) else {
                continue;
            };
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
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn twenty_steps_through_cuda_streams_follow_the_cpu() {
    let Some(gpu) = gpu_or_skip("twenty_steps_through_cuda_streams_follow_the_cpu") else {
        return;
    };
    let params = Params {
        ranks: 2,
        microbatches: 4,
        chunks: None,
        group_size: None,
    };
    let sched = families::generate("zbv", &params).unwrap();
    let spec = spec(sched.stages(), LossKind::Mse);
    let opt = Optimizer::adamw(0.01);
    let teacher = Teacher::new(&spec, 4);
    let mut seq = cpu_stages(&spec, &sched, opt, 4);
    let (mut ex, device) = streams_executor(&gpu, &sched, &seq);
    let loss = device.loss(LossKind::Mse);
    for step in 0..20 {
        let (x, t) = teacher.batch(step, spec.batch, params.microbatches);
        let (inputs, targets) = upload_batch(&gpu, LossKind::Mse, &x, &t);
        let a = ex.step(inputs, &targets, &loss).unwrap().loss;
        ex.optimizer_step().unwrap();
        let b = sequential_step(&mut seq, x, &t, &spec.loss).unwrap().loss;
        assert!(
            (a - b).abs() <= 1e-3 * b.abs().max(1e-3),
            "step {step}: GPU loss {a} vs CPU {b}"
        );
    }
}
