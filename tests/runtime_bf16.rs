//! BF16 activation storage on the CPU layers (`LinearStage::with_activations`): the stash really
//! holds 2 bytes a value (the runtime's measured peak halves exactly), the tensors between ranks
//! carry 2 bytes a value, rounding really happens, and training stays within a tolerance derived
//! from BF16's unit roundoff `u = 2^-8`.
//!
//! Tolerance of the losses: a forward pass rounds `L + 1` times on its way to the loss (the
//! input and each layer's output), each rounding a relative error of at most `u` per value. To
//! first order the output's relative error is at most `(L + 1) u` times the layers' gain, and the
//! mean squared error's relative change is at most twice the output's (the square) over the
//! ratio `|y| / |y - t|`. The test allows `4 (L + 1) u` relative on the first step's loss (a gain
//! and ratio of 2 together) and, over 20 steps of training, where the rounded gradients steer the
//! weights too, `8 (L + 1) u` relative on the mean loss of the curve.

use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::{stage_ranges, LayerSpec, ModelSpec, Teacher};
use pipefill_host::cost::ActivationDtype;
use pipefill_host::runtime::streams::{CpuStreams, Pending, StreamExecutor};
use pipefill_host::runtime::{Executor, Stage, StepReport, Tensor};
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_kernels::Activation;

const U: f64 = 1.0 / 256.0;

fn spec() -> ModelSpec {
    let acts = [Activation::Gelu, Activation::Relu, Activation::Silu];
    let mut layers: Vec<LayerSpec> = (0..6)
        .map(|i| LayerSpec {
            width: 24,
            activation: acts[i % 3],
        })
        .collect();
    layers.push(LayerSpec {
        width: 4,
        activation: Activation::Identity,
    });
    ModelSpec {
        input: 16,
        layers,
        loss: LossKind::Mse,
        batch: 32,
    }
}

fn schedule(family: &str, ranks: usize, microbatches: usize) -> Schedule {
    let params = Params {
        ranks,
        microbatches,
        chunks: None,
        group_size: None,
    };
    families::generate(family, &params).unwrap()
}

/// The model's stages for `sched` (layers split as evenly as possible), storing `dtype`.
fn stages(spec: &ModelSpec, sched: &Schedule, dtype: ActivationDtype) -> Vec<LinearStage> {
    let n = spec.layers.len();
    let s = sched.stages();
    let counts: Vec<usize> = (0..s).map(|i| n / s + usize::from(i < n % s)).collect();
    spec.build_stages(
        &stage_ranges(&counts),
        Optimizer::adamw(0.01),
        GemmBackend::Matrixmultiply,
        3,
    )
    .unwrap()
    .into_iter()
    .map(|st| st.with_activations(dtype))
    .collect()
}

/// `steps` training steps of `sched`; the reports.
fn train(
    sched: &Schedule,
    dtype: ActivationDtype,
    steps: usize,
) -> (Vec<StepReport>, Executor<LinearStage>) {
    let spec = spec();
    let teacher = Teacher::new(&spec, 9);
    let mut ex = Executor::new(sched.clone(), stages(&spec, sched, dtype)).unwrap();
    let reports = (0..steps)
        .map(|step| {
            let (x, t) = teacher.batch(step as u64, spec.batch, sched.microbatches);
            let r = ex.step(x, &t, &spec.loss).unwrap();
            ex.optimizer_step().unwrap();
            r
        })
        .collect();
    (reports, ex)
}

#[test]
fn one_forward_stashes_two_bytes_a_value() {
    let spec = spec();
    let sched = schedule("1f1b", 1, 1);
    let rows = 5;
    let x = Tensor::matrix(
        rows,
        spec.input,
        (0..rows * spec.input).map(|i| i as f32 * 0.01).collect(),
    )
    .unwrap();
    // Values stashed by F: each layer's input, and its pre-activation unless it is the identity.
    let values: usize = {
        let mut width = spec.input;
        spec.layers
            .iter()
            .map(|l| {
                let v = rows * width
                    + if l.activation == Activation::Identity {
                        0
                    } else {
                        rows * l.width
                    };
                width = l.width;
                v
            })
            .sum()
    };
    for (dtype, size) in [(ActivationDtype::F32, 4), (ActivationDtype::Bf16, 2)] {
        let mut st = stages(&spec, &sched, dtype).remove(0);
        let (y, stash) = st.forward(x.clone()).unwrap();
        assert_eq!(st.held_bytes(&stash), values * size, "{dtype}");
        assert_eq!(
            (y.dtype(), y.bytes()),
            (dtype.into(), y.len() * size),
            "{dtype}"
        );
    }
}

