//! One rank's worker: runs the rank's lowered list strictly in order (its compute items and the
//! sends and receives [`lower`](crate::schedule::lower) put around them), exchanging activations
//! and gradients with the other ranks through channels at those sends and receives, holding stashes
//! until their `W` (or `B`), and timing every item. Only a receive waits; a compute action finds
//! its input already there (on its own rank, or received just before).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Instant;

use super::clock::{panic_message, Clock};
use super::hook::{Hooked, StepEvent};
use super::program::{grad_edge, input_edge, RankProgram};
use super::transport::{Parcel, Transport, TransportError};
use super::{last_gradient_actions, Loss, RuntimeError, Stage, StageError, Tensor};
use crate::schedule::deps::{Edge, Flow};
use crate::schedule::{Action, Comm, Item, Op, ParamOp, Schedule};
use crate::timeline::{Span, Transfer};

/// A tensor waiting in a rank's mailbox, with where it came from if it crossed ranks.
struct Held {
    tensor: Tensor,
    arrival: Option<Arrival>,
}

/// How a tensor crossed from another rank.
struct Arrival {
    from: usize,
    producer: Action,
    sent_at: f64,
    received_at: f64,
    bytes: usize,
}

/// A stash and whether `I` has already run on it.
struct Stashed<T> {
    stash: T,
    input_done: bool,
    bytes: usize,
}

/// Why a rank stopped early.
#[derive(Debug, Clone, PartialEq)]
pub enum RankStop {
    /// This rank failed.
    Failed(RuntimeError),
    /// Another rank failed and told this one to stop.
    Aborted,
}

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
}

/// A data-parallel gradient reduction: `(global stage, that stage's gradient buffers)`; it must
/// leave in the buffers what every replica's optimizer step applies (e.g. the mean over replicas).
pub type Reducer = dyn Fn(usize, Vec<&mut [f32]>) -> Result<(), StageError> + Send + Sync;

/// What one rank's runner hands back at the end of a step; [`assemble`](super::assemble) turns the
/// outcomes of all ranks into a [`StepReport`](super::StepReport).
#[derive(Debug, Clone)]
pub struct RankOutcome {
    /// Rank's items as they ran.
    pub spans: Vec<Span>,
    /// Transfers this rank received.
    pub transfers: Vec<Transfer>,
    /// `(microbatch, loss)` computed here (on the last stage's rank).
    pub losses: Vec<(usize, f32)>,
    /// The most activation bytes this rank's stashes held at once.
    pub peak_held: usize,
    /// Seconds spent in layer calls, per action, in execution order.
    pub action_seconds: Vec<(Action, f64)>,
    /// How the rank ended.
    pub result: Result<(), RankStop>,
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
            result,
        }
    }
}

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
    inputs: Vec<Option<Tensor>>,
    mailbox: HashMap<Edge, Held>,
    /// Outputs for another rank, waiting for their send.
    outbox: HashMap<Edge, (Tensor, Action)>,
    stashes: HashMap<(usize, usize), Stashed<S::Stash>>,
    held: usize,
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
/// order, then (once [`Transport::finish`] says every rank finished its list and none failed) the
/// optimizer step. The in-process [`Executor`](super::Executor) runs one per thread over
/// [`Channels`](super::Channels); a multi-process launcher runs one per process over its own transport.
pub fn run_rank<S: Stage, L: Loss, T: Transport>(
    step: RankStep<'_, S, L>,
    transport: &mut T,
) -> RankOutcome {
    let rank = step.rank;
    let mut run = RankRun {
        schedule: step.schedule,
        program: step.program,
        targets: step.targets,
        loss: step.loss,
        epoch: step.epoch,
        transport,
        rank,
        stages: step.stages,
        inputs: step.inputs.into_iter().map(Some).collect(),
        mailbox: HashMap::new(),
        outbox: HashMap::new(),
        stashes: HashMap::new(),
        held: 0,
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
        run.zero_grad().and_then(|()| run.items())
    }))
    .unwrap_or_else(|p| {
        Err(RankStop::Failed(RuntimeError::Internal {
            rank,
            message: format!("the runtime panicked: {}", panic_message(&*p)),
        }))
    });
    if let Err(RankStop::Failed(_)) = result {
        run.transport.abort();
    }
    // Everybody waits here, failed or not, so that no rank steps its optimizer unless all
    // ranks finished their lists.
    let all_ok = run.transport.finish(result.is_ok());
    let result = match result {
        Ok(()) if all_ok => run.optimizer_step(),
        Ok(()) => Err(RankStop::Aborted),
        other => other,
    };
    run.out.result = result;
    run.out
}

