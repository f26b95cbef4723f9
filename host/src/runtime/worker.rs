//! One rank's worker: runs the rank's lowered list strictly in order (its compute items and the
//! sends and receives [`lower`](crate::schedule::lower) put around them), exchanging activations
//! and gradients with the other ranks through a [`Transport`] at those sends and receives, and
//! timing every item. Its compute actions run on the rank's [`Machine`] (stashes, mailbox, held
//! bytes, order checks, loss). Only a receive waits; a compute action finds its input already there
//! (on its own rank, or received just before).

use super::key_map::KeyMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Instant;

use super::clock::{panic_message, Clock, Timed};
use super::hook::{Hooked, StepEvent};
use super::machine::{end_of_step, zero_grads, Arrival, Machine};
use super::program::RankProgram;
use super::transport::{Parcel, Transport, TransportError};
use super::Tensor;
use super::{last_gradient_actions, Loss, RankOutcome, RankStop, RuntimeError, Stage, StageError};
use crate::cost::Recompute;
use crate::schedule::deps::Edge;
use crate::schedule::{Action, Comm, Item, Op, ParamOp, Schedule};
use crate::timeline::Span;

/// One rank's part of a training step, as [`run_rank`] takes it.
pub struct RankStep<'a, S, L> {
    /// The schedule.
    pub schedule: &'a Schedule,
    /// Its lowered lists ([`RankProgram::of`] the schedule).
    pub program: &'a RankProgram,
    /// Which rank this is.
    pub rank: usize,
    /// `(global stage index, stage)` for the stages this rank holds.
    pub stages: Vec<(usize, &'a mut S)>,
    /// Stage 0's microbatch inputs on the rank that holds stage 0 (empty elsewhere).
    pub inputs: Vec<Tensor>,
    /// The microbatch targets (read on the rank of the last stage).
    pub targets: &'a [Tensor],
    /// The loss after the last stage.
    pub loss: &'a L,
    /// Time zero of the step's timeline.
    pub epoch: Instant,
    /// When set, every layer call holds this lock: one action at a time over all ranks of a process.
    pub exclusive: Option<&'a Mutex<()>>,
    /// The trainer's step hook, if any: told of every action as it completes.
    pub hook: Option<&'a (dyn Fn(StepEvent) + Sync)>,
    /// The data-parallel reduction, if any: called with each stage's [`Stage::gradients`] right
    /// after the stage's last `W`/`B` of the step, on this rank's thread.
    pub reduce: Option<&'a Reducer>,
    /// Each global stage's recomputation mode (a stage past its end: none; see
    /// [`Executor::set_recompute`](super::Executor::set_recompute)).
    pub recompute: &'a [Recompute],
}

/// A data-parallel gradient reduction: `(global stage, that stage's gradient buffers)`; it must
/// leave in the buffers what every replica's optimizer step applies (e.g. the mean over replicas).
pub type Reducer = dyn Fn(usize, Vec<&mut [f32]>) -> Result<(), StageError> + Send + Sync;

/// The mutable state of a running rank.
struct RankRun<'c, S: Stage, L, T> {
    schedule: &'c Schedule,
    program: &'c RankProgram,
    targets: &'c [Tensor],
    loss: &'c L,
    epoch: Instant,
    transport: &'c mut T,
    rank: usize,
    stages: Vec<(usize, &'c mut S)>,
    /// The rank's inputs, mailbox, stashes, held bytes and losses: where its actions run.
    machine: Machine<Tensor, S::Stash>,
    /// Outputs for another rank, waiting for their send.
    outbox: KeyMap<Edge, (Tensor, Action)>,
    clock: Clock<'c>,
    hook: Option<Hooked<'c>>,
    reduce: Option<&'c Reducer>,
    /// With `reduce`: per global stage, the action after which its gradients are final; the
    /// reduction runs right after it, or at the stage's `REDUCE_GRAD` where the list has one.
    last_gradient: Vec<Option<Action>>,
    reduce_items: Vec<bool>,
    out: RankOutcome,
}

