//! The losses of the built-in model, as a [`Loss`] for the runtime: MSE and softmax cross-entropy
//! from `pipefill-kernels`.

use pipefill_host::runtime::{Loss, StageError, Tensor};
use pipefill_kernels::{mse_grad, mse_loss, softmax_ce_grad, softmax_ce_loss};
use serde::{Deserialize, Serialize};

/// The loss at the end of the built-in model.
///
/// - `Mse`: mean squared error over all output values; the target has the output's shape.
/// - `CrossEntropy`: softmax cross-entropy, mean over rows; the target is `[rows, 1]` holding each
///   row's class index (as `f32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossKind {
    /// Mean squared error.
    #[default]
    Mse,
    /// Softmax cross-entropy (`ce` on the command line and in files).
    #[serde(rename = "ce")]
    CrossEntropy,
}

pipefill_host::named_enum!(LossKind as "loss" {
    Mse => "mse",
    CrossEntropy => "ce",
});

impl Loss for LossKind {
    fn loss(&self, output: &Tensor, target: &Tensor) -> Result<(f32, Tensor), StageError> {
        let mut grad = vec![0.0; output.len()];
        let value = match self {
            LossKind::Mse => {
                if target.len() != output.len() {
                    return Err(StageError::new(format!(
                        "MSE target has {} values for an output of {}",
                        target.len(),
                        output.len()
                    )));
                }
                mse_grad(output.data(), target.data(), &mut grad, output.len() as f32);
                mse_loss(output.data(), target.data())
            }
            LossKind::CrossEntropy => {
                let classes = output.cols();
                if target.len() != output.rows() {
                    return Err(StageError::new(format!(
                        "cross-entropy target has {} classes for {} rows",
                        target.len(),
                        output.rows()
                    )));
                }
                let labels = target
                    .data()
                    .iter()
                    .map(|&c| {
                        let ok = c >= 0.0 && c.fract() == 0.0 && (c as usize) < classes;
                        ok.then_some(c as u32).ok_or_else(|| {
                            StageError::new(format!("class {c} is not in 0..{classes}"))
                        })
                    })
                    .collect::<Result<Vec<u32>, _>>()?;
                softmax_ce_grad(output.data(), &labels, &mut grad, labels.len() as f32);
                softmax_ce_loss(output.data(), &labels)
            }
        };
        Ok((value, Tensor::new(output.shape().to_vec(), grad)?))
    }
}
