//! The brief profile `pipefill train` starts with: every layer of the built-in model timed alone
//! for `F`, `I` and `W` on one microbatch, through the same [`Stage`] calls the runtime makes.

use std::time::Instant;

use pipefill_host::cost::LayerCost;
use pipefill_host::runtime::{Stage, Tensor};

use crate::layers::gemm::GemmBackend;
use crate::layers::{LinearStage, Optimizer};
use crate::model::ModelSpec;

/// Times each layer's `F`, `I`, `W` on `rows` rows: the median of `reps` runs after one warm-up.
/// Byte sizes are what the layer holds from `F` to `W` (`X`, and `Z` which `I` turns into `dZ` of
/// the same size, so nothing is released at `I`), its parameters, and its output per microbatch.
pub fn profile_layers(
    spec: &ModelSpec,
    rows: usize,
    reps: usize,
    gemm: GemmBackend,
    seed: u64,
) -> Result<Vec<LayerCost>, String> {
    spec.init_layers(seed)
        .into_iter()
        .enumerate()
        .map(|(l, layer)| {
            let (inputs, outputs) = (layer.inputs, layer.outputs);
            let params = layer.parameters();
            // A middle layer (not first): its input gradient is computed, as in a real stage.
            let mut stage = LinearStage::new(vec![layer], Optimizer::sgd(0.0), gemm, false);
            let (mut f, mut i, mut w) = (Vec::new(), Vec::new(), Vec::new());
            for rep in 0..=reps {
                let x = Tensor::matrix(rows, inputs, vec![0.5; rows * inputs])
                    .map_err(|e| e.to_string())?;
                let dy = Tensor::matrix(rows, outputs, vec![0.01; rows * outputs])
                    .map_err(|e| e.to_string())?;
                let t0 = Instant::now();
                let (_, mut stash) = stage.forward(x).map_err(|e| e.to_string())?;
                let t1 = Instant::now();
                stage
                    .backward_input(&mut stash, dy)
                    .map_err(|e| e.to_string())?;
                let t2 = Instant::now();
                stage.backward_weight(stash).map_err(|e| e.to_string())?;
                let t3 = Instant::now();
                if rep > 0 {
                    f.push((t1 - t0).as_secs_f64());
                    i.push((t2 - t1).as_secs_f64());
                    w.push((t3 - t2).as_secs_f64());
                }
            }
            let mut cost = LayerCost::new(format!("linear{l}"), median(f), median(i), median(w));
            let value = std::mem::size_of::<f32>() as f64;
            cost.activation_bytes = (rows * (inputs + outputs)) as f64 * value;
            cost.parameter_bytes = params as f64 * value;
            cost.output_bytes = (rows * outputs) as f64 * value;
            Ok(cost)
        })
        .collect()
}

/// The median of some durations (0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