/// Runs one rank's part of a step over `transport`: zero-grad, the rank's lowered list strictly in
/// order, then the finish barrier ([`Transport::finish`]): the outcome is a success only when every
/// rank finished its list and none failed. The step ends with the rank's gradients ready (reduced
/// across replicas where `step.reduce` is set); the optimizer is the caller's to apply, after a
/// success ([`optimizer_steps`](super::optimizer_steps) on the rank's stages). The in-process
/// [`Executor`](super::Executor) runs one per thread over [`Channels`](super::Channels); a
/// multi-process launcher runs one per process over its own transport.
pub fn run_rank<S: Stage, L: Loss, T: Transport>(
    step: RankStep<'_, S, L>,
    transport: &mut T,
) -> RankOutcome {
    let rank = step.rank;
    // An evaluation program: no zero-grad, no stash kept, no optimizer step.
    let evaluation = step.program.is_evaluation();
    let mut run = RankRun {
        schedule: step.schedule,
        program: step.program,
        targets: step.targets,
        loss: step.loss,
        epoch: step.epoch,
        transport,
        rank,
        stages: step.stages,
        machine: Machine::new(rank, step.schedule, step.inputs)
            .evaluating(evaluation)
            .recomputing(step.recompute),
        outbox: KeyMap::default(),
        clock: Clock::new(step.epoch, step.exclusive),
        hook: step.hook.map(|h| Hooked::new(h, step.schedule, rank)),
        reduce: step.reduce,
        last_gradient: match step.reduce {
            Some(_) => last_gradient_actions(step.schedule),
            None => Vec::new(),
        },
        reduce_items: step.program.reduces_at_item(step.schedule, rank),
        out: RankOutcome::empty(Ok(())),
    };
    // Layer calls are guarded one by one; this outer guard only keeps a bug in the runtime
    // itself from leaving the other ranks waiting at the barrier.
    let result = catch_unwind(AssertUnwindSafe(|| {
        if evaluation {
            return run.items();
        }
        run.zero_grad().and_then(|()| run.items())
    }))
    .unwrap_or_else(|p| {
        Err(RankStop::Failed(RuntimeError::Internal {
            rank,
            message: format!("the runtime panicked: {}", panic_message(&*p)),
        }))
    });
    let result = end_of_step(result, run.transport, T::abort, T::finish);
    run.out.losses = run.machine.take_losses();
    run.out.transfers = run.machine.take_transfers();
    run.out.peak_held = run.machine.peak();
    run.out.outputs = run.machine.take_outputs();
    run.out.result = result;
    run.out
}

