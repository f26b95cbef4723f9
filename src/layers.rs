//! Built-in layers: Linear + bias + fused activation on the CPU, grouped into a pipeline stage.
//!
//! [`LinearStage`] is the built-in model's implementation of [`Stage`]: a contiguous run of
//! [`Linear`] layers. Matrix products go through a GEMM crate ([`gemm`]), single-threaded (one
//! rank is one thread); the fused bias + activation epilogue, `dZ = dY * act'(Z)`, the bias
//! gradient, the losses ([`LossKind`]) and the optimizers ([`Optimizer`]) are `pipefill-kernels`'
//! host build, so the CPU path computes the same formulas as the GPU kernels.
//!
//! What a stage keeps from `F` for backward, per layer: its input `X` (for `dW = X^T dZ`) and its
//! pre-activation `Z` (for `act'(Z)`, not kept for the identity). `I` turns `Z` into `dZ` and keeps
//! it; `W` consumes `X` and `dZ`.

pub mod gemm;
mod linear;
mod loss;
mod optim;

pub use linear::Linear;
pub use loss::LossKind;
pub use optim::{Optimizer, ParamState};

use pipefill_host::runtime::{Stage, StageError, Tensor};

use self::gemm::GemmBackend;

/// A pipeline stage of the built-in model: a contiguous run of [`Linear`] layers with one
/// optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearStage {
    /// The layers, in order.
    pub layers: Vec<Linear>,
    /// The update applied by [`Stage::optimizer_step`].
    pub optimizer: Optimizer,
    /// Which GEMM crate multiplies.
    pub gemm: GemmBackend,
    /// `true` for the model's first stage: its input gradient is not computed (nobody needs it).
    pub first: bool,
    steps: u32,
}

/// What [`LinearStage`] keeps from `F` to `I` and `W` for one microbatch.
#[derive(Debug)]
pub struct LinearStash {
    rows: usize,
    /// Per layer, its input `X`.
    inputs: Vec<Vec<f32>>,
    /// Per layer, `Z` after `F` (if the activation needs it), dropped at `I`.
    pre: Vec<Option<Vec<f32>>>,
    /// Per layer, `dZ`, filled by `I`.
    grads: Vec<Vec<f32>>,
}

impl LinearStage {
    /// A stage of `layers` (consecutive widths must match: checked by the model builder).
    pub fn new(layers: Vec<Linear>, optimizer: Optimizer, gemm: GemmBackend, first: bool) -> Self {
        LinearStage {
            layers,
            optimizer,
            gemm,
            first,
            steps: 0,
        }
    }

    /// Width of the stage's input.
    pub fn inputs(&self) -> usize {
        self.layers.first().map_or(0, |l| l.inputs)
    }

    /// Width of the stage's output.
    pub fn outputs(&self) -> usize {
        self.layers.last().map_or(0, |l| l.outputs)
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// Sets the optimizer steps taken (AdamW's bias correction counts from it): for a stage
    /// restored from a checkpoint.
    pub fn set_steps(&mut self, steps: u32) {
        self.steps = steps;
    }
}

impl Stage for LinearStage {
    type Stash = LinearStash;

    fn forward(&mut self, input: Tensor) -> Result<(Tensor, LinearStash), StageError> {
        if input.cols() != self.inputs() {
            return Err(StageError::new(format!(
                "stage input has {} columns, its first layer takes {}",
                input.cols(),
                self.inputs()
            )));
        }
        let rows = input.rows();
        let n = self.layers.len();
        let mut stash = LinearStash {
            rows,
            inputs: Vec::with_capacity(n),
            pre: Vec::with_capacity(n),
            grads: Vec::new(),
        };
        let mut x = input.into_data();
        for layer in &self.layers {
            let (y, z) = layer.forward(self.gemm, &x, rows);
            stash.inputs.push(std::mem::replace(&mut x, y));
            stash.pre.push(z);
        }
        Ok((Tensor::matrix(rows, self.outputs(), x)?, stash))
    }

    fn backward_input(
        &mut self,
        stash: &mut LinearStash,
        grad_output: Tensor,
    ) -> Result<Tensor, StageError> {
        let rows = stash.rows;
        if grad_output.len() != rows * self.outputs() || !stash.grads.is_empty() {
            return Err(StageError::new(format!(
                "output gradient has {} values for {rows} rows of {} (or I ran twice)",
                grad_output.len(),
                self.outputs()
            )));
        }
        let mut grads = vec![Vec::new(); self.layers.len()];
        let mut g = grad_output.into_data();
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let want_input = l > 0 || !self.first;
            let dx = layer.backward_input(self.gemm, &mut g, stash.pre[l].take(), rows, want_input);
            grads[l] = std::mem::replace(&mut g, dx);
        }
        stash.grads = grads;
        if self.first {
            Ok(Tensor::empty())
        } else {
            Ok(Tensor::matrix(rows, self.inputs(), g)?)
        }
    }

    fn backward_weight(&mut self, stash: LinearStash) -> Result<(), StageError> {
        if stash.grads.len() != self.layers.len() {
            return Err(StageError::new(
                "W before I: no output gradients in the stash",
            ));
        }
        let gemm = self.gemm;
        for ((layer, x), dz) in self.layers.iter_mut().zip(&stash.inputs).zip(&stash.grads) {
            layer.backward_weight(gemm, x, dz, stash.rows);
        }
        Ok(())
    }

    fn held_bytes(&self, stash: &LinearStash) -> usize {
        let values: usize = stash.inputs.iter().map(Vec::len).sum::<usize>()
            + stash.pre.iter().flatten().map(Vec::len).sum::<usize>()
            + stash.grads.iter().map(Vec::len).sum::<usize>();
        values * std::mem::size_of::<f32>()
    }

    fn zero_grad(&mut self) {
        self.layers.iter_mut().for_each(Linear::zero_grad);
    }

    fn gradients(&mut self) -> Vec<&mut [f32]> {
        self.layers.iter_mut().flat_map(Linear::grads_mut).collect()
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        self.steps += 1;
        let t = self.steps;
        let opt = self.optimizer;
        self.layers.iter_mut().for_each(|l| l.update(&opt, t));
        Ok(())
    }
}
