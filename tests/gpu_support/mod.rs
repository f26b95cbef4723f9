//! Shared pieces of the GPU tests (`tests/gpu_*.rs`): the small model they train and the relative
//! error they compare with. (Running the binary, `PIPEFILL_BIN` included, is `tests/common`.)

#![allow(dead_code)]

use pipefill::cuda::CudaStage;
use pipefill::layers::{LinearStage, LossKind};
use pipefill::model::{LayerSpec, ModelSpec};
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
