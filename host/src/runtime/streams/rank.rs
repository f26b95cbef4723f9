//! [`RankStreams`]: one rank's part of a training step on a [`Device`], for a process that runs only
//! that rank (one process per GPU): the rank's stages on the rank's streams, in the program's
//! order, with the data crossing ranks through a device [`Transport`] posted as [`peer_ops`] says.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

mod graph;

use super::after::{self, Hook};
use super::peer::{peer_ops, PeerOp, PostOrder, RankPlan};
use super::stage::bound_home;
use super::step::{run_action, Step};
use super::{check, Device, DeviceError, StreamOp, StreamProgram};
use super::{StreamId, StreamLoss, StreamStage};
use crate::cost::Recompute;
use crate::runtime::clock::panic_message;
use crate::runtime::machine::{end_of_step, optimizer_steps, zero_grads, Ready};
use crate::runtime::{
    Payload, RankOutcome, RankStop, Reducer, RuntimeError, StepEvent, Transport, TransportError,
};
use crate::schedule::deps::Edge;
use crate::schedule::{Action, Schedule};
use crate::timeline::Span;

/// One rank's data for a step of [`RankStreams::step`].
pub struct RankBatch<'a, P: Payload, L> {
    /// Stage 0's microbatch inputs on the rank that holds stage 0 (empty elsewhere).
    pub inputs: Vec<P>,
    /// The microbatch targets on the rank that holds the last stage (may be empty elsewhere).
    pub targets: &'a [P],
    /// The loss after the last stage.
    pub loss: &'a L,
    /// The shape of the data of an edge that crosses into this rank (what a receive is posted
    /// with: a link must know the size before the data comes).
    pub shape: &'a dyn Fn(Edge) -> Vec<usize>,
}

/// Runs one rank's part of each training step of a [`Schedule`] on a [`Device`] that holds only
/// that rank's stages and streams.
///
/// Built once: the whole [`StreamProgram`] is built and [`check`](fn@check)ed (every process knows the whole
/// schedule), the rank's part is taken with [`peer_ops`] (receives in the sender's order), and the
/// device makes the rank's streams. Each [`step`](RankStreams::step) zeroes the gradients, enqueues
/// the rank's runs, lane events, sends and receives from the calling thread, synchronises the
/// device and the link, and agrees with the other ranks ([`Transport::finish`]): the step succeeds
/// on every rank or on none, and ends with the rank's gradients ready for
/// [`optimizer_step`](RankStreams::optimizer_step). It returns the same [`RankOutcome`] as the threaded
/// [`run_rank`](crate::runtime::run_rank), so [`assemble`](crate::runtime::assemble) turns the
/// outcomes of all ranks into a step report.
pub struct RankStreams<D: Device, S: StreamStage<D::Stream, D::Payload>> {
    schedule: Schedule,
    rank: usize,
    plan: RankPlan,
    device: D,
    /// `(global stage, stage)`, the rank's stages.
    stages: Vec<(usize, S)>,
    /// Global stage index -> position in `stages`.
    index: HashMap<usize, usize>,
    /// Whether the stages hold a finished step's gradients, not yet applied.
    ready: Ready,
    /// Each global stage's recomputation mode (empty: none).
    recompute: Vec<Recompute>,
    /// The data-parallel reduction, if any ([`set_reducer`](RankStreams::set_reducer)).
    reducer: Option<Arc<Reducer>>,
    /// The captured step, if any ([`capture`](RankStreams::capture)).
    graph: Option<graph::RankCaptured<D>>,
}

/// A step enqueued: its state and the origin of its timing marks.
type Enqueued<D, T> = (Step<D, T>, <D as Device>::Mark);

/// What the walk over the rank's ops leaves: events by program index, posted receives by edge.
struct Walk<D: Device> {
    events: HashMap<usize, D::Event>,
    posted: HashMap<Edge, (D::Payload, D::Event)>,
    /// Whether each run is timed (not while capturing: a mark in a graph records nothing
    /// readable).
    timed: bool,
}

