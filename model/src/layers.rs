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
//!
//! # Selective recomputation
//!
//! Within a stage, a layer's input `X` is the layer before's output `act(Z)`, and that `Z` is in
//! the stash too (unless the activation is the identity): [`Stage::shrink`] drops every such `X`
//! after `F`, and [`Stage::rebuild`] computes it again before `I`/`B`, elementwise, no GEMM. The
//! rebuilt values are the dropped ones bit for bit (the same function on the same `f32`s), so
//! training is unchanged. The stage's first `X` stays (it came from outside). With BF16
//! activations nothing is dropped: `X` was rounded from `act(Z)` before `Z` was, and `act` of
//! the rounded `Z` may differ.
//!
//! # BF16 activations
//!
//! A stage made [`with_activations`](LinearStage::with_activations)`(ActivationDtype::Bf16)`
//! stores every activation as BF16 ([`Stored`]): each tensor that crosses a layer boundary (the
//! stage's input, each layer's output `Y`, each input gradient `dY` / `dX`) is rounded to BF16
//! before the next layer reads it, and `Z` and `dZ` are rounded when stored. The math stays `f32`
//! (products of BF16 values, accumulated in `f32`, as the BF16 tensor-core kernels do); the stash
//! holds 2 bytes a value ([`Stage::held_bytes`] reports them) and the tensors the stage hands on
//! are BF16 [`Tensor`]s (2 bytes a value in [`Tensor::bytes`] and on an MPI wire). Because the
//! rounding happens at every layer boundary, where the model is split into stages changes nothing.

pub mod gemm;
mod linear;
mod loss;
mod optim;
pub mod store;

pub use linear::Linear;
pub use loss::LossKind;
pub use optim::{Optimizer, ParamState};
pub use store::Stored;

use pipefill_host::cost::ActivationDtype;
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
    /// How activations are stored (the stash and the tensors handed on); `f32` unless set by
    /// [`with_activations`](LinearStage::with_activations).
    pub activations: ActivationDtype,
    steps: u32,
}

/// What [`LinearStage`] keeps from `F` to `I` and `W` for one microbatch.
#[derive(Debug)]
pub struct LinearStash {
    rows: usize,
    /// Per layer, its input `X` (`None` while selective recomputation dropped it).
    inputs: Vec<Option<Stored>>,
    /// Per layer, `Z` after `F` (if the activation needs it), dropped at `I`.
    pre: Vec<Option<Stored>>,
    /// Per layer, `dZ`, filled by `I`.
    grads: Vec<Stored>,
}

impl LinearStage {
    /// A stage of `layers` (consecutive widths must match: checked by the model builder).
    pub fn new(layers: Vec<Linear>, optimizer: Optimizer, gemm: GemmBackend, first: bool) -> Self {
        LinearStage {
            layers,
            optimizer,
            gemm,
            first,
            activations: ActivationDtype::F32,
            steps: 0,
        }
    }

    /// The same stage storing its activations as `dtype` (see the module's "BF16 activations").
    pub fn with_activations(mut self, dtype: ActivationDtype) -> Self {
        self.activations = dtype;
        self
    }

    /// A tensor of `rows x cols` handed on by this stage: BF16 when it stores BF16 (`values`
    /// were rounded already, so this is exact).
    fn hand_on(&self, rows: usize, cols: usize, values: Vec<f32>) -> Result<Tensor, StageError> {
        Ok(match self.activations {
            ActivationDtype::F32 => Tensor::matrix(rows, cols, values)?,
            ActivationDtype::Bf16 => Tensor::from_bf16(vec![rows, cols], store::to_bf16(&values))?,
        })
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
        let dtype = self.activations;
        let mut x = input.into_data();
        store::round_in_place(dtype, &mut x);
        for layer in &self.layers {
            let (mut y, z) = layer.forward(self.gemm, &x, rows);
            store::round_in_place(dtype, &mut y);
            let layer_input = std::mem::replace(&mut x, y);
            stash.inputs.push(Some(Stored::new(dtype, layer_input)));
            stash.pre.push(z.map(|z| Stored::new(dtype, z)));
        }
        Ok((self.hand_on(rows, self.outputs(), x)?, stash))
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
        let dtype = self.activations;
        let mut grads = Vec::with_capacity(self.layers.len());
        let mut g = grad_output.into_data();
        for (l, layer) in self.layers.iter().enumerate().rev() {
            store::round_in_place(dtype, &mut g);
            let pre = stash.pre[l].take().map(Stored::into_values);
            layer.grad_pre_activation(&mut g, pre.as_deref());
            store::round_in_place(dtype, &mut g);
            let dx = if l > 0 || !self.first {
                layer.input_grad(self.gemm, &g, rows)
            } else {
                Vec::new()
            };
            grads.push(Stored::new(dtype, std::mem::replace(&mut g, dx)));
        }
        grads.reverse();
        stash.grads = grads;
        if self.first {
            Ok(Tensor::empty())
        } else {
            store::round_in_place(dtype, &mut g);
            self.hand_on(rows, self.inputs(), g)
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
            let x = x
                .as_ref()
                .ok_or_else(|| StageError::new("W on a stash whose inputs were not rebuilt"))?;
            layer.backward_weight(gemm, &x.values(), &dz.values(), stash.rows);
        }
        Ok(())
    }

    fn held_bytes(&self, stash: &LinearStash) -> usize {
        stash
            .inputs
            .iter()
            .flatten()
            .map(Stored::bytes)
            .sum::<usize>()
            + stash.pre.iter().flatten().map(Stored::bytes).sum::<usize>()
            + stash.grads.iter().map(Stored::bytes).sum::<usize>()
    }

    /// Drops every layer input after the first whose layer before keeps its pre-activation (see
    /// the module's "Selective recomputation"); nothing with BF16 activations.
    fn shrink(&mut self, stash: &mut LinearStash) -> Result<bool, StageError> {
        if self.activations != ActivationDtype::F32 {
            return Ok(false);
        }
        let mut dropped = false;
        for l in 1..stash.inputs.len() {
            if stash.pre[l - 1].is_some() {
                dropped |= stash.inputs[l].take().is_some();
            }
        }
        Ok(dropped)
    }

    /// Each dropped input again, `act(Z)` of the layer before.
    fn rebuild(&mut self, stash: &mut LinearStash) -> Result<(), StageError> {
        let dtype = self.activations;
        for l in 1..stash.inputs.len().min(self.layers.len()) {
            if stash.inputs[l].is_some() {
                continue;
            }
            let z = stash.pre[l - 1].as_ref().ok_or_else(|| {
                StageError::new("rebuild: a dropped input's pre-activation is gone (I ran?)")
            })?;
            let y = self.layers[l - 1].output_of(&z.values());
            stash.inputs[l] = Some(Stored::new(dtype, y));
        }
        Ok(())
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
