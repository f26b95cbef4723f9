//! The optimizer of the built-in layers: SGD with momentum or AdamW from `pipefill-kernels`, with the
//! per-parameter state each needs.

use std::fmt;

use pipefill_kernels::{AdamW, SgdMomentum};

/// Which update the built-in layers apply once per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Optimizer {
    /// SGD with momentum (PyTorch semantics).
    Sgd(SgdMomentum),
    /// AdamW (PyTorch semantics).
    AdamW(AdamW),
}

impl Optimizer {
    /// AdamW with PyTorch's defaults and learning rate `lr`.
    pub fn adamw(lr: f32) -> Self {
        Optimizer::AdamW(AdamW::with_lr(lr))
    }

    /// SGD with momentum 0.9, no weight decay, learning rate `lr`.
    pub fn sgd(lr: f32) -> Self {
        Optimizer::Sgd(SgdMomentum {
            lr,
            momentum: 0.9,
            weight_decay: 0.0,
        })
    }

    /// The name used on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd(_) => "sgd",
            Optimizer::AdamW(_) => "adamw",
        }
    }
}

impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One parameter buffer's optimizer state (velocity for SGD; first and second moments for AdamW).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParamState {
    first: Vec<f32>,
    second: Vec<f32>,
}

impl ParamState {
    /// The state from saved moments (as [`moments`](ParamState::moments) gives them): each is
    /// empty (no step taken yet, or SGD's unused second moment) or one value per parameter.
    pub fn from_moments(first: Vec<f32>, second: Vec<f32>) -> Self {
        ParamState { first, second }
    }

    /// The first moment (SGD's velocity, AdamW's `m`) and the second (AdamW's `v`); empty before
    /// the first step, and the second always for SGD.
    pub fn moments(&self) -> (&[f32], &[f32]) {
        (&self.first, &self.second)
    }

    /// Applies step `t` (from 1) of `opt` to `params` from `grads`.
    pub fn update(&mut self, opt: &Optimizer, t: u32, params: &mut [f32], grads: &[f32]) {
        if self.first.len() != params.len() {
            self.first = vec![0.0; params.len()];
        }
        match opt {
            Optimizer::Sgd(s) => s.step(params, grads, &mut self.first),
            Optimizer::AdamW(a) => {
                if self.second.len() != params.len() {
                    self.second = vec![0.0; params.len()];
                }
                a.step(t, params, grads, &mut self.first, &mut self.second)
            }
        }
    }
}
