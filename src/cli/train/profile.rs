//! The brief profile `pipefill train` starts with: each layer of the built-in model, as a one-layer
//! [`LinearStage`], through `pipefill_host::profile` (the same `Stage` calls the runtime makes).

use pipefill_host::cost::LayerCost;
use pipefill_host::profile::{profile_layers as profile_stages, ProfileOptions, ProfiledLayer};
use pipefill_host::runtime::Tensor;

use crate::layers::gemm::GemmBackend;
use crate::layers::{LinearStage, Optimizer};
use crate::model::ModelSpec;

/// Times each layer's `F`, `I`, `W` on one microbatch of `rows` rows: the median of `repeats`
/// runs after one warm-up. The layers compute their input gradients (as middle stages do).
pub fn profile_layers(
    spec: &ModelSpec,
    rows: usize,
    repeats: usize,
    gemm: GemmBackend,
    seed: u64,
) -> Result<Vec<LayerCost>, String> {
    let mut stages: Vec<LinearStage> = spec
        .init_layers(seed)
        .into_iter()
        .map(|l| LinearStage::new(vec![l], Optimizer::sgd(0.0), gemm, false))
        .collect();
    let layers = stages
        .iter_mut()
        .enumerate()
        .map(|(l, stage)| {
            let parameter_bytes =
                (stage.layers[0].parameters() * std::mem::size_of::<f32>()) as f64;
            ProfiledLayer {
                name: format!("linear{l}"),
                stage,
                parameter_bytes,
            }
        })
        .collect();
    let input = Tensor::matrix(rows, spec.input, vec![0.5; rows * spec.input])
        .map_err(|e| e.to_string())?;
    let options = ProfileOptions { warmup: 1, repeats };
    profile_stages(layers, input, options).map_err(|e| e.to_string())
}