impl<S: Stage, L: Loss, T: Transport> RankRun<'_, S, L, T> {
    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    fn zero_grad(&mut self) -> Result<(), RankStop> {
        let rank = self.rank;
        for (s, stage) in self.stages.iter_mut() {
            catch_unwind(AssertUnwindSafe(|| stage.zero_grad())).map_err(|p| {
                RankStop::Failed(RuntimeError::OptimizerFailed {
                    rank,
                    stage: *s,
                    message: format!("zero_grad panicked: {}", panic_message(&*p)),
                })
            })?;
        }
        Ok(())
    }

    fn optimizer_step(&mut self) -> Result<(), RankStop> {
        let rank = self.rank;
        for (s, stage) in self.stages.iter_mut() {
            let message = match catch_unwind(AssertUnwindSafe(|| stage.optimizer_step())) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(p) => format!("panicked: {}", panic_message(&*p)),
            };
            return Err(RankStop::Failed(RuntimeError::OptimizerFailed {
                rank,
                stage: *s,
                message,
            }));
        }
        Ok(())
    }

    fn items(&mut self) -> Result<(), RankStop> {
        let program = self.program;
        for item in program.list(self.rank) {
            if self.transport.aborted() {
                return Err(RankStop::Aborted);
            }
            self.clock.first_start = None;
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
            self.out.spans.push(Span::new(*item, start, end));
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
        if !self.mailbox.contains_key(&e) {
            let op = match e.flow {
                Flow::Activation => Op::F,
                Flow::Gradient => Op::I,
            };
            let consumer = Action::new(op, e.to(), e.microbatch);
            let from = self.schedule.rank_of(e.from);
            let parcel = match self.transport.recv(e, from) {
                Ok(p) => p,
                Err(TransportError::Aborted) => return Err(RankStop::Aborted),
                Err(TransportError::Lost { message }) => return Err(self.fail(consumer, message)),
            };
            let received_at = self.now();
            let held = Held {
                arrival: Some(Arrival {
                    from: parcel.from,
                    producer: parcel.producer,
                    sent_at: parcel.sent_at,
                    received_at,
                    bytes: parcel.tensor.bytes(),
                }),
                tensor: parcel.tensor,
            };
            self.mailbox.insert(e, held);
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

    fn action(&mut self, a: Action) -> Result<(), RankStop> {
        self.clock.action_start = None;
        match a.op {
            Op::F => self.forward(a),
            Op::I => self.backward_input(a),
            Op::W => self.backward_weight(a),
            Op::B => self.backward(a),
        }?;
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
        reduce(a.stage, grads).map_err(|e| {
            self.fail(
                a,
                format!("data-parallel reduction of stage {}: {e}", a.stage),
            )
        })
    }

    fn forward(&mut self, a: Action) -> Result<(), RankStop> {
        let input = if a.stage == 0 {
            self.inputs
                .get_mut(a.microbatch)
                .and_then(Option::take)
                .ok_or_else(|| self.fail(a, "no input for this microbatch (run twice?)"))?
        } else {
            self.take(input_edge(a), a)?
        };
        if self.stashes.contains_key(&(a.stage, a.microbatch)) {
            return Err(self.fail(a, "this forward already ran and its stash is still held"));
        }
        let rank = self.rank;
        let stage = local_stage(&mut self.stages, a.stage).ok_or_else(|| not_here(rank, a))?;
        let (output, stash, bytes) =
            self.clock.call(rank, a, &mut self.out.action_seconds, || {
                let (output, stash) = stage.forward(input)?;
                let bytes = stage.held_bytes(&stash);
                Ok((output, stash, bytes))
            })?;
        self.hold(bytes, 0);
        self.stashes.insert(
            (a.stage, a.microbatch),
            Stashed {
                stash,
                input_done: false,
                bytes,
            },
        );
        let last = self.schedule.stages() - 1;
        if a.stage == last {
            let target = self
                .targets
                .get(a.microbatch)
                .ok_or_else(|| self.fail(a, "no target for this microbatch"))?;
            let loss = self.loss;
            let (value, mut grad) =
                self.clock.call(rank, a, &mut self.out.action_seconds, || {
                    loss.loss(&output, target)
                })?;
            grad.scale(1.0 / self.schedule.microbatches as f32);
            self.out.losses.push((a.microbatch, value));
            self.deliver(grad_edge(a), grad, a);
        } else {
            let edge = Edge {
                flow: Flow::Activation,
                from: a.stage,
                microbatch: a.microbatch,
            };
            self.deliver(edge, output, a);
        }
        Ok(())
    }

    fn backward_input(&mut self, a: Action) -> Result<(), RankStop> {
        let grad = self.take(grad_edge(a), a)?;
        let rank = self.rank;
        let slot = self
            .stashes
            .get_mut(&(a.stage, a.microbatch))
            .ok_or_else(|| no_stash(rank, a))?;
        if slot.input_done {
            return Err(self.fail(a, "I already ran for this microbatch"));
        }
        let stage = local_stage(&mut self.stages, a.stage).ok_or_else(|| not_here(rank, a))?;
        let (grad_input, bytes) = self.clock.call(rank, a, &mut self.out.action_seconds, || {
            let grad_input = stage.backward_input(&mut slot.stash, grad)?;
            Ok((grad_input, stage.held_bytes(&slot.stash)))
        })?;
        let before = slot.bytes;
        slot.bytes = bytes;
        slot.input_done = true;
        let after = slot.bytes;
        self.hold(after, before);
        self.send_grad_input(a, grad_input);
        Ok(())
    }

    fn backward_weight(&mut self, a: Action) -> Result<(), RankStop> {
        let rank = self.rank;
        let slot = self
            .stashes
            .remove(&(a.stage, a.microbatch))
            .ok_or_else(|| no_stash(rank, a))?;
        if !slot.input_done {
            return Err(self.fail(a, "W before I for this microbatch"));
        }
        self.hold(0, slot.bytes);
        let stage = local_stage(&mut self.stages, a.stage).ok_or_else(|| not_here(rank, a))?;
        self.clock.call(rank, a, &mut self.out.action_seconds, || {
            stage.backward_weight(slot.stash)
        })
    }

    fn backward(&mut self, a: Action) -> Result<(), RankStop> {
        let grad = self.take(grad_edge(a), a)?;
        let rank = self.rank;
        let slot = self
            .stashes
            .remove(&(a.stage, a.microbatch))
            .ok_or_else(|| no_stash(rank, a))?;
        if slot.input_done {
            return Err(self.fail(a, "B after I for this microbatch"));
        }
        self.hold(0, slot.bytes);
        let stage = local_stage(&mut self.stages, a.stage).ok_or_else(|| not_here(rank, a))?;
        let grad_input = self.clock.call(rank, a, &mut self.out.action_seconds, || {
            stage.backward(slot.stash, grad)
        })?;
        self.send_grad_input(a, grad_input);
        Ok(())
    }

    /// Passes an input gradient to the previous stage; the first stage's is dropped.
    fn send_grad_input(&mut self, a: Action, grad_input: Tensor) {
        if a.stage > 0 {
            let edge = Edge {
                flow: Flow::Gradient,
                from: a.stage,
                microbatch: a.microbatch,
            };
            self.deliver(edge, grad_input, a);
        }
    }

    /// Accounts for a stash that now holds `add` bytes instead of `remove`.
    fn hold(&mut self, add: usize, remove: usize) {
        self.held = (self.held + add).saturating_sub(remove);
        self.out.peak_held = self.out.peak_held.max(self.held);
    }

    /// Hands a tensor to its consumer: directly on this rank, else into the outbox until its send.
    fn deliver(&mut self, edge: Edge, tensor: Tensor, producer: Action) {
        let dest = self.schedule.rank_of(edge.to());
        if dest == self.rank {
            let held = Held {
                tensor,
                arrival: None,
            };
            self.mailbox.insert(edge, held);
        } else {
            self.outbox.insert(edge, (tensor, producer));
        }
    }

    /// Sends a tensor to the rank holding its consumer.
    fn send(&mut self, edge: Edge, tensor: Tensor, producer: Action) -> Result<(), RankStop> {
        let dest = self.schedule.rank_of(edge.to());
        let parcel = Parcel {
            edge,
            producer,
            from: self.rank,
            sent_at: self.now(),
            tensor,
        };
        match self.transport.send(dest, parcel) {
            Ok(()) => Ok(()),
            Err(TransportError::Aborted) => Err(RankStop::Aborted),
            Err(TransportError::Lost { message }) => Err(self.internal(message)),
        }
    }

    /// Takes the tensor of `edge` for `consumer`: produced on this rank, or from another rank (the
    /// lowered list posted its receive earlier; the rank waits for the data here).
    fn take(&mut self, edge: Edge, consumer: Action) -> Result<Tensor, RankStop> {
        if edge.from < self.schedule.stages() && self.schedule.rank_of(edge.from) != self.rank {
            self.transfer(edge.recv())?;
        }
        let held = self.mailbox.remove(&edge).ok_or_else(|| {
            self.fail(
                consumer,
                "its input was neither produced on this rank nor received before it (does the \
                 schedule validate?)",
            )
        })?;
        if let Some(a) = held.arrival {
            self.out.transfers.push(Transfer::new(
                a.from,
                self.rank,
                a.producer,
                consumer,
                a.sent_at,
                a.received_at,
                a.bytes as f64,
            ));
        }
        Ok(held.tensor)
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

fn no_stash(rank: usize, a: Action) -> RankStop {
    RankStop::Failed(RuntimeError::ActionFailed {
        rank,
        action: a,
        message: "no stash: the forward of this stage and microbatch has not run".into(),
    })
}
