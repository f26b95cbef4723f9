//! The ends of a step, the same for every runner: zero-grad before the first action, and after the
//! last one the end-of-step sequence (a failed rank aborts the others, every rank waits at the
//! finish barrier, so that a step succeeds on every rank or on none), and what a rank's runner
//! hands back ([`RankOutcome`]). The optimizer is not part of a step: [`optimizer_steps`] is what
//! a runner's `optimizer_step` calls when the trainer asks, after a step that succeeded.

use std::panic::{catch_unwind, AssertUnwindSafe};

use serde::{Deserialize, Serialize};

use crate::runtime::clock::panic_message;
use crate::runtime::{Payload, RuntimeError, Stage, Tensor};
use crate::schedule::Action;
use crate::timeline::{Span, Transfer};

/// Why a rank stopped early.
#[derive(Debug, Clone, PartialEq)]
pub enum RankStop {
    /// This rank failed.
    Failed(RuntimeError),
    /// Another rank failed and told this one to stop.
    Aborted,
}

impl From<RuntimeError> for RankStop {
    fn from(e: RuntimeError) -> Self {
        RankStop::Failed(e)
    }
}

/// What one rank's runner hands back at the end of a step; [`assemble`](crate::runtime::assemble)
/// turns the outcomes of all ranks into a [`StepReport`](crate::runtime::StepReport).
///
/// Serde data (how a rank process sends it to the one that assembles): the losses travel as their
/// bits (exact, NaN included); `result` does not travel and reads back `Ok` (a rank that failed
/// reports its own error where it runs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankOutcome {
    /// Rank's items as they ran.
    pub spans: Vec<Span>,
    /// Transfers this rank received.
    pub transfers: Vec<Transfer>,
    /// `(microbatch, loss)` computed here (on the last stage's rank).
    #[serde(with = "loss_bits")]
    pub losses: Vec<(usize, f32)>,
    /// The most activation bytes this rank's stashes held at once.
    pub peak_held: usize,
    /// Seconds spent in layer calls, per action, in execution order.
    pub action_seconds: Vec<(Action, f64)>,
    /// Of those, the calls that rebuilt a stash before `I` or `B` (recomputation), per action in
    /// execution order; empty where the runner does not time them apart.
    #[serde(default)]
    pub rebuild_seconds: Vec<(Action, f64)>,
    /// In an evaluation, `(microbatch, output of the last stage)` computed here (empty in training).
    /// Does not travel between processes (evaluation runs on the threaded runner).
    #[serde(skip)]
    pub outputs: Vec<(usize, Tensor)>,
    /// How the rank ended.
    #[serde(skip, default = "succeeded")]
    pub result: Result<(), RankStop>,
}

fn succeeded() -> Result<(), RankStop> {
    Ok(())
}

/// `(microbatch, loss)` pairs as `[microbatch, loss bits]`: exact through any format.
mod loss_bits {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[(usize, f32)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|&(k, l)| (k, l.to_bits())))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(usize, f32)>, D::Error> {
        let bits = Vec::<(usize, u32)>::deserialize(d)?;
        Ok(bits
            .into_iter()
            .map(|(k, b)| (k, f32::from_bits(b)))
            .collect())
    }
}

impl RankOutcome {
    /// An outcome with nothing run yet and the result `result` (what a runner starts from).
    pub fn empty(result: Result<(), RankStop>) -> Self {
        RankOutcome {
            spans: Vec::new(),
            transfers: Vec::new(),
            losses: Vec::new(),
            peak_held: 0,
            action_seconds: Vec::new(),
            rebuild_seconds: Vec::new(),
            outputs: Vec::new(),
            result,
        }
    }
}

/// Zeroes the weight gradients of `stages` (`(global stage, stage)`; `rank_of` names the rank in
/// an error), before a step's first action. A panic is a failure naming the stage.
pub(crate) fn zero_grads<'a, P: Payload, S: Stage<P> + 'a>(
    stages: impl IntoIterator<Item = (usize, &'a mut S)>,
    rank_of: impl Fn(usize) -> usize,
) -> Result<(), RuntimeError> {
    for (s, stage) in stages {
        catch_unwind(AssertUnwindSafe(|| stage.zero_grad())).map_err(|p| {
            RuntimeError::OptimizerFailed {
                rank: rank_of(s),
                stage: s,
                message: format!("zero_grad panicked: {}", panic_message(&*p)),
            }
        })?;
    }
    Ok(())
}

/// Applies the optimizer steps of `stages` (`(global stage, stage)`; `rank_of` names the rank in
/// an error), after a step that succeeded on every rank; the first failure (an error or a panic)
/// names its stage. What every runner's `optimizer_step` calls; a runner of one rank driven by the
/// embedder's own loop ([`run_rank`](crate::runtime::run_rank)) calls it on the rank's stages.
pub fn optimizer_steps<'a, P: Payload, S: Stage<P> + 'a>(
    stages: impl IntoIterator<Item = (usize, &'a mut S)>,
    rank_of: impl Fn(usize) -> usize,
) -> Result<(), RuntimeError> {
    for (s, stage) in stages {
        let message = match catch_unwind(AssertUnwindSafe(|| stage.optimizer_step())) {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(p) => format!("panicked: {}", panic_message(&*p)),
        };
        return Err(RuntimeError::OptimizerFailed {
            rank: rank_of(s),
            stage: s,
            message,
        });
    }
    Ok(())
}

/// Whether a runner's stages hold the gradients of a step that succeeded and that no optimizer
/// step has applied yet: what lets a runner's `optimizer_step` refuse to apply the incomplete
/// gradients of a failed step, or the same gradients twice.
#[derive(Debug, Default)]
pub(crate) struct Ready(bool);

impl Ready {
    /// A step ended (`ok`: on every rank).
    pub(crate) fn stepped(&mut self, ok: bool) {
        self.0 = ok;
    }

    /// An optimizer step is about to apply the gradients: [`RuntimeError::NoGradients`] when there
    /// are none to apply.
    pub(crate) fn take(&mut self) -> Result<(), RuntimeError> {
        if !std::mem::take(&mut self.0) {
            return Err(RuntimeError::NoGradients);
        }
        Ok(())
    }
}

/// The end of one rank's step over `link` (a transport or a peer link), after its list ended with
/// `result`: a failed rank aborts the others; every rank waits at the finish barrier, failed or
/// not, so that a rank reports success only when every rank finished (and only then may its
/// gradients be applied).
pub(crate) fn end_of_step<K: ?Sized>(
    result: Result<(), RankStop>,
    link: &mut K,
    abort: fn(&mut K),
    finish: fn(&mut K, bool) -> bool,
) -> Result<(), RankStop> {
    if let Err(RankStop::Failed(_)) = result {
        abort(link);
    }
    let all_ok = finish(link, result.is_ok());
    match result {
        Ok(()) if all_ok => Ok(()),
        Ok(()) => Err(RankStop::Aborted),
        other => other,
    }
}
