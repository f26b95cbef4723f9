//! The state of one step while a device program is enqueued, and the action logic every stream
//! runner shares: take an action's input, call its stage, hold the stash until `W` (or `B`), hand
//! the output on. Used by the [`StreamExecutor`](super::StreamExecutor) (every rank from one thread)
//! and the per-rank [`RankStreams`](super::RankStreams) (one rank's stages).

use std::collections::HashMap;

use super::{Device, Misplaced};
use crate::runtime::program::{grad_edge, input_edge};
use crate::runtime::{Loss, Payload, RuntimeError, Stage};
use crate::schedule::deps::{output, Edge};
use crate::schedule::{Action, Op, Schedule};

/// A stash and whether `I` has run on it.
pub(super) struct Held<T> {
    stash: T,
    input_done: bool,
    bytes: usize,
}

/// The state of one step while it is enqueued.
pub(super) struct Step<D: Device, T> {
    pub(super) stashes: HashMap<(usize, usize), Held<T>>,
    /// Data waiting for its consumer: `(edge, payload)` by edge.
    pub(super) mailbox: HashMap<Edge, D::Payload>,
    pub(super) inputs: Vec<Option<D::Payload>>,
    pub(super) losses: Vec<Option<<D::Payload as Payload>::Loss>>,
    pub(super) held: Vec<usize>,
    pub(super) peak: Vec<usize>,
    /// Start and end marks of each action, in enqueue order.
    pub(super) marks: Vec<(Action, D::Mark, D::Mark)>,
    pub(super) bytes: HashMap<Edge, usize>,
}

impl<D: Device, T> Step<D, T> {
    /// The empty state of a step of `schedule` whose stage-0 microbatch inputs are `inputs`
    /// (empty on a rank without stage 0).
    pub(super) fn new(schedule: &Schedule, inputs: Vec<D::Payload>) -> Self {
        let (p, m) = (schedule.ranks, schedule.microbatches);
        Step {
            stashes: HashMap::new(),
            mailbox: HashMap::new(),
            inputs: inputs.into_iter().map(Some).collect(),
            losses: (0..m).map(|_| None).collect(),
            held: vec![0; p],
            peak: vec![0; p],
            marks: Vec::new(),
            bytes: HashMap::new(),
        }
    }

    pub(super) fn hold(&mut self, rank: usize, add: usize, remove: usize) {
        self.held[rank] = (self.held[rank] + add).saturating_sub(remove);
        self.peak[rank] = self.peak[rank].max(self.held[rank]);
    }
}

/// Enqueues one action of `schedule` on `stage` (the action's stage): takes its input (stage 0's
/// from `step.inputs`, else from the mailbox), calls the stage, holds the stash, computes the loss
/// after the last stage, and puts the output in the mailbox under its edge.
///
/// Each payload the action reads (input, output gradient, target) must live on the device of
/// `stream`, the stream the action is enqueued on ([`Device::payload_device`]); else the action is
/// refused with [`RuntimeError::WrongDevice`] before the stage is called.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_action<D: Device, S: Stage<D::Payload>, L: Loss<D::Payload>>(
    schedule: &Schedule,
    device: &D,
    stream: usize,
    stage: &mut S,
    step: &mut Step<D, S::Stash>,
    a: Action,
    targets: &[D::Payload],
    loss: &L,
) -> Result<(), RuntimeError> {
    let rank = schedule.rank_of(a.stage);
    let on = On {
        schedule,
        device,
        stream,
    };
    let handed: Option<D::Payload> = match a.op {
        Op::F => forward(&on, stage, step, a, targets, loss)?,
        Op::I | Op::B => Some(backward(&on, stage, step, a)?),
        Op::W => {
            let key = (a.stage, a.microbatch);
            let h = step.stashes.remove(&key).ok_or_else(|| no_stash(rank, a))?;
            if !h.input_done {
                return Err(act(rank, a, "W before I for this microbatch"));
            }
            step.hold(rank, 0, h.bytes);
            stage
                .backward_weight(h.stash)
                .map_err(|e| act(rank, a, e))?;
            None
        }
    };
    if let (Some(data), Some(edge)) = (handed, output(a, schedule.stages())) {
        step.bytes.insert(edge, data.bytes());
        step.mailbox.insert(edge, data);
    }
    Ok(())
}

