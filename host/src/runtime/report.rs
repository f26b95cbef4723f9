//! [`StepReport`]: what a training step produced, gathered from the workers' outputs.

use serde::{Deserialize, Serialize};

use super::machine::{RankOutcome, RankStop};
use super::{RuntimeError, Tensor};
use crate::schedule::{Action, Schedule};
use crate::timeline::{Source, Timeline};

/// What one training step produced.
///
/// It is `serde` data (actions in their text form, `"2F0"`), to keep or ship a step's measurements:
///
/// ```
/// # use pipefill_host::runtime::StepReport;
/// # use pipefill_host::timeline::{Source, Timeline};
/// let r = StepReport {
///     loss: 0.5, losses: vec![0.5], timeline: Timeline::new("gpipe", Source::Measured, 1),
///     peak_held_bytes: vec![64], seconds: 0.25,
///     action_seconds: vec![("0F0".parse().unwrap(), 0.125)],
///     rebuild_seconds: Vec::new(),
/// };
/// let json = serde_json::to_string(&r).unwrap();
/// assert!(json.contains(r#""action_seconds":[["0F0",0.125]]"#));
/// assert_eq!(serde_json::from_str::<StepReport>(&json).unwrap(), r);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    /// The step's loss: the mean of the microbatch losses.
    pub loss: f32,
    /// The loss of each microbatch, by microbatch index.
    pub losses: Vec<f32>,
    /// When every item ran on every rank, in seconds since the step's start: the clock of the
    /// step hook's [`StepEvent`](super::StepEvent)s (the first item starts a little after 0).
    /// Its spans carry the time each rank was ready but not running
    /// ([`Span::descheduled`](crate::timeline::Span::descheduled),
    /// [`Span::woken_late`](crate::timeline::Span::woken_late)) from the threads' CPU clocks.
    pub timeline: Timeline,
    /// Per rank, the most activation memory its stashes held at once (from
    /// [`Stage::held_bytes`](super::Stage::held_bytes)).
    pub peak_held_bytes: Vec<usize>,
    /// Wall-clock seconds of the whole step, threads and optimizer step included.
    pub seconds: f64,
    /// Seconds spent in the layers by each action (the loss is part of the last stage's `F`),
    /// every action of the schedule once.
    #[serde(with = "action_times")]
    pub action_seconds: Vec<(Action, f64)>,
    /// The part of `action_seconds` spent rebuilding a stash before an `I` or `B`
    /// (recomputation, [`Recompute`](crate::cost::Recompute)), per action that rebuilt one; empty
    /// without recomputation, and on runners that do not time the rebuild apart (the stream
    /// runners).
    #[serde(with = "action_times", default)]
    pub rebuild_seconds: Vec<(Action, f64)>,
}

impl StepReport {
    /// Per rank (by the rank of each action's stage in `schedule`), the seconds spent rebuilding
    /// stashes ([`StepReport::rebuild_seconds`]).
    pub fn rebuild_seconds_by_rank(&self, schedule: &Schedule) -> Vec<f64> {
        let mut by = vec![0.0; schedule.ranks];
        for (a, t) in &self.rebuild_seconds {
            if let Some(r) = by.get_mut(schedule.rank_of(a.stage)) {
                *r += t;
            }
        }
        by
    }
}

/// `(action, seconds)` pairs as `["2F0", seconds]`.
mod action_times {
    use serde::{de, Deserialize, Deserializer, Serializer};

    use crate::schedule::Action;

