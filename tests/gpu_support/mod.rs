//! Shared pieces of the GPU tests (`tests/gpu_*.rs`): the small model they train, its host stages,
//! the stream executor on one GPU and the batch upload, and the relative error they compare with. (Running the binary, `PIPEFILL_BIN` included, is `tests/common`.)

#![allow(dead_code)]

pub mod nccl;

use std::sync::Arc;

use pipefill::cuda::{CudaStage, CudaStreams, DeviceTensor, Gpu, OnCudaStreams};
use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::{stage_ranges, LayerSpec, ModelSpec};
use pipefill_host::runtime::streams::StreamExecutor;
use pipefill_host::runtime::Tensor;
use pipefill_host::schedule::Schedule;
use pipefill_kernels::Activation;

/// `‖a - b‖ / ‖b‖` in `f64` (the denominator floored at 1e-30).
pub fn rel(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    d.sqrt() / n.sqrt().max(1e-30)
}

/// A model of `stages + 1` layers (input 21, widths 30, 33, ..., output 5; SiLU, GELU, identity in
/// turn) with `loss`, batch 24: odd sizes, so the kernels' edge handling is exercised.
pub fn spec(stages: usize, loss: LossKind) -> ModelSpec {
    let layers = stages + 1;
    ModelSpec {
        input: 21,
        layers: (0..layers)
            .map(|i| LayerSpec {
                width: if i + 1 == layers { 5 } else { 30 + 3 * i },
                activation: [Activation::Silu, Activation::Gelu, Activation::Identity][i % 3],
            })
            .collect(),
        loss,
        batch: 24,
    }
}

/// Asserts that every layer of the device stage `dev` (stage number `s`) has the weights, bias and
/// gradients of the host stage `host` within relative `tol` (each of `dW`, `db`, `W`, `b`); `what`
/// names the run in the message.
pub fn assert_stage_close(s: usize, dev: &CudaStage, host: &LinearStage, tol: f64, what: &str) {
    for (l, (la, lb)) in dev.layers.iter().zip(&host.layers).enumerate() {
        let (dw, db) = la
            .grads_to_host(dev.launcher())
            .unwrap()
            .unwrap_or_else(|| panic!("stage {s} layer {l}: no gradient on the GPU: {what}"));
        let (w, bias) = la.parameters_to_host(dev.launcher()).unwrap();
        for (name, r) in [
            ("dW", rel(&dw, lb.weight_grad().unwrap())),
            ("db", rel(&db, lb.bias_grad().unwrap())),
            ("W", rel(&w, &lb.weight)),
            ("b", rel(&bias, &lb.bias)),
        ] {
            assert!(
                r <= tol,
                "stage {s} layer {l} {name}: relative difference {r:e}: {what}"
            );
        }
    }
}

/// The host stages of `spec` over the stages of `s`: the layers split as evenly as possible (the
/// first `layers % stages` stages one layer more), built with `opt` from `seed`.
pub fn cpu_stages(spec: &ModelSpec, s: &Schedule, opt: Optimizer, seed: u64) -> Vec<LinearStage> {
    let n = spec.layers.len();
    let k = s.stages();
    let counts: Vec<usize> = (0..k).map(|i| n / k + usize::from(i < n % k)).collect();
    spec.build_stages(&stage_ranges(&counts), opt, GemmBackend::default(), seed)
        .unwrap()
}

/// The stream executor on [`CudaStreams`].
pub type StreamsEx = StreamExecutor<CudaStreams, OnCudaStreams>;

/// The stream executor of `sched` on one GPU with the device copies of the host stages `cpu`,
/// and its device.
pub fn streams_executor(
    gpu: &Arc<Gpu>,
    sched: &Schedule,
    cpu: &[LinearStage],
) -> (StreamsEx, CudaStreams) {
    let device = CudaStreams::new(gpu.clone());
    let stages = cpu
        .iter()
        .map(|s| device.stage(CudaStage::from_host(gpu, s).unwrap()))
        .collect();
    gpu.synchronize().unwrap();
    let ex = StreamExecutor::new(sched.clone(), stages, device.clone()).unwrap();
    (ex, device)
}

/// The inputs `x` and targets `t` on the GPU (cross-entropy targets as class labels).
pub fn upload_batch(
    gpu: &Arc<Gpu>,
    kind: LossKind,
    x: &[Tensor],
    t: &[Tensor],
) -> (Vec<DeviceTensor>, Vec<DeviceTensor>) {
    let s = gpu.new_stream().unwrap();
    let inputs = x
        .iter()
        .map(|x| DeviceTensor::from_host(&s, x).unwrap())
        .collect();
    let targets = t
        .iter()
        .map(|t| match kind {
            LossKind::Mse => DeviceTensor::from_host(&s, t).unwrap(),
            LossKind::CrossEntropy => {
                let c: Vec<u32> = t.data().iter().map(|&v| v as u32).collect();
                DeviceTensor::labels(&s, &c).unwrap()
            }
        })
        .collect();
    s.synchronize().unwrap();
    (inputs, targets)
}

/// `xs` copied to `gpu` on a new stream (waited for).
pub fn upload(gpu: &Arc<Gpu>, xs: &[Tensor]) -> Vec<DeviceTensor> {
    let s = gpu.new_stream().expect("a stream");
    let v = xs
        .iter()
        .map(|x| DeviceTensor::from_host(&s, x).expect("copy in"))
        .collect();
    s.synchronize().expect("synchronize");
    v
}