/// `F`: the output to hand on, or `None` after the last stage (whose loss gradient goes to the
/// mailbox for its own backward).
fn forward<D: Device, S: Stage<D::Payload>, L: Loss<D::Payload>>(
    on: &On<'_, D>,
    stage: &mut S,
    step: &mut Step<D, S::Stash>,
    a: Action,
    targets: &[D::Payload],
    loss: &L,
) -> Result<Option<D::Payload>, RuntimeError> {
    let schedule = on.schedule;
    let rank = schedule.rank_of(a.stage);
    let input = if a.stage == 0 {
        step.inputs.get_mut(a.microbatch).and_then(Option::take)
    } else {
        step.mailbox.remove(&input_edge(a))
    };
    let input = input.ok_or_else(|| no_input(rank, a))?;
    on.placed(a, &input)?;
    let (out, stash) = stage.forward(input).map_err(|e| act(rank, a, e))?;
    let bytes = stage.held_bytes(&stash);
    let stashed = Held {
        stash,
        input_done: false,
        bytes,
    };
    step.hold(rank, bytes, 0);
    if step
        .stashes
        .insert((a.stage, a.microbatch), stashed)
        .is_some()
    {
        return Err(act(rank, a, "this forward already ran"));
    }
    if a.stage + 1 < schedule.stages() {
        return Ok(Some(out));
    }
    let target = targets.get(a.microbatch).ok_or_else(|| no_input(rank, a))?;
    on.placed(a, target)?;
    let (value, mut grad) = loss.loss(&out, target).map_err(|e| act(rank, a, e))?;
    grad.scale_by(1.0 / schedule.microbatches as f32)
        .map_err(|e| act(rank, a, e))?;
    step.losses[a.microbatch] = Some(value);
    step.mailbox.insert(grad_edge(a), grad);
    Ok(None)
}

/// `I` (keeping the stash for `W`) or `B` (consuming it): the input gradient.
fn backward<D: Device, S: Stage<D::Payload>>(
    on: &On<'_, D>,
    stage: &mut S,
    step: &mut Step<D, S::Stash>,
    a: Action,
) -> Result<D::Payload, RuntimeError> {
    let rank = on.schedule.rank_of(a.stage);
    let key = (a.stage, a.microbatch);
    let grad = step
        .mailbox
        .remove(&grad_edge(a))
        .ok_or_else(|| no_input(rank, a))?;
    on.placed(a, &grad)?;
    let held = if a.op == Op::I {
        step.stashes.get_mut(&key)
    } else {
        None
    };
    match held {
        Some(h) if !h.input_done => {
            let gi = stage
                .backward_input(&mut h.stash, grad)
                .map_err(|e| act(rank, a, e))?;
            let (before, after) = (h.bytes, stage.held_bytes(&h.stash));
            h.bytes = after;
            h.input_done = true;
            step.hold(rank, after, before);
            Ok(gi)
        }
        Some(_) => Err(act(rank, a, "I already ran for this microbatch")),
        None => {
            let h = step.stashes.remove(&key).ok_or_else(|| no_stash(rank, a))?;
            step.hold(rank, 0, h.bytes);
            if h.input_done {
                return Err(act(rank, a, "B after I for this microbatch"));
            }
            stage.backward(h.stash, grad).map_err(|e| act(rank, a, e))
        }
    }
}

/// Where an action is enqueued: the schedule (for ranks), the device and the stream.
struct On<'a, D> {
    schedule: &'a Schedule,
    device: &'a D,
    stream: usize,
}

impl<D: Device> On<'_, D> {
    /// Refuses `payload` when it lives on another device than the stream's.
    fn placed(&self, a: Action, payload: &D::Payload) -> Result<(), RuntimeError> {
        let stream_device = self.device.stream_device(self.stream);
        match self.device.payload_device(payload) {
            Some(payload_device) if payload_device != stream_device => {
                Err(RuntimeError::WrongDevice {
                    rank: self.schedule.rank_of(a.stage),
                    action: a,
                    misplaced: Box::new(Misplaced {
                        stream: self.stream,
                        stream_device,
                        payload_device,
                    }),
                })
            }
            _ => Ok(()),
        }
    }
}

fn act(rank: usize, action: Action, e: impl ToString) -> RuntimeError {
    RuntimeError::ActionFailed {
        rank,
        action,
        message: e.to_string(),
    }
}

fn no_input(rank: usize, a: Action) -> RuntimeError {
    act(
        rank,
        a,
        "its input was not produced before it (does the program check?)",
    )
}

fn no_stash(rank: usize, a: Action) -> RuntimeError {
    act(
        rank,
        a,
        "no stash: the forward of this stage and microbatch has not run",
    )
}
