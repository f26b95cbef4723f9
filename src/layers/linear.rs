//! One built-in layer, `Y = act(X W + b)`: its parameters, gradients, and the math of its forward,
//! input-gradient and weight-gradient passes on the CPU.

use pipefill_kernels::{
    activation_backward_in_place, bias_activation, bias_grad_accumulate, Activation,
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
    /// Accumulated `dW` of the current step.
    pub weight_grad: Vec<f32>,
    /// Accumulated `db` of the current step.
    pub bias_grad: Vec<f32>,
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
        if let Some(z) = pre {
            activation_backward_in_place(grad, &z, self.activation);
        }
        if !want_input {
            return Vec::new();
        }
        let mut dx = vec![0.0; rows * self.inputs];
        matmul(
            gemm,
            MatRef::new(grad, rows, self.outputs),
            MatRef::new(&self.weight, self.inputs, self.outputs).t(),
            &mut dx,
            0.0,
        );
        dx
    }

    /// Adds this microbatch's `dW += X^T dZ` and `db += colsum(dZ)`.
    pub fn backward_weight(&mut self, gemm: GemmBackend, x: &[f32], dz: &[f32], rows: usize) {
        matmul(
            gemm,
            MatRef::new(x, rows, self.inputs).t(),
            MatRef::new(dz, rows, self.outputs),
            &mut self.weight_grad,
            1.0,
        );
        bias_grad_accumulate(&mut self.bias_grad, dz);
    }

    /// Zeroes the accumulated gradients.
    pub fn zero_grad(&mut self) {
        self.weight_grad.iter_mut().for_each(|g| *g = 0.0);
        self.bias_grad.iter_mut().for_each(|g| *g = 0.0);
    }

    /// Applies step `t` (from 1) of `opt`.
    pub fn update(&mut self, opt: &Optimizer, t: u32) {
        self.weight_state
            .update(opt, t, &mut self.weight, &self.weight_grad);
        self.bias_state
            .update(opt, t, &mut self.bias, &self.bias_grad);
    }
}
