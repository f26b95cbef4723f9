//! One built-in layer, `Y = act(X W + b)`: its parameters, gradients, and the math of its forward,
//! input-gradient and weight-gradient passes on the CPU.

use pipefill_kernels::{
    activation_backward_in_place, activation_forward, bias_activation, bias_grad_accumulate,
    Activation,
};

use super::gemm::{matmul, GemmBackend, MatRef};
use super::optim::{Optimizer, ParamState};

/// A fully connected layer with bias and a fused activation: `Y = act(X W + b)`, `X` is
/// `rows x inputs`, `W` is `inputs x outputs` (row-major), `b` has `outputs` values.
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
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
    /// Accumulated `dW` of the current step (stale while `fresh`).
    weight_grad: Vec<f32>,
    /// Accumulated `db` of the current step (stale while `fresh`).
    bias_grad: Vec<f32>,
    /// `true` after [`zero_grad`](Linear::zero_grad) until the first
    /// [`backward_weight`](Linear::backward_weight): the gradient buffers count as zero, and
    /// that first call overwrites them instead of adding (PyTorch's `zero_grad(set_to_none=True)`
    /// idea). This saves writing the whole `dW` once per step, which is memory-bound and slows
    /// down when every rank does it at once.
    fresh: bool,
    weight_state: ParamState,
    bias_state: ParamState,
}

impl Linear {
    /// A layer with the given weights (`inputs * outputs` values) and biases (`outputs` values).
    ///
    /// # Panics
    /// If the buffers do not fit the widths (the model builder makes them).
    pub fn new(
        inputs: usize,
        outputs: usize,
        activation: Activation,
        weight: Vec<f32>,
        bias: Vec<f32>,
    ) -> Self {
        assert_eq!(
            weight.len(),
            inputs * outputs,
            "weight does not fit the widths"
        );
        assert_eq!(bias.len(), outputs, "bias does not fit the width");
        Linear {
            inputs,
            outputs,
            activation,
            weight_grad: vec![0.0; weight.len()],
            bias_grad: vec![0.0; outputs],
            fresh: true,
            weight,
            bias,
            weight_state: ParamState::default(),
            bias_state: ParamState::default(),
        }
    }

    /// Number of parameters.
    pub fn parameters(&self) -> usize {
        self.weight.len() + self.bias.len()
    }

    /// Whether backward needs the pre-activation `Z` (not for the identity).
    pub fn keeps_pre_activation(&self) -> bool {
        self.activation != Activation::Identity
    }

    /// Forward for `rows` rows of `x`: returns `Y` and, if backward needs it, `Z = X W + b`.
    pub fn forward(
        &self,
        gemm: GemmBackend,
        x: &[f32],
        rows: usize,
    ) -> (Vec<f32>, Option<Vec<f32>>) {
        let mut y = vec![0.0; rows * self.outputs];
        matmul(
            gemm,
            MatRef::new(x, rows, self.inputs),
            MatRef::new(&self.weight, self.inputs, self.outputs),
            &mut y,
            0.0,
        );
        let mut z = self.keeps_pre_activation().then(|| vec![0.0; y.len()]);
        bias_activation(&mut y, z.as_deref_mut(), &self.bias, self.activation);
        (y, z)
    }