impl<D: Device, S: StreamStage<D::Stream, D::Payload>> RankStreams<D, S> {
    /// The runner of rank `rank` of `schedule` over its `stages` (`(global index, stage)`, exactly
    /// the stages the schedule places on the rank) on `device`, receives posted in `order`
    /// ([`PostOrder::Sender`] unless a test shows what the other order breaks).
    pub fn new(
        schedule: Schedule,
        rank: usize,
        stages: Vec<(usize, S)>,
        mut device: D,
        order: PostOrder,
    ) -> Result<Self, RuntimeError> {
        crate::runtime::check::check_run(&schedule, schedule.stages())?;
        let expected: Vec<usize> = (0..schedule.stages())
            .filter(|&s| schedule.rank_of(s) == rank)
            .collect();
        let mut got: Vec<usize> = stages.iter().map(|(s, _)| *s).collect();
        got.sort_unstable();
        if got != expected || rank >= schedule.ranks {
            return Err(RuntimeError::RankStages {
                schedule: schedule.name.clone(),
                rank,
                expected,
                got,
            });
        }
        let program = StreamProgram::build(&schedule).map_err(RuntimeError::Streams)?;
        check(&program, &schedule).map_err(RuntimeError::Streams)?;
        let plan = peer_ops(&program, rank, order);
        device.make_streams(&plan.streams).map_err(device_error)?;
        let index = stages
            .iter()
            .enumerate()
            .map(|(i, (s, _))| (*s, i))
            .collect();
        Ok(RankStreams {
            schedule,
            rank,
            plan,
            device,
            stages,
            index,
            ready: Ready::default(),
            recompute: Vec::new(),
            reducer: None,
            graph: None,
        })
    }

    /// Runs stage `s` (of those this rank holds) with recomputation `modes[s]` from the next step on (a stage past the end
    /// of `modes` without): a stage with [`Recompute::Full`] keeps only (a copy of) its input
    /// from `F` to its backward, which runs the forward again first. The losses, gradients and
    /// parameters are those of a run without it, bit for bit (the forward is deterministic); the
    /// peak held bytes are lower where the stash is larger than the input.
    ///
    /// The input's copy is [`Device::copy`], on the forward's stream.
    pub fn set_recompute(&mut self, modes: &[Recompute]) {
        self.recompute = modes.to_vec();
    }

    /// The rank's plan.
    pub fn plan(&self) -> &RankPlan {
        &self.plan
    }

    /// The rank's stages, `(global index, stage)`.
    pub fn stages(&self) -> &[(usize, S)] {
        &self.stages
    }

