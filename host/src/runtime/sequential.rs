//! Plain sequential training on one thread: the reference the pipelined runs are checked against,
//! and the baseline of the speedup bench.

use std::time::Instant;

use super::{Loss, RuntimeError, Stage, Tensor};
use crate::schedule::{Action, Op};

/// What one sequential step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct SequentialReport {
    /// Mean of the microbatch losses.
    pub loss: f32,
    /// Loss of each microbatch.
    pub losses: Vec<f32>,
    /// Wall-clock seconds of the step (optimizer step included).
    pub seconds: f64,
}

/// One training step the plain way, on the calling thread: for each microbatch in order, forward
/// through every stage, the loss, then full backward (`B`) through every stage in reverse; then one
/// optimizer step per stage. Same contract as [`Executor::step`](super::Executor::step): the
/// loss gradient is scaled by `1 / M`, gradients are zeroed first and accumulate over microbatches.
///
/// No schedule, no threads, no channels: what a pipelined run must reproduce.
pub fn sequential_step<S: Stage, L: Loss>(
    stages: &mut [S],
    inputs: Vec<Tensor>,
    targets: &[Tensor],
    loss: &L,
) -> Result<SequentialReport, RuntimeError> {
    let m = inputs.len();
    if stages.is_empty() {
        return Err(RuntimeError::NoStages);
    }
    if targets.len() != m {
        return Err(RuntimeError::BatchCount {
            microbatches: m,
            inputs: m,
            targets: targets.len(),
        });
    }
    let start = Instant::now();
    stages.iter_mut().for_each(Stage::zero_grad);
    let fail = |op: Op, stage: usize, k: usize, e: super::StageError| RuntimeError::ActionFailed {
        rank: 0,
        action: Action::new(op, stage, k),
        message: e.to_string(),
    };
    let last = stages.len() - 1;
    let mut losses = Vec::with_capacity(m);
    for (k, (mut x, target)) in inputs.into_iter().zip(targets).enumerate() {
        let mut stashes = Vec::with_capacity(stages.len());
        for (s, stage) in stages.iter_mut().enumerate() {
            let (y, stash) = stage.forward(x).map_err(|e| fail(Op::F, s, k, e))?;
            stashes.push(stash);
            x = y;
        }
        let (value, mut grad) = loss.loss(&x, target).map_err(|e| fail(Op::F, last, k, e))?;
        grad.scale(1.0 / m as f32);
        losses.push(value);
        for (s, stage) in stages.iter_mut().enumerate().rev() {
            let stash = stashes.pop().ok_or_else(|| RuntimeError::Internal {
                rank: 0,
                message: "the sequential step lost a stash".into(),
            })?;
            grad = stage
                .backward(stash, grad)
                .map_err(|e| fail(Op::B, s, k, e))?;
        }
    }
    for (s, stage) in stages.iter_mut().enumerate() {
        stage
            .optimizer_step()
            .map_err(|e| RuntimeError::OptimizerFailed {
                rank: 0,
                stage: s,
                message: e.to_string(),
            })?;
    }
    let loss = losses.iter().sum::<f32>() / m.max(1) as f32;
    Ok(SequentialReport {
        loss,
        losses,
        seconds: start.elapsed().as_secs_f64(),
    })
}