    pub fn serialize<S: Serializer>(v: &[(Action, f64)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|(a, t)| (a.to_string(), *t)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(Action, f64)>, D::Error> {
        Vec::<(String, f64)>::deserialize(d)?
            .into_iter()
            .map(|(a, t)| a.parse().map(|a| (a, t)).map_err(de::Error::custom))
            .collect()
    }
}

/// The output of a worker whose thread died outside any guarded call (cannot happen unless the
/// runtime itself has a bug); reported rather than propagated as a panic.
pub(super) fn lost_worker(rank: usize) -> RankOutcome {
    RankOutcome::empty(Err(RankStop::Failed(RuntimeError::Internal {
        rank,
        message: "a worker thread panicked outside a layer call".into(),
    })))
}

/// Gathers the outcomes of every rank's [`run_rank`](super::run_rank) (in rank order) into a step
/// report, or the error that stopped the step (the first rank that failed by itself is the cause;
/// the others were told to stop). `seconds` is the step's wall-clock time.
pub fn assemble(
    schedule: &Schedule,
    outputs: Vec<RankOutcome>,
    seconds: f64,
) -> Result<StepReport, RuntimeError> {
    // The first rank that failed by itself is the cause; the others were told to stop.
    let mut first_error = None;
    for o in &outputs {
        if let Err(RankStop::Failed(e)) = &o.result {
            first_error.get_or_insert_with(|| e.clone());
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let mut losses = vec![0.0f32; schedule.microbatches];
    let mut spans = Vec::with_capacity(outputs.len());
    let mut transfers = Vec::new();
    let mut peak_held_bytes = Vec::with_capacity(outputs.len());
    let mut action_seconds: Vec<(Action, f64)> = Vec::new();
    let mut rebuild_seconds = Vec::new();
    for o in outputs {
        rebuild_seconds.extend(o.rebuild_seconds);
        for (a, t) in o.action_seconds {
            // The last stage's F is two calls (forward, loss): one action.
            match action_seconds.last_mut() {
                Some((prev, sum)) if *prev == a => *sum += t,
                _ => action_seconds.push((a, t)),
            }
        }
        for (k, v) in o.losses {
            losses[k] = v;
        }
        spans.push(o.spans);
        transfers.extend(o.transfers);
        peak_held_bytes.push(o.peak_held);
    }
    // Not shifted: the timeline counts from the step's start, as the hook's times do.
    let timeline = Timeline {
        name: schedule.name.clone(),
        source: Source::Measured,
        spans,
        transfers,
    };
    let loss = losses.iter().sum::<f32>() / losses.len().max(1) as f32;
    Ok(StepReport {
        loss,
        losses,
        timeline,
        peak_held_bytes,
        seconds,
        action_seconds,
        rebuild_seconds,
    })
}

/// What an evaluation step produced ([`Executor::evaluate`](super::Executor::evaluate)): the
/// schedule's forwards only, no stash kept past its forward, no gradient, no optimizer step.
///
/// `Y` is what the last stage's outputs are: host [`Tensor`]s on the threaded runners, the
/// device's payloads on the stream runners
/// ([`StreamExecutor::evaluate`](super::streams::StreamExecutor::evaluate)).
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation<Y = Tensor> {
    /// The mean of the microbatch losses.
    pub loss: f32,
    /// The loss of each microbatch, by microbatch index.
    pub losses: Vec<f32>,
    /// The last stage's output for each microbatch, by microbatch index.
    pub outputs: Vec<Y>,
    /// When every item ran on every rank (the forwards and their transfers; starts at 0).
    pub timeline: Timeline,
    /// Per rank, the most activation bytes held at once: at most one forward's stash, which
    /// the runtime drops as soon as the forward returns.
    pub peak_held_bytes: Vec<usize>,
    /// Wall-clock seconds of the whole evaluation.
    pub seconds: f64,
}

/// [`assemble`] for an evaluation: the ranks' outcomes (in rank order) with the last stage's
/// outputs, into an [`Evaluation`].
pub(super) fn assemble_evaluation(
    schedule: &Schedule,
    mut outcomes: Vec<RankOutcome>,
    seconds: f64,
) -> Result<Evaluation, RuntimeError> {
    let mut by_microbatch: Vec<Option<Tensor>> = vec![None; schedule.microbatches];
    for (k, y) in outcomes
        .iter_mut()
        .flat_map(|o| std::mem::take(&mut o.outputs))
    {
        if let Some(slot) = by_microbatch.get_mut(k) {
            *slot = Some(y);
        }
    }
    let report = assemble(schedule, outcomes, seconds)?;
    let outputs = by_microbatch
        .into_iter()
        .enumerate()
        .map(|(k, y)| {
            y.ok_or_else(|| RuntimeError::Internal {
                rank: schedule.rank_of(schedule.stages().saturating_sub(1)),
                message: format!("the evaluation has no output for microbatch {k}"),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Evaluation {
        loss: report.loss,
        losses: report.losses,
        outputs,
        timeline: report.timeline,
        peak_held_bytes: report.peak_held_bytes,
        seconds,
    })
}
