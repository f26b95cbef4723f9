//! The state of one step while a device program is enqueued: the [`Machine`] of each rank the
//! runner drives (every rank for the [`StreamExecutor`](super::StreamExecutor), one for a
//! [`RankStreams`](super::RankStreams)), the timing marks and the bytes of each edge; and how a
//! stream runner enqueues an action on it ([`run_action`]: on the stream's device, each payload it
//! reads checked to live there).

use std::collections::HashMap;

use super::stage::{Bound, BoundLoss};
use super::{Device, Misplaced};
use super::{StreamLoss, StreamStage};
use crate::cost::Recompute;
use crate::runtime::machine::{action_failed, Calls, Machine};
use crate::runtime::{Payload, RuntimeError};
use crate::schedule::deps::Edge;
use crate::schedule::{Action, Schedule};

/// The state of one step while it is enqueued.
pub(super) struct Step<D: Device, T> {
    /// The machines of ranks `first..first + machines.len()`.
    machines: Vec<Machine<D::Payload, T>>,
    first: usize,
    /// Start and end marks of each action, in enqueue order.
    pub(super) marks: Vec<(Action, D::Mark, D::Mark)>,
    /// The bytes of each edge's data, as it was handed on.
    pub(super) bytes: HashMap<Edge, usize>,
}

impl<D: Device, T> Step<D, T> {
    /// The empty state of a step of every rank of `schedule`, whose stage-0 microbatch inputs are
    /// `inputs`.
    /// `recompute` is each global stage's recomputation mode.
    pub(super) fn all_ranks(
        schedule: &Schedule,
        inputs: Vec<D::Payload>,
        recompute: &[Recompute],
    ) -> Self {
        let first_rank = schedule.rank_of(0);
        let mut inputs = Some(inputs);
        let machines = (0..schedule.ranks)
            .map(|r| {
                let mine = if r == first_rank { inputs.take() } else { None };
                Machine::new(r, schedule, mine.unwrap_or_default()).recomputing(recompute)
            })
            .collect();
        Step::of(machines, 0)
    }

    /// The empty state of rank `rank`'s part of a step of `schedule`, with stage 0's microbatch
    /// inputs `inputs` (empty on a rank without stage 0).
    pub(super) fn one_rank(
        schedule: &Schedule,
        rank: usize,
        inputs: Vec<D::Payload>,
        recompute: &[Recompute],
    ) -> Self {
        let machine = Machine::new(rank, schedule, inputs).recomputing(recompute);
        Step::of(vec![machine], rank)
    }

    /// This step run as an evaluation ([`Machine::evaluating`]): forwards only, no stash kept
    /// past its forward, the last stage's outputs kept.
    pub(super) fn evaluating(mut self) -> Self {
        self.machines = self
            .machines
            .into_iter()
            .map(|m| m.evaluating(true))
            .collect();
        self
    }

    fn of(machines: Vec<Machine<D::Payload, T>>, first: usize) -> Self {
        Step {
            machines,
            first,
            marks: Vec::new(),
            bytes: HashMap::new(),
        }
    }

    /// The machine of rank `rank`, if this step drives it.
    pub(super) fn machine(&mut self, rank: usize) -> Option<&mut Machine<D::Payload, T>> {
        self.machines.get_mut(rank.wrapping_sub(self.first))
    }

    /// The most bytes each driven rank's stashes held at once, by rank from the first.
    pub(super) fn peaks(&self) -> Vec<usize> {
        self.machines.iter().map(Machine::peak).collect()
    }

    /// The losses by microbatch, from the last stage's rank (`None` where none was computed, and
    /// everywhere when this step does not drive that rank).
    pub(super) fn losses(
        &mut self,
        schedule: &Schedule,
    ) -> Vec<Option<<D::Payload as Payload>::Loss>> {
        let m = schedule.microbatches;
        let last = schedule.rank_of(schedule.stages() - 1);
        let mut by = self
            .machine(last)
            .map_or_else(Vec::new, |machine| machine.losses_by_microbatch(m));
        by.resize_with(m, || None);
        by
    }

    /// Puts data that arrived from another rank (or was made usable on its consumer's device) in
    /// the mailbox of its consumer's rank.
    pub(super) fn arrived(&mut self, schedule: &Schedule, edge: Edge, data: D::Payload) {
        self.bytes.insert(edge, data.bytes());
        if let Some(m) = self.machine(schedule.rank_of(edge.to())) {
            m.put(edge, data);
        }
    }

    /// Hands `edge`'s data, produced on rank `from`, to its consumer: into the mailbox of the
    /// consumer's rank where this step drives it, else into `from`'s, where its send finds it.
    fn hand(&mut self, schedule: &Schedule, from: usize, edge: Edge, data: D::Payload) {
        self.bytes.insert(edge, data.bytes());
        let to = schedule.rank_of(edge.to());
        let at = if self.machine(to).is_some() { to } else { from };
        if let Some(m) = self.machine(at) {
            m.put(edge, data);
        }
    }
}

/// Enqueues action `a` of `schedule` on `stage` (the action's stage), on stream `stream` of
/// `device` (given to every call of the stage and the loss): runs it on its rank's [`Machine`]
/// and hands its output on.
///
/// Each payload the action reads (input, output gradient, target) must live on the device of
/// `stream` ([`Device::payload_device`]); else the action is refused with
/// [`RuntimeError::WrongDevice`] before the stage is called.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_action<
    D: Device,
    S: StreamStage<D::Stream, D::Payload>,
    L: StreamLoss<D::Stream, D::Payload>,
>(
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
    let stream_of = device
        .stream(stream)
        .ok_or_else(|| RuntimeError::Internal {
            rank,
            message: format!("{a} is put on stream {stream}, which the device does not have"),
        })?;
    let mut stage = Bound::<D, S> {
        stage,
        on: stream_of,
    };
    let loss = BoundLoss::<D, L> {
        loss,
        on: stream_of,
    };
    let mut on = On {
        device,
        stream,
        rank,
    };
    let machine = step.machine(rank).ok_or_else(|| RuntimeError::Internal {
        rank,
        message: format!("{a} is not on this rank"),
    })?;
    if let Some((edge, data)) = machine.run(a, &mut stage, targets, &loss, &mut on)? {
        step.hand(schedule, rank, edge, data);
    }
    Ok(())
}

/// Where an action is enqueued: its rank, the device and the stream.
struct On<'a, D> {
    device: &'a D,
    stream: usize,
    rank: usize,
}

impl<D: Device> Calls<D::Payload> for On<'_, D> {
    type Stop = RuntimeError;

    fn rank(&self) -> usize {
        self.rank
    }

    /// A copy enqueued on the action's stream, before the forward that consumes `input`.
    fn keep(&mut self, a: Action, input: &D::Payload) -> Result<D::Payload, RuntimeError> {
        self.device
            .copy(self.stream, input)
            .map_err(|e| action_failed(self.rank, a, format!("keeping the input: {e}")))
    }

    /// Refuses `payload` when it lives on another device than the stream's.
    fn placed(&self, a: Action, payload: &D::Payload) -> Result<(), RuntimeError> {
        let stream_device = self.device.stream_device(self.stream);
        match self.device.payload_device(payload) {
            Some(payload_device) if payload_device != stream_device => {
                Err(RuntimeError::WrongDevice {
                    rank: self.rank,
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