    /// `Y = act(Z)` from the pre-activation `Z` [`forward`](Linear::forward) kept: the same values
    /// it returned (the activation is applied to the same `f32` values by the same function).
    pub fn output_of(&self, pre: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0; pre.len()];
        activation_forward(pre, &mut y, self.activation);
        y
    }

    /// Turns `dY` into `dZ = dY * act'(Z)` in place (consuming `Z`) and, if `want_input`, returns
    /// `dX = dZ W^T`.
    pub fn backward_input(
        &self,
        gemm: GemmBackend,
        grad: &mut [f32],
        pre: Option<Vec<f32>>,
        rows: usize,
        want_input: bool,
    ) -> Vec<f32> {
        self.grad_pre_activation(grad, pre.as_deref());
        if !want_input {
            return Vec::new();
        }
        self.input_grad(gemm, grad, rows)
    }

    /// Turns `dY` into `dZ = dY * act'(Z)` in place (`pre` is `Z`; `None` for the identity).
    pub fn grad_pre_activation(&self, grad: &mut [f32], pre: Option<&[f32]>) {
        if let Some(z) = pre {
            activation_backward_in_place(grad, z, self.activation);
        }
    }

    /// `dX = dZ W^T` for `rows` rows of `dz`.
    pub fn input_grad(&self, gemm: GemmBackend, dz: &[f32], rows: usize) -> Vec<f32> {
        let mut dx = vec![0.0; rows * self.inputs];
        matmul(
            gemm,
            MatRef::new(dz, rows, self.outputs),
            MatRef::new(&self.weight, self.inputs, self.outputs).t(),
            &mut dx,
            0.0,
        );
        dx
    }

    /// Adds this microbatch's `dW += X^T dZ` and `db += colsum(dZ)` (the first call after
    /// [`zero_grad`](Linear::zero_grad) writes `dW = X^T dZ` without reading the old values).
    pub fn backward_weight(&mut self, gemm: GemmBackend, x: &[f32], dz: &[f32], rows: usize) {
        let beta = if self.fresh {
            self.bias_grad.fill(0.0);
            0.0
        } else {
            1.0
        };
        self.fresh = false;
        matmul(
            gemm,
            MatRef::new(x, rows, self.inputs).t(),
            MatRef::new(dz, rows, self.outputs),
            &mut self.weight_grad,
            beta,
        );
        bias_grad_accumulate(&mut self.bias_grad, dz);
    }

    /// Starts a new accumulation: the gradients count as zero from now on. Writes nothing; the
    /// next [`backward_weight`](Linear::backward_weight) overwrites the buffers.
    pub fn zero_grad(&mut self) {
        self.fresh = true;
    }

    /// The accumulated `dW` and `db` for changing in place (a data-parallel reduction); a fresh
    /// (zero) gradient is written out as zeros first.
    pub fn grads_mut(&mut self) -> [&mut [f32]; 2] {
        if self.fresh {
            self.weight_grad.fill(0.0);
            self.bias_grad.fill(0.0);
            self.fresh = false;
        }
        [&mut self.weight_grad[..], &mut self.bias_grad[..]]
    }

    /// The accumulated `dW` (`inputs x outputs`, row-major), or `None` when nothing accumulated
    /// since [`zero_grad`](Linear::zero_grad) (the gradient is zero).
    pub fn weight_grad(&self) -> Option<&[f32]> {
        (!self.fresh).then_some(&self.weight_grad[..])
    }

    /// The accumulated `db`, or `None` when nothing accumulated since
    /// [`zero_grad`](Linear::zero_grad) (the gradient is zero).
    pub fn bias_grad(&self) -> Option<&[f32]> {
        (!self.fresh).then_some(&self.bias_grad[..])
    }

    /// The optimizer state of the weight and of the bias (for a checkpoint).
    pub fn optimizer_state(&self) -> (&ParamState, &ParamState) {
        (&self.weight_state, &self.bias_state)
    }

    /// Replaces the optimizer state of the weight and of the bias (from a checkpoint; the caller
    /// checks that each moment is empty or fits its buffer).
    pub fn set_optimizer_state(&mut self, weight: ParamState, bias: ParamState) {
        self.weight_state = weight;
        self.bias_state = bias;
    }

    /// Applies step `t` (from 1) of `opt`.
    pub fn update(&mut self, opt: &Optimizer, t: u32) {
        if self.fresh {
            // No microbatch reached this layer: the gradient is zero (weight decay and momentum
            // still apply).
            self.weight_grad.fill(0.0);
            self.bias_grad.fill(0.0);
        }
        self.weight_state
            .update(opt, t, &mut self.weight, &self.weight_grad);
        self.bias_state
            .update(opt, t, &mut self.bias, &self.bias_grad);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer() -> Linear {
        let weight = (0..12).map(|i| i as f32 * 0.1 - 0.5).collect();
        Linear::new(4, 3, Activation::Gelu, weight, vec![0.1, -0.2, 0.3])
    }

    /// `dW` and `db` by definition, in f64: `sum_k X_k^T dZ_k` and `sum_k colsum(dZ_k)`.
    fn expected(batches: &[(Vec<f32>, Vec<f32>)], rows: usize) -> (Vec<f64>, Vec<f64>) {
        let (mut dw, mut db) = (vec![0.0f64; 12], vec![0.0f64; 3]);
        for (x, dz) in batches {
            for r in 0..rows {
                for i in 0..4 {
                    for o in 0..3 {
                        dw[i * 3 + o] += x[r * 4 + i] as f64 * dz[r * 3 + o] as f64;
                    }
                }
                for o in 0..3 {
                    db[o] += dz[r * 3 + o] as f64;
                }
            }
        }
        (dw, db)
    }

    fn close(got: &[f32], want: &[f64]) -> bool {
        got.iter()
            .zip(want)
            .all(|(g, w)| (*g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0))
    }

    #[test]
    fn zero_grad_then_backward_weight_forgets_the_previous_step() {
        let mut l = layer();
        let batch = |s: f32| {
            let x: Vec<f32> = (0..8).map(|i| (i as f32 * s).sin()).collect();
            let dz: Vec<f32> = (0..6).map(|i| (i as f32 * s).cos()).collect();
            (x, dz)
        };
        // A step's worth of stale gradient, then a new step with two microbatches.
        let old = batch(0.3);
        l.backward_weight(GemmBackend::default(), &old.0, &old.1, 2);
        l.zero_grad();
        assert_eq!(
            l.weight_grad(),
            None,
            "after zero_grad the gradient is zero"
        );
        let new = [batch(0.7), batch(1.9)];
        for (x, dz) in &new {
            l.backward_weight(GemmBackend::default(), x, dz, 2);
        }
        let (dw, db) = expected(&new, 2);
        assert!(
            close(l.weight_grad().unwrap(), &dw),
            "{:?}",
            l.weight_grad()
        );
        assert!(close(l.bias_grad().unwrap(), &db), "{:?}", l.bias_grad());
    }

    #[test]
    fn an_update_without_any_backward_uses_a_zero_gradient() {
        let (mut a, mut b) = (layer(), layer());
        let stale: Vec<f32> = (0..8).map(|i| i as f32).collect();
        a.backward_weight(GemmBackend::default(), &stale, &[1.0; 6], 2);
        a.zero_grad();
        let opt = Optimizer::sgd(0.1);
        a.update(&opt, 1);
        b.update(&opt, 1);
        assert_eq!(a.weight, b.weight);
        assert_eq!(a.bias, b.bias);
    }
}