    /// The rank's stages, for changing between steps.
    pub fn stages_mut(&mut self) -> &mut [(usize, S)] {
        &mut self.stages
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// Sets (or clears) the data-parallel gradient reduction over the replicas of this rank
    /// (the threaded runners' [`Reducer`]): each step, once the device and the link completed and
    /// before the ranks agree on the step's end, the rank's stages lend their gradients on the host
    /// ([`StreamStage::with_gradients`]) to `reducer`, in the order of
    /// [`stages`](RankStreams::stages). Every replica of the rank reduces the same stages in the
    /// same order, so collectives (an MPI all-reduce) pair up.
    pub fn set_reducer(&mut self, reducer: Option<Arc<Reducer>>) {
        self.reducer = reducer;
    }

    /// Runs the rank's part of one training step over `peer`. Never panics on a failure: the
    /// outcome's `result` says how the rank ended (a failure here also aborts the peers).
    pub fn step<L: StreamLoss<D::Stream, D::Payload>, P: Transport<D::Payload, D::Event>>(
        &mut self,
        batch: RankBatch<'_, D::Payload, L>,
        peer: &mut P,
    ) -> RankOutcome {
        self.run_step(batch, peer, None)
    }

    /// [`step`](RankStreams::step), telling `hook` of each of the rank's actions and of each of
    /// its stages whose gradients are final: the threaded runners' [`StepEvent`]s, told once the
    /// device synchronised, in the rank's list order, with the times of the device's timing marks
    /// (on CUDA the streams' event times), before the reduction. A panic in the hook fails the
    /// rank's step ([`RuntimeError::HookPanicked`]).
    pub fn step_with<L, P, H>(
        &mut self,
        batch: RankBatch<'_, D::Payload, L>,
        peer: &mut P,
        hook: H,
    ) -> RankOutcome
    where
        L: StreamLoss<D::Stream, D::Payload>,
        P: Transport<D::Payload, D::Event>,
        H: Fn(StepEvent) + Sync,
    {
        self.run_step(batch, peer, Some(&hook))
    }

    fn run_step<L: StreamLoss<D::Stream, D::Payload>, P: Transport<D::Payload, D::Event>>(
        &mut self,
        batch: RankBatch<'_, D::Payload, L>,
        peer: &mut P,
        hook: Hook<'_>,
    ) -> RankOutcome {
        let rank = self.rank;
        let enqueued = catch_unwind(AssertUnwindSafe(|| self.enqueue(batch, peer)))
            .unwrap_or_else(|p| Err(panicked(rank, &*p)));
        self.settle(enqueued, peer, |me, step, out| me.report(step, out, hook))
    }

    /// Ends a step whose work was enqueued (or failed to be): aborts the peers on a failure, waits
    /// for the device and the link, fills the outcome with `done` when both completed, and agrees
    /// with the other ranks on the step's end.
    fn settle<T, P: Transport<D::Payload, D::Event>>(
        &mut self,
        enqueued: Result<T, RuntimeError>,
        peer: &mut P,
        done: impl FnOnce(&mut Self, T, &mut RankOutcome) -> Result<(), RankStop>,
    ) -> RankOutcome {
        let mut out = RankOutcome::empty(Ok(()));
        if enqueued.is_err() {
            peer.abort();
        }
        let device = self.device.synchronize();
        let link = peer.complete();
        let result = match (enqueued, device, link) {
            (Err(e), _, _) => Err(RankStop::Failed(e)),
            (Ok(_), _, Err(error)) if error.is_cause() => Err(self.peer_failed(error)),
            (Ok(_), _, Err(TransportError::Aborted)) => Err(RankStop::Aborted),
            (Ok(_), Err(e), _) => Err(RankStop::Failed(device_error(e))),
            (Ok(_), Ok(()), Err(error)) => Err(self.peer_failed(error)),
            (Ok(step), Ok(()), Ok(())) => done(self, step, &mut out),
        };
        out.result = end_of_step(result, peer, P::abort, P::finish);
        self.ready.stepped(out.result.is_ok());
        out
    }

    /// Applies the rank's stages' optimizer steps (host calls) to the gradients the last
    /// [`step`](RankStreams::step) left; every rank of the job calls it after the same step.
    /// Refused with [`RuntimeError::NoGradients`] when no step succeeded since the last optimizer
    /// step.
    pub fn optimizer_step(&mut self) -> Result<(), RuntimeError> {
        self.ready.take()?;
        let rank = self.rank;
        let home = self.home();
        let stages = self.stages.iter_mut().map(|(s, st)| (*s, st));
        let mut stages = bound_home(&self.device, stages, |_| home)?;
        optimizer_steps(stages.iter_mut().map(|(s, b)| (*s, b)), |_| rank)
    }

    /// The rank's main stream (lane 0), where the host calls of its stages run.
    fn home(&self) -> Option<usize> {
        let main = StreamId {
            rank: self.rank,
            lane: 0,
        };
        self.plan.streams.iter().position(|&id| id == main)
    }

    fn peer_failed(&self, error: TransportError) -> RankStop {
        RankStop::Failed(RuntimeError::Peer {
            rank: self.rank,
            error: Box::new(error),
        })
    }

    /// Zeroes the gradients and walks the plan once; the step state and the origin mark.
    fn enqueue<L: StreamLoss<D::Stream, D::Payload>, P: Transport<D::Payload, D::Event>>(
        &mut self,
        mut batch: RankBatch<'_, D::Payload, L>,
        peer: &mut P,
    ) -> Result<Enqueued<D, S::Stash>, RuntimeError> {
        self.check_batch(batch.inputs.len(), batch.targets.len())?;
        let rank = self.rank;
        self.zero_grads()?;
        let inputs = std::mem::take(&mut batch.inputs);
        let mut step = Step::one_rank(&self.schedule, rank, inputs, &self.recompute);
        let origin = self.device.mark(0).map_err(device_error)?;
        self.walk(&mut step, &batch, peer, true)?;
        Ok((step, origin))
    }

    /// Enqueues every op of the plan, each run between timing marks when `timed`; what the walk
    /// leaves (its events, kept alive by the caller while it needs them).
    fn walk<L: StreamLoss<D::Stream, D::Payload>, P: Transport<D::Payload, D::Event>>(
        &mut self,
        step: &mut Step<D, S::Stash>,
        batch: &RankBatch<'_, D::Payload, L>,
        peer: &mut P,
        timed: bool,
    ) -> Result<Walk<D>, RuntimeError> {
        let mut walk = Walk {
            events: HashMap::new(),
            posted: HashMap::new(),
            timed,
        };
        for i in 0..self.plan.ops.len() {
            let op = self.plan.ops[i];
            self.op(op, step, &mut walk, batch, peer)?;
        }
        Ok(walk)
    }

    /// Zeroes the gradients of the rank's stages (on its main stream).
    fn zero_grads(&mut self) -> Result<(), RuntimeError> {
        let (rank, home) = (self.rank, self.home());
        let stages = self.stages.iter_mut().map(|(s, st)| (*s, st));
        let mut stages = bound_home(&self.device, stages, |_| home)?;
        zero_grads(stages.iter_mut().map(|(s, b)| (*s, b)), |_| rank)
    }

    /// Enqueues one op of the plan.
    fn op<L: StreamLoss<D::Stream, D::Payload>, P: Transport<D::Payload, D::Event>>(
        &mut self,
        op: PeerOp,
        step: &mut Step<D, S::Stash>,
        walk: &mut Walk<D>,
        batch: &RankBatch<'_, D::Payload, L>,
        peer: &mut P,
    ) -> Result<(), RuntimeError> {
        let link = |error: TransportError| RuntimeError::Peer {
            rank: self.rank,
            error: Box::new(error),
        };
        match op {
            PeerOp::Local(StreamOp::Run { stream, action }) => {
                let mark = |d: &mut D| d.mark(stream).map_err(device_error);
                let start = walk.timed.then(|| mark(&mut self.device)).transpose()?;
                let Some(&at) = self.index.get(&action.stage) else {
                    return Err(self.internal(format!("{action} is not on this rank")));
                };
                let stage = &mut self.stages[at].1;
                run_action(
                    &self.schedule,
                    &self.device,
                    stream,
                    stage,
                    step,
                    action,
                    batch.targets,
                    batch.loss,
                )?;
                if let Some(start) = start {
                    let end = mark(&mut self.device)?;
                    step.marks.push((action, start, end));
                }
            }
            PeerOp::Local(StreamOp::Record { stream, event }) => {
                let e = self.device.record(stream).map_err(device_error)?;
                walk.events.insert(event, e);
            }
            PeerOp::Local(StreamOp::Wait { stream, event }) => {
                let e = walk.events.get(&event).ok_or_else(|| {
                    self.internal(format!("event {event} waited on before it was recorded"))
                })?;
                self.device.wait(stream, e).map_err(device_error)?;
            }
            PeerOp::Send { stream, edge, to } => {
                let data = step
                    .machine(self.rank)
                    .and_then(|m| m.remove(edge))
                    .ok_or_else(|| {
                        self.internal(format!("{} has nothing to send yet", edge.send()))
                    })?;
                let after = self.device.record(stream).map_err(device_error)?;
                peer.send(edge, to, data, after).map_err(link)?;
            }
            PeerOp::Post { edge, from } => {
                let shape = (batch.shape)(edge);
                let posted = peer.recv(edge, from, Some(&shape)).map_err(link)?;
                walk.posted.insert(edge, posted);
            }
            PeerOp::Ready { stream, edge } => {
                let (data, done) = walk.posted.remove(&edge).ok_or_else(|| {
                    self.internal(format!("{} is consumed before it is posted", edge.recv()))
                })?;
                self.device.wait(stream, &done).map_err(device_error)?;
                step.arrived(&self.schedule, edge, data);
            }
        }
        Ok(())
    }

    /// Refuses a batch that is not one input (on stage 0's rank) and one target (on the last
    /// stage's rank) per microbatch.
    fn check_batch(&self, inputs: usize, targets: usize) -> Result<(), RuntimeError> {
        let m = self.schedule.microbatches;
        let first = self.index.contains_key(&0);
        let last = self.index.contains_key(&(self.schedule.stages() - 1));
        if (first && inputs != m) || (last && targets != m) {
            return Err(RuntimeError::BatchCount {
                microbatches: m,
                inputs,
                targets,
            });
        }
        Ok(())
    }

    /// Fills `out` from a synchronised step (losses, spans, per-action seconds, peak memory),
    /// tells the hook and reduces the gradients.
    fn report(
        &mut self,
        (mut step, origin): Enqueued<D, S::Stash>,
        out: &mut RankOutcome,
        hook: Hook<'_>,
    ) -> Result<(), RankStop> {
        let fail = |e: DeviceError| RankStop::Failed(device_error(e));
        for (k, l) in step.losses(&self.schedule).into_iter().enumerate() {
            if let Some(l) = l {
                let v = D::Payload::loss_value(l).map_err(|e| fail(e.into()))?;
                out.losses.push((k, v));
            }
        }
        let mut times: HashMap<Action, (f64, f64)> = HashMap::new();
        let mut timed = Vec::with_capacity(step.marks.len());
        for (a, start, end) in &step.marks {
            let s = self.device.seconds(&origin, start).map_err(fail)?;
            let e = self.device.seconds(&origin, end).map_err(fail)?;
            times.insert(*a, (s, e));
            out.action_seconds.push((*a, e - s));
            timed.push((*a, s, e));
        }
        for item in self.schedule.actions[self.rank]
            .iter()
            .filter(|i| i.is_compute())
        {
            let (mut s, mut e) = (f64::INFINITY, 0.0f64);
            for &(a0, a1) in item.actions().filter_map(|a| times.get(&a)) {
                s = s.min(a0);
                e = e.max(a1);
            }
            if s.is_finite() {
                out.spans.push(Span::new(*item, s, e));
            }
        }
        out.peak_held = step.machine(self.rank).map_or(0, |m| m.peak());
        after::tell(&self.schedule, hook, &timed)?;
        self.reduce()
    }

    /// The data-parallel reduction of the rank's gradients, if any (after the device completed).
    fn reduce(&mut self) -> Result<(), RankStop> {
        let home = self.home();
        let stages = self.stages.iter_mut().map(|(s, st)| (*s, st));
        let reducer = self.reducer.as_deref();
        after::reduce(&self.schedule, &self.device, stages, |_| home, reducer)?;
        Ok(())
    }

    fn internal(&self, message: String) -> RuntimeError {
        RuntimeError::Internal {
            rank: self.rank,
            message,
        }
    }
}

fn device_error(e: DeviceError) -> RuntimeError {
    RuntimeError::Device { message: e.message }
}

/// The error of a panic while enqueuing rank `rank`'s step.
fn panicked(rank: usize, p: &(dyn std::any::Any + Send)) -> RuntimeError {
    RuntimeError::Internal {
        rank,
        message: format!("the runtime panicked: {}", panic_message(p)),
    }
}
