//! The elementwise parts of a linear layer `Y = act(X W + b)` and of its backward passes: the fused
//! bias + activation epilogue, `dZ = dY * act'(Z)`, and the bias gradient `db += colsum(dZ)`.
//!
//! Matrices are row-major `f32` slices. A layer with `n` outputs sees its activations as rows of length
//! `n`; every function here takes whole rows (any number of them), so the CPU path can call it per row,
//! per block of rows, or for the whole microbatch at once. The per-element formulas are the scalar
//! functions ([`epilogue`], [`Activation::derivative`]) that the GPU kernels call too.

use crate::activation::Activation;

/// One element of the fused epilogue: from the GEMM accumulator `acc` (a dot product of a row of `X`
/// and a column of `W`) and the bias `b`, the pre-activation `z = acc + b` and the output `y = act(z)`.
#[inline]
pub fn epilogue(acc: f32, b: f32, act: Activation) -> (f32, f32) {
    let z = acc + b;
    (z, act.forward(z))
}

/// Fused bias + activation over whole rows, in place: on entry `out` holds `X W` (rows of
/// `bias.len()` elements), on return it holds `Y = act(X W + b)`. When `pre` is given, the
/// pre-activation `Z = X W + b` is stored there too (backward needs it for every activation but
/// `Identity`).
///
/// # Panics
/// If `out.len()` is not a multiple of `bias.len()`, or `pre` has a different length than `out`.
#[inline]
pub fn bias_activation(out: &mut [f32], pre: Option<&mut [f32]>, bias: &[f32], act: Activation) {
    assert_rows(out.len(), bias.len());
    match pre {
        Some(pre) => {
            assert_eq!(
                pre.len(),
                out.len(),
                "pre-activation length must equal output length"
            );
            for (out_row, pre_row) in out
                .chunks_exact_mut(bias.len())
                .zip(pre.chunks_exact_mut(bias.len()))
            {
                for ((y, z), &b) in out_row.iter_mut().zip(pre_row.iter_mut()).zip(bias) {
                    (*z, *y) = epilogue(*y, b, act);
                }
            }
        }
        None => {
            for out_row in out.chunks_exact_mut(bias.len()) {
                for (y, &b) in out_row.iter_mut().zip(bias) {
                    *y = epilogue(*y, b, act).1;
                }
            }
        }
    }
}

/// Elementwise activation forward, out of place: `y[i] = act(z[i])`.
///
/// # Panics
/// If `z` and `y` differ in length.
#[inline]
pub fn activation_forward(z: &[f32], y: &mut [f32], act: Activation) {
    assert_eq!(
        z.len(),
        y.len(),
        "activation input and output lengths differ"
    );
    for (y, &z) in y.iter_mut().zip(z) {
        *y = act.forward(z);
    }
}

/// Elementwise activation backward, out of place: `dz[i] = dy[i] * act'(z[i])`.
///
/// # Panics
/// If the three slices differ in length.
#[inline]
pub fn activation_backward(dy: &[f32], z: &[f32], dz: &mut [f32], act: Activation) {
    assert_eq!(
        dy.len(),
        z.len(),
        "gradient and pre-activation lengths differ"
    );
    assert_eq!(
        dz.len(),
        z.len(),
        "output gradient and pre-activation lengths differ"
    );
    for ((dz, &dy), &z) in dz.iter_mut().zip(dy).zip(z) {
        *dz = dy * act.derivative(z);
    }
}

/// Elementwise activation backward, in place: `grad[i] <- grad[i] * act'(z[i])` turns `dY` into `dZ`.
///
/// # Panics
/// If `grad` and `z` differ in length.
#[inline]
pub fn activation_backward_in_place(grad: &mut [f32], z: &[f32], act: Activation) {
    assert_eq!(
        grad.len(),
        z.len(),
        "gradient and pre-activation lengths differ"
    );
    if act == Activation::Identity {
        return;
    }
    for (g, &z) in grad.iter_mut().zip(z) {
        *g *= act.derivative(z);
    }
}

/// Bias gradient, accumulating: `db[j] += sum over rows r of dz[r][j]` (rows of `db.len()` elements).
/// Accumulating lets the W pass of several microbatches add into one gradient buffer.
///
/// # Panics
/// If `dz.len()` is not a multiple of `db.len()`.
#[inline]
pub fn bias_grad_accumulate(db: &mut [f32], dz: &[f32]) {
    assert_rows(dz.len(), db.len());
    for row in dz.chunks_exact(db.len()) {
        for (acc, &g) in db.iter_mut().zip(row) {
            *acc += g;
        }
    }
}

/// Checks that a buffer of `len` elements is whole rows of `width` elements.
#[inline]
fn assert_rows(len: usize, width: usize) {
    assert!(width > 0, "row width must be positive");
    assert_eq!(
        len % width,
        0,
        "buffer length {len} is not a whole number of rows of {width}"
    );
}