impl<S: Stage, L: Loss, T: Transport> RankRun<'_, S, L, T> {
    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    fn zero_grad(&mut self) -> Result<(), RankStop> {
        let rank = self.rank;
        let stages = self.stages.iter_mut().map(|(s, st)| (*s, &mut **st));
        Ok(zero_grads(stages, |_| rank)?)
    }

    fn items(&mut self) -> Result<(), RankStop> {
        let program = self.program;
        for item in program.list(self.rank) {
            if self.transport.aborted() {
                return Err(RankStop::Aborted);
            }
            self.clock.next_item();
            match *item {
                Item::One(a) => self.action(a)?,
                Item::Overlap { forward, backward } => {
                    // On CPU the two halves of an overlapped pair run one after the other.
                    self.action(forward)?;
                    self.action(backward)?;
                }
                Item::Comm(c) => {
                    // A send hands its data over at once (channels and MPI buffer it), so the
                    // wait that retires it has nothing to wait for. A receive is posted here and
                    // waited on by the compute that uses its data (`take`), as in PyTorch.
                    if c.op.is_send() {
                        self.transfer(c)?;
                    }
                    if !program.explicit() {
                        continue;
                    }
                    // A transfer takes no time on its rank: it is marked where it completed.
                    let now = self.now();
                    self.clock.first_start = Some(now);
                    self.clock.last_end = now;
                }
                // Parameter operations have no work on one process but the reduction.
                Item::Param(p) => {
                    if let (ParamOp::ReduceGrad, Some(&Some(a))) =
                        (p.op, self.last_gradient.get(p.stage))
                    {
                        self.reduce(a)?;
                    }
                    let now = self.now();
                    self.clock.first_start = Some(now);
                    self.clock.last_end = now;
                }
            }
            let end = self.clock.last_end;
            let start = self.clock.first_start.unwrap_or(end);
            let span = Span::new(*item, start, end);
            let span = span.with_lost(self.clock.descheduled, self.clock.woken_late);
            self.out.spans.push(span);
        }
        Ok(())
    }

    /// A send hands the output waiting in the outbox to its rank; a receive waits for its data.
    fn transfer(&mut self, c: Comm) -> Result<(), RankStop> {
        let Some(e) = Edge::of(c, self.schedule.stages()) else {
            return Err(self.internal(format!("`{c}` names no boundary")));
        };
        if c.op.is_send() {
            let (tensor, producer) = self.outbox.remove(&e).ok_or_else(|| {
                self.internal(format!(
                    "`{c}` has nothing to send: its producer has not run"
                ))
            })?;
            return self.send(e, tensor, producer);
        }
        if !self.machine.has(e) {
            let from = self.schedule.rank_of(e.from);
            let waiting_since = self.now();
            let parcel = match self.transport.recv(e, from, None) {
                Ok((p, ())) => p,
                Err(TransportError::Aborted) => return Err(RankStop::Aborted),
                Err(error) => return Err(self.fail(e.consumer(), error.to_string())),
            };
            let received_at = self.now();
            // Ready but not running: the data had been sent while the rank waited, and the rank
            // had not yet returned from the wait.
            self.clock.woken_late += (received_at - parcel.sent_at.max(waiting_since)).max(0.0);
            let arrival = Arrival {
                from: parcel.from,
                producer: parcel.producer,
                sent_at: parcel.sent_at,
                received_at,
                bytes: parcel.tensor.bytes(),
            };
            self.machine.arrived(e, parcel.tensor, arrival);
        }
        Ok(())
    }

    fn internal(&self, message: String) -> RankStop {
        RankStop::Failed(RuntimeError::Internal {
            rank: self.rank,
            message,
        })
    }

    fn fail(&self, action: Action, message: impl Into<String>) -> RankStop {
        RankStop::Failed(RuntimeError::ActionFailed {
            rank: self.rank,
            action,
            message: message.into(),
        })
    }

    /// Runs `a` on the rank's [`Machine`], its layer calls timed by the clock, and hands its
    /// output on.
    fn action(&mut self, a: Action) -> Result<(), RankStop> {
        // Data from another rank: the lowered list posted its receive earlier (as PyTorch does);
        // the rank waits for it here, at the compute that uses it.
        let input = match a.op {
            Op::F => Edge::input_of(a),
            Op::I | Op::B => Some(Edge::gradient_of(a)),
            Op::W => None,
        };
        if let Some(e) = input {
            if e.from < self.schedule.stages() && self.schedule.rank_of(e.from) != self.rank {
                self.transfer(e.recv())?;
            }
        }
        self.clock.action_start = None;
        let rank = self.rank;
        let stage = local_stage(&mut self.stages, a.stage).ok_or_else(|| not_here(rank, a))?;
        let mut calls = Timed {
            clock: &mut self.clock,
            rank,
            out: &mut self.out,
        };
        if let Some((edge, data)) =
            self.machine
                .run(a, stage, self.targets, self.loss, &mut calls)?
        {
            self.deliver(edge, data, a);
        }
        if let Some(hook) = &self.hook {
            let end = self.clock.last_end;
            hook.done(self.rank, a, self.clock.action_start.unwrap_or(end), end)?;
        }
        if self.last_gradient.get(a.stage) == Some(&Some(a)) && !self.reduce_items[a.stage] {
            self.reduce(a)?;
        }
        Ok(())
    }

    /// The data-parallel reduction of the stage of `a`, its last gradient action (if reducing).
    fn reduce(&mut self, a: Action) -> Result<(), RankStop> {
        let Some(reduce) = self.reduce else {
            return Ok(());
        };
        let rank = self.rank;
        let stage = local_stage(&mut self.stages, a.stage).ok_or_else(|| not_here(rank, a))?;
        let grads = stage.gradients();
        reduce(a.stage, grads).map_err(|e| RankStop::Failed(reduce_failed(rank, a, e)))
    }

    /// Hands a tensor to its consumer: directly on this rank, else into the outbox until its send.
    fn deliver(&mut self, edge: Edge, tensor: Tensor, producer: Action) {
        let dest = self.schedule.rank_of(edge.to());
        if dest == self.rank {
            self.machine.put(edge, tensor);
        } else {
            self.outbox.insert(edge, (tensor, producer));
        }
    }

    /// Sends a tensor to the rank holding its consumer.
    fn send(&mut self, edge: Edge, tensor: Tensor, producer: Action) -> Result<(), RankStop> {
        let dest = self.schedule.rank_of(edge.to());
        let parcel = Parcel {
            producer,
            from: self.rank,
            sent_at: self.now(),
            tensor,
        };
        match self.transport.send(edge, dest, parcel, ()) {
            Ok(()) => Ok(()),
            Err(TransportError::Aborted) => Err(RankStop::Aborted),
            Err(error) => Err(self.internal(error.to_string())),
        }
    }
}

/// The failure of the data-parallel reduction of `a`'s stage after `a` (its last gradient
/// action) on rank `rank`, saying `e`.
pub(crate) fn reduce_failed(rank: usize, a: Action, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::ActionFailed {
        rank,
        action: a,
        message: format!("data-parallel reduction of stage {}: {e}", a.stage),
    }
}

/// The local stage with global index `stage` (a rank holds `V` of them: a short linear search).
fn local_stage<'a, S>(stages: &'a mut [(usize, &mut S)], stage: usize) -> Option<&'a mut S> {
    stages
        .iter_mut()
        .find(|(s, _)| *s == stage)
        .map(|(_, st)| &mut **st)
}

fn not_here(rank: usize, a: Action) -> RankStop {
    RankStop::Failed(RuntimeError::ActionFailed {
        rank,
        action: a,
        message: format!("stage {} is not held by rank {rank}", a.stage),
    })
}
