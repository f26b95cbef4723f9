//! The built-in model's flags, shared by `pipefill train` and `pipefill profile` (flattened into
//! both), and their check at the edge.

use std::path::PathBuf;

use pipefill_kernels::Activation;

use super::CliError;
use crate::layers::LossKind;
use crate::model::ModelSpec;

/// Flags that describe the built-in model: a model file, or a uniform stack from widths.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// Model file (TOML or JSON, per-layer widths); replaces --layers/--hidden/--outputs/--activation/--loss.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Layers of the built-in model (the last one is the output layer).
    #[arg(long, default_value_t = 8)]
    pub layers: usize,
    /// Width of the input and of the hidden layers.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// Width of the output layer (classes for --loss ce).
    #[arg(long, default_value_t = 16)]
    pub outputs: usize,
    /// Rows per step (split into the microbatches).
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Activation of the hidden layers: identity, relu, gelu, silu.
    #[arg(long, default_value = "gelu")]
    pub activation: String,
    /// Loss: mse or ce (softmax cross-entropy).
    #[arg(long, default_value = "mse")]
    pub loss: String,
}

impl ModelArgs {
    /// The model the flags describe, checked: each bad flag or file is a [`CliError::Usage`] naming it.
    pub fn spec(&self) -> Result<ModelSpec, CliError> {
        let usage = CliError::Usage;
        match &self.model {
            Some(path) => ModelSpec::from_file(path, self.batch),
            None => {
                let activation: Activation = self
                    .activation
                    .parse()
                    .map_err(|e| usage(format!("--activation: {e}")))?;
                let loss: LossKind = self
                    .loss
                    .parse()
                    .map_err(|e| usage(format!("--loss: {e}")))?;
                ModelSpec::uniform(
                    self.layers,
                    self.hidden,
                    self.outputs,
                    activation,
                    loss,
                    self.batch,
                )
            }
        }
        .map_err(|e| usage(e.0))
    }
}
