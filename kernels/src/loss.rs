//! Losses and their gradients: mean squared error and softmax cross-entropy.
//!
//! Both come as a forward (the loss value, reduced with an `f64` accumulator so that the reported value
//! does not depend on the batch size's rounding) and a gradient written into a caller's buffer. The
//! gradient takes the normaliser `norm` explicitly: the loss is a mean over `norm` items, which is usually
//! the length of this batch but is the whole minibatch when a pipeline splits it into microbatches
//! (each microbatch's gradient then carries `1/norm` of the minibatch, and their sum is the minibatch
//! gradient).

use crate::math::{exp, ln};

/// Mean squared error `sum (p - t)^2 / len` over all elements (`0` for empty input).
///
/// # Panics
/// If `pred` and `target` differ in length.
#[inline]
pub fn mse_loss(pred: &[f32], target: &[f32]) -> f32 {
    assert_eq!(
        pred.len(),
        target.len(),
        "prediction and target lengths differ"
    );
    if pred.is_empty() {
        return 0.0;
    }
    let sum: f64 = pred
        .iter()
        .zip(target)
        .map(|(&p, &t)| {
            let d = f64::from(p) - f64::from(t);
            d * d
        })
        .sum();
    (sum / pred.len() as f64) as f32
}

/// One element of the MSE gradient: `2 (p - t) / norm`.
#[inline]
pub fn mse_grad_element(p: f32, t: f32, inv_norm: f32) -> f32 {
    2.0 * (p - t) * inv_norm
}

/// Gradient of the MSE taken as a mean over `norm` elements: `grad[i] = 2 (p[i] - t[i]) / norm`.
///
/// # Panics
/// If the slices differ in length.
#[inline]
pub fn mse_grad(pred: &[f32], target: &[f32], grad: &mut [f32], norm: f32) {
    assert_eq!(
        pred.len(),
        target.len(),
        "prediction and target lengths differ"
    );
    assert_eq!(
        grad.len(),
        pred.len(),
        "gradient and prediction lengths differ"
    );
    let inv = 1.0 / norm;
    for ((g, &p), &t) in grad.iter_mut().zip(pred).zip(target) {
        *g = mse_grad_element(p, t, inv);
    }
}

/// The row maximum and `sum exp(z - max)` of one row of logits: the stable pieces of log-sum-exp
/// and softmax (the largest exponent is `0`, so nothing overflows).
#[inline]
pub fn softmax_stats(logits: &[f32]) -> (f32, f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = logits.iter().map(|&z| exp(z - max)).sum();
    (max, sum)
}

/// Cross-entropy of one row of logits against the class `target`:
/// `-log softmax(z)[target] = max + ln(sum exp(z - max)) - z[target]`; NaN when `target` is not a class.
/// Never panics (the GPU kernels call it too).
#[inline]
pub fn softmax_ce_row(logits: &[f32], target: usize) -> f32 {
    let Some(&zt) = logits.get(target) else {
        return f32::NAN;
    };
    let (max, sum) = softmax_stats(logits);
    (max - zt) + ln(sum)
}

/// Gradient of one row's cross-entropy, scaled: `grad[j] = scale (softmax(z)[j] - [j == target])`, over the
/// first `min(logits.len(), grad.len())` elements; all NaN when `target` is not a class. Never panics (the
/// GPU kernels call it too).
#[inline]
pub fn softmax_ce_grad_row(logits: &[f32], target: usize, scale: f32, grad: &mut [f32]) {
    if target >= logits.len() {
        grad.fill(f32::NAN);
        return;
    }
    let (max, sum) = softmax_stats(logits);
    let inv = 1.0 / sum;
    for (j, (g, &z)) in grad.iter_mut().zip(logits).enumerate() {
        let onehot = if j == target { 1.0 } else { 0.0 };
        *g = scale * (exp(z - max) * inv - onehot);
    }
}

/// Mean softmax cross-entropy over a batch: `logits` is `targets.len()` rows of classes, `targets[r]`
/// the class of row `r` (`0` for an empty batch).
///
/// # Panics
/// If `logits.len()` is not `targets.len()` whole rows, or a target is out of range.
#[inline]
pub fn softmax_ce_loss(logits: &[f32], targets: &[u32]) -> f32 {
    if targets.is_empty() {
        return 0.0;
    }
    let classes = classes_of(logits.len(), targets.len());
    assert_targets(targets, classes);
    let sum: f64 = logits
        .chunks_exact(classes)
        .zip(targets)
        .map(|(row, &t)| f64::from(softmax_ce_row(row, t as usize)))
        .sum();
    (sum / targets.len() as f64) as f32
}

/// Gradient of the softmax cross-entropy taken as a mean over `norm` rows:
/// `grad[r][j] = (softmax(z_r)[j] - [j == targets[r]]) / norm`.
///
/// # Panics
/// If the shapes disagree (see [`softmax_ce_loss`]) or a target is out of range.
#[inline]
pub fn softmax_ce_grad(logits: &[f32], targets: &[u32], grad: &mut [f32], norm: f32) {
    assert_eq!(
        grad.len(),
        logits.len(),
        "gradient and logits lengths differ"
    );
    if targets.is_empty() {
        return;
    }
    let classes = classes_of(logits.len(), targets.len());
    assert_targets(targets, classes);
    let scale = 1.0 / norm;
    for ((row, g), &t) in logits
        .chunks_exact(classes)
        .zip(grad.chunks_exact_mut(classes))
        .zip(targets)
    {
        softmax_ce_grad_row(row, t as usize, scale, g);
    }
}

/// Checks that every target is a class.
#[inline]
fn assert_targets(targets: &[u32], classes: usize) {
    if let Some(t) = targets.iter().find(|&&t| t as usize >= classes) {
        panic!("target class {t} out of range for {classes} classes");
    }
}

/// The number of classes when `len` logits hold `rows` rows.
#[inline]
fn classes_of(len: usize, rows: usize) -> usize {
    assert!(
        len % rows == 0 && len > 0,
        "{len} logits are not {rows} non-empty rows"
    );
    len / rows
}
