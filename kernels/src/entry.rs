//! The names of the GPU entry points (the `.entry` symbols of the PTX), one constant per kernel.
//!
//! Every kernel is launched with blocks of [`THREADS`](crate::grid::THREADS) threads. The tensor-core
//! kernels (`*_TF32`, `*_BF16`) take their grid and dynamic shared memory from [`crate::tc::launch`]. Arguments are passed
//! in the order listed; pointers are device pointers to `f32` (targets: `u32`), sizes and the activation
//! code ([`Activation::code`](crate::Activation::code)) are `u32`, scalars are `f32`. A null pointer is
//! allowed only where marked *optional*. The math of each is documented on its body in [`crate::device`].

/// `Y = act(X W + b)`, optionally storing `Z`.
/// Args: `x, w, b, y, z (optional), rows, inputs, outputs, act`. Grid: `gemm_grid(rows, outputs)`.
pub const LINEAR_FORWARD: &str = "pf_linear_forward";
/// `dZ = dY act'(Z)`, `dX = dZ W^T`, optionally storing `dZ`.
/// Args: `dy, z (optional if act = identity), w, dx, dz (optional), rows, inputs, outputs, act`.
/// Grid: `gemm_grid(rows, inputs)`.
pub const LINEAR_BACKWARD_INPUT: &str = "pf_linear_backward_input";
/// `dW += X^T dZ`, `db += colsum(dZ)`.
/// Args: `x, dz, dw, db (optional), rows, inputs, outputs`. Grid: `gemm_grid(inputs, outputs)`.
pub const LINEAR_BACKWARD_WEIGHT: &str = "pf_linear_backward_weight";
/// `y = act(z)`. Args: `z, y, n, act`. Grid: `elementwise_grid(n)`.
pub const ACTIVATION_FORWARD: &str = "pf_activation_forward";
/// `dz = dy act'(z)`. Args: `dy, z, dz, n, act`. Grid: `elementwise_grid(n)`.
pub const ACTIVATION_BACKWARD: &str = "pf_activation_backward";
/// MSE partial sums per block. Args: `pred, target, n, partial` (one float per block).
/// Grid: `elementwise_grid(n)`; loss = `sum(partial) / n`.
pub const MSE_FORWARD: &str = "pf_mse_forward";
/// `grad = 2 (pred - target) inv_norm`. Args: `pred, target, grad, n, inv_norm`. Grid: `elementwise_grid(n)`.
pub const MSE_GRAD: &str = "pf_mse_grad";
/// Per-row cross-entropy. Args: `logits, targets, rows, classes, row_loss`. Grid: `elementwise_grid(rows)`.
pub const SOFTMAX_CE_FORWARD: &str = "pf_softmax_ce_forward";
/// Cross-entropy gradient. Args: `logits, targets, grad, rows, classes, scale`. Grid: `elementwise_grid(rows)`.
pub const SOFTMAX_CE_GRAD: &str = "pf_softmax_ce_grad";
/// SGD with momentum. Args: `p, grad, v, n, lr, momentum, weight_decay`. Grid: `elementwise_grid(n)`.
pub const SGD_MOMENTUM: &str = "pf_sgd_momentum";
/// One AdamW step. Args: `p, grad, m, v, n, lr, beta1, beta2, eps, decay, inv_bias1, inv_bias2` (the fields
/// of [`AdamWStep`](crate::AdamWStep) in order). Grid: `elementwise_grid(n)`.
pub const ADAMW: &str = "pf_adamw";

/// Tensor-core forward in TF32 (`f32` buffers): the arguments of [`LINEAR_FORWARD`].
/// Launch: [`crate::tc::launch`]`(Product::Forward, Precision::Tf32, rows, inputs, outputs)`.
pub const LINEAR_FORWARD_TF32: &str = "pf_linear_forward_tf32";
/// Tensor-core input gradient in TF32: the arguments of [`LINEAR_BACKWARD_INPUT`].
/// Launch: [`crate::tc::launch`]`(Product::BackwardInput, Precision::Tf32, ..)`.
pub const LINEAR_BACKWARD_INPUT_TF32: &str = "pf_linear_backward_input_tf32";
/// Tensor-core weight gradient in TF32: the arguments of [`LINEAR_BACKWARD_WEIGHT`].
/// Launch: [`crate::tc::launch`]`(Product::BackwardWeight, Precision::Tf32, ..)`.
pub const LINEAR_BACKWARD_WEIGHT_TF32: &str = "pf_linear_backward_weight_tf32";
/// Tensor-core forward in BF16: the arguments of [`LINEAR_FORWARD`], but `x, w, y, z` are BF16 (`u16`
/// bits) and `b` stays `f32`. Launch: [`crate::tc::launch`]`(Product::Forward, Precision::Bf16, ..)`.
pub const LINEAR_FORWARD_BF16: &str = "pf_linear_forward_bf16";
/// Tensor-core input gradient in BF16: the arguments of [`LINEAR_BACKWARD_INPUT`], all five matrices BF16.
/// Launch: [`crate::tc::launch`]`(Product::BackwardInput, Precision::Bf16, ..)`.
pub const LINEAR_BACKWARD_INPUT_BF16: &str = "pf_linear_backward_input_bf16";
/// Tensor-core weight gradient in BF16: the arguments of [`LINEAR_BACKWARD_WEIGHT`], `x` and `dz` BF16,
/// `dw` and `db` `f32`. Launch: [`crate::tc::launch`]`(Product::BackwardWeight, Precision::Bf16, ..)`.
pub const LINEAR_BACKWARD_WEIGHT_BF16: &str = "pf_linear_backward_weight_bf16";

/// `f32` to BF16 (round to nearest even): `y[i] = bf16(x[i])`, `y` holding BF16 bits (`u16`).
/// Args: `x, y, n`. Grid: `elementwise_grid(n)`.
pub const F32_TO_BF16: &str = "pf_f32_to_bf16";
/// BF16 to `f32` (exact): `y[i] = f32(x[i])`, `x` holding BF16 bits (`u16`).
/// Args: `x, y, n`. Grid: `elementwise_grid(n)`.
pub const BF16_TO_F32: &str = "pf_bf16_to_f32";

/// The tensor-core entry points (dynamic shared memory above 48 KiB: see [`crate::tc`]).
pub const TENSOR_CORE: [&str; 6] = [
    LINEAR_FORWARD_TF32,
    LINEAR_BACKWARD_INPUT_TF32,
    LINEAR_BACKWARD_WEIGHT_TF32,
    LINEAR_FORWARD_BF16,
    LINEAR_BACKWARD_INPUT_BF16,
    LINEAR_BACKWARD_WEIGHT_BF16,
];

/// Every entry point, for checks that the PTX has them all.
pub const ALL: [&str; 19] = [
    LINEAR_FORWARD,
    LINEAR_BACKWARD_INPUT,
    LINEAR_BACKWARD_WEIGHT,
    ACTIVATION_FORWARD,
    ACTIVATION_BACKWARD,
    MSE_FORWARD,
    MSE_GRAD,
    SOFTMAX_CE_FORWARD,
    SOFTMAX_CE_GRAD,
    SGD_MOMENTUM,
    ADAMW,
    LINEAR_FORWARD_TF32,
    LINEAR_BACKWARD_INPUT_TF32,
    LINEAR_BACKWARD_WEIGHT_TF32,
    LINEAR_FORWARD_BF16,
    LINEAR_BACKWARD_INPUT_BF16,
    LINEAR_BACKWARD_WEIGHT_BF16,
    F32_TO_BF16,
    BF16_TO_F32,
];
