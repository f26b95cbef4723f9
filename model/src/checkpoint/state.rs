//! What a checkpoint keeps of a stage: each layer's weights and optimizer state, and the stage's
//! optimizer step count. Taken from a [`LinearStage`] and put back into one.

use pipefill_kernels::Activation;

use crate::layers::{LinearStage, ParamState};

/// One layer's saved state.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerState {
    /// Width of the input.
    pub inputs: usize,
    /// Width of the output.
    pub outputs: usize,
    /// The fused activation.
    pub activation: Activation,
    /// `W`, `inputs x outputs`, row-major.
    pub weight: Vec<f32>,
    /// `b`.
    pub bias: Vec<f32>,
    /// The weight's optimizer moments (first, second): each empty or one value per weight.
    pub weight_moments: [Vec<f32>; 2],
    /// The bias's optimizer moments (first, second): each empty or one value per bias.
    pub bias_moments: [Vec<f32>; 2],
}

/// One stage's saved state.
#[derive(Debug, Clone, PartialEq)]
pub struct StageState {
    /// The stage's global index `s`.
    pub stage: usize,
    /// Optimizer steps the stage has taken.
    pub steps: u32,
    /// Its layers, in order.
    pub layers: Vec<LayerState>,
}

/// A moment pair, copied.
fn moments(p: &ParamState) -> [Vec<f32>; 2] {
    let (a, b) = p.moments();
    [a.to_vec(), b.to_vec()]
}

impl StageState {
    /// The state of `stage`, global index `index`.
    pub fn of(index: usize, stage: &LinearStage) -> Self {
        StageState {
            stage: index,
            steps: stage.steps(),
            layers: stage
                .layers
                .iter()
                .map(|l| {
                    let (w, b) = l.optimizer_state();
                    LayerState {
                        inputs: l.inputs,
                        outputs: l.outputs,
                        activation: l.activation,
                        weight: l.weight.clone(),
                        bias: l.bias.clone(),
                        weight_moments: moments(w),
                        bias_moments: moments(b),
                    }
                })
                .collect(),
        }
    }

    /// Why this state cannot go into `stage` (layer count, widths, activations, buffer sizes), or
    /// `None` when it fits.
    pub fn misfit(&self, stage: &LinearStage) -> Option<String> {
        if self.layers.len() != stage.layers.len() {
            return Some(format!(
                "stage {} has {} layers saved, the model's stage has {}",
                self.stage,
                self.layers.len(),
                stage.layers.len()
            ));
        }
        for (i, (s, l)) in self.layers.iter().zip(&stage.layers).enumerate() {
            if (s.inputs, s.outputs, s.activation) != (l.inputs, l.outputs, l.activation) {
                return Some(format!(
                    "stage {} layer {i} is {}x{} {} saved, the model's is {}x{} {}",
                    self.stage,
                    s.inputs,
                    s.outputs,
                    s.activation,
                    l.inputs,
                    l.outputs,
                    l.activation
                ));
            }
            if let Some(why) = s.buffer_misfit() {
                return Some(format!("stage {} layer {i}: {why}", self.stage));
            }
        }
        None
    }

    /// Puts this state into `stage`; refuses (with [`misfit`](StageState::misfit)'s reason) a state
    /// that does not fit, leaving the stage unchanged.
    pub fn restore(self, stage: &mut LinearStage) -> Result<(), String> {
        if let Some(why) = self.misfit(stage) {
            return Err(why);
        }
        stage.set_steps(self.steps);
        for (s, l) in self.layers.into_iter().zip(stage.layers.iter_mut()) {
            let [wm, wv] = s.weight_moments;
            let [bm, bv] = s.bias_moments;
            l.weight = s.weight;
            l.bias = s.bias;
            l.set_optimizer_state(
                ParamState::from_moments(wm, wv),
                ParamState::from_moments(bm, bv),
            );
        }
        Ok(())
    }
}

impl LayerState {
    /// Why the buffers do not fit the widths, or `None`.
    fn buffer_misfit(&self) -> Option<String> {
        let (w, b) = (self.inputs * self.outputs, self.outputs);
        if self.weight.len() != w || self.bias.len() != b {
            return Some(format!(
                "{} weights and {} biases saved for a {}x{} layer",
                self.weight.len(),
                self.bias.len(),
                self.inputs,
                self.outputs
            ));
        }
        let fits = |m: &[Vec<f32>; 2], n: usize| m.iter().all(|v| v.is_empty() || v.len() == n);
        if !fits(&self.weight_moments, w) || !fits(&self.bias_moments, b) {
            return Some("optimizer moments do not fit the layer's buffers".into());
        }
        None
    }
}