#[test]
fn bf16_halves_the_measured_peak_stash_and_the_transfer_bytes() {
    for family in ["1f1b", "zb-h1"] {
        let sched = schedule(family, 3, 6);
        let (f, _) = train(&sched, ActivationDtype::F32, 1);
        let (b, _) = train(&sched, ActivationDtype::Bf16, 1);
        let (f, b) = (&f[0], &b[0]);
        assert!(f.peak_held_bytes.iter().all(|&p| p > 0), "{family}");
        let doubled: Vec<usize> = b.peak_held_bytes.iter().map(|p| 2 * p).collect();
        assert_eq!(doubled, f.peak_held_bytes, "{family}: peak stash per rank");
        let sent = |r: &StepReport| r.timeline.transfers.iter().map(|t| t.bytes).sum::<f64>();
        assert!(sent(f) > 0.0, "{family}");
        assert_eq!(2.0 * sent(b), sent(f), "{family}: bytes sent between ranks");
        println!(
            "{family} P=3 M=6: peak stash per rank f32 {:?} bf16 {:?}; sent f32 {} bf16 {}",
            f.peak_held_bytes,
            b.peak_held_bytes,
            sent(f),
            sent(b)
        );
    }
}

#[test]
fn bf16_losses_differ_from_f32_within_the_rounding_tolerance() {
    let layers = spec().layers.len() as f64;
    let sched = schedule("1f1b", 2, 4);
    let (f, _) = train(&sched, ActivationDtype::F32, 20);
    let (b, _) = train(&sched, ActivationDtype::Bf16, 20);
    let loss = |r: &[StepReport]| r.iter().map(|s| s.loss as f64).collect::<Vec<_>>();
    let (lf, lb) = (loss(&f), loss(&b));
    let first = (lb[0] - lf[0]).abs() / lf[0];
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let curve = (mean(&lb) - mean(&lf)).abs() / mean(&lf);
    println!("first-step loss relative difference {first:e}, curve mean {curve:e}");
    assert!(
        first > 0.0 && lf != lb,
        "rounding must change something: {lf:?}"
    );
    assert!(first <= 4.0 * (layers + 1.0) * U, "first step: {first:e}");
    assert!(
        curve <= 8.0 * (layers + 1.0) * U,
        "20 steps: {curve:e}\n{lf:?}\n{lb:?}"
    );
    assert!(
        mean(&lb[15..]) < mean(&lb[..5]),
        "bf16 training must learn: {lb:?}"
    );
}

#[test]
fn bf16_results_do_not_depend_on_where_the_model_is_split() {
    // Rounding at every layer boundary means a stage boundary adds none: one stage and three
    // give bit-equal losses; the gradients differ only by the order microbatches are summed in.
    let (one, ex1) = train(&schedule("1f1b", 1, 4), ActivationDtype::Bf16, 1);
    let (three, ex3) = train(&schedule("1f1b", 3, 4), ActivationDtype::Bf16, 1);
    assert_eq!(one[0].losses, three[0].losses);
    let grads = |ex: &Executor<LinearStage>| -> Vec<f32> {
        ex.stages()
            .iter()
            .flat_map(|s| &s.layers)
            .flat_map(|l| l.weight.clone())
            .collect()
    };
    let (a, b) = (grads(&ex1), grads(&ex3));
    let d: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum();
    let n: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    assert!(
        (d / n).sqrt() <= 1e-5,
        "updated weights differ: {:e}",
        (d / n).sqrt()
    );
}

#[test]
fn the_stream_runtime_passes_bf16_tensors_as_the_threads_do() {
    // `CpuStreams` is the CPU twin of the CUDA stream device: the same program, host tensors.
    let spec = spec();
    let sched = schedule("zb-h1", 3, 6);
    let (threads, _) = train(&sched, ActivationDtype::Bf16, 1);
    let device = CpuStreams::new();
    let stages = stages(&spec, &sched, ActivationDtype::Bf16)
        .into_iter()
        .map(|s| device.stage(s))
        .collect();
    let loss = device.loss(spec.loss);
    let mut ex = StreamExecutor::new(sched.clone(), stages, device).unwrap();
    let (x, t) = Teacher::new(&spec, 9).batch(0, spec.batch, sched.microbatches);
    let targets: Vec<_> = t.into_iter().map(Pending::ready).collect();
    let report = ex
        .step(x.into_iter().map(Pending::ready).collect(), &targets, &loss)
        .unwrap();
    assert_eq!(report.losses, threads[0].losses);
    // (On `CpuStreams` the report's stash peaks and transfer bytes read 0: not compared here.)
}
