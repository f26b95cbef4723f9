//! [`StreamExecutor`]: runs training steps of a schedule on a [`Device`] from one host thread.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::after::{self, Hook, Timed};
use super::program::lanes;
use super::stage::bound_home;
use super::step::{run_action, Step};
use super::{check, Device, EventRole, StreamId, StreamOp, StreamProgram};
use super::{StreamLoss, StreamStage};
use crate::cost::Recompute;
use crate::runtime::hook::{EachRank, Events};
use crate::runtime::machine::{optimizer_steps, zero_grads, Ready};
use crate::runtime::{Payload, Reducer, RuntimeError, StageError, StepEvent, StepReport};
use crate::schedule::deps::{Edge, Flow};
use crate::schedule::{Action, Op, Schedule};
use crate::timeline::{Source, Timeline, Transfer};

mod evaluate;
mod graph;

/// Runs training steps of a [`Schedule`] over stages whose work a [`Device`] runs on streams.
///
/// Built once per schedule: the [`StreamProgram`] is built and [`check`](fn@check)ed, the device makes the
/// streams. Each [`step`](StreamExecutor::step) then enqueues the whole step from the calling thread
/// (stage calls, records, waits and timing marks), synchronises once and returns the same
/// [`StepReport`] as the threaded [`Executor`](crate::runtime::Executor), with the timeline measured
/// by the device's marks. The step ends with the gradients ready; the optimizer is the trainer's
/// call, [`optimizer_step`](StreamExecutor::optimizer_step).
///
/// ```
/// use pipefill_host::runtime::streams::{CpuStreams, Pending, StreamExecutor};
/// use pipefill_host::runtime::{Stage, StageError, Tensor};
/// use pipefill_host::schedule::{families, Params};
/// # struct Twice;
/// # impl Stage for Twice {
/// #     type Stash = ();
/// #     fn forward(&mut self, mut x: Tensor) -> Result<(Tensor, ()), StageError> { x.scale(2.0); Ok((x, ())) }
/// #     fn backward_input(&mut self, _: &mut (), mut g: Tensor) -> Result<Tensor, StageError> { g.scale(2.0); Ok(g) }
/// #     fn backward_weight(&mut self, _: ()) -> Result<(), StageError> { Ok(()) }
/// #     fn held_bytes(&self, _: &()) -> usize { 0 }
/// #     fn zero_grad(&mut self) {}
/// #     fn optimizer_step(&mut self) -> Result<(), StageError> { Ok(()) }
/// # }
/// let schedule = families::generate("1f1b", &Params::new(2, 2)).unwrap();
/// let device = CpuStreams::new();
/// let stages = vec![device.stage(Twice), device.stage(Twice)];
/// let mut ex = StreamExecutor::new(schedule, stages, device).unwrap();
/// let loss = ex.device().loss(|y: &Tensor, _: &Tensor| Ok((y.data()[0], y.clone())));
/// let x = || Pending::ready(Tensor::new(vec![1, 1], vec![1.5]).unwrap());
/// let report = ex.step(vec![x(), x()], &[x(), x()], &loss).unwrap();
/// assert_eq!(report.losses, vec![6.0, 6.0]); // 1.5 * 2 * 2
/// ```
pub struct StreamExecutor<D: Device, S: StreamStage<D::Stream, D::Payload>> {
    schedule: Schedule,
    program: StreamProgram,
    /// The evaluation's program: the schedule's forwards only, on the training program's streams.
    evaluation: StreamProgram,
    device: D,
    stages: Vec<S>,
    /// Host seconds the last step spent enqueuing (or refreshing and replaying) its work.
    enqueue_seconds: f64,
    /// The captured step, once [`capture`](StreamExecutor::capture) ran (dropped after the device).
    graph: Option<graph::Captured<D>>,
    /// Whether the stages hold a finished step's gradients, not yet applied.
    ready: Ready,
    /// Each stage's recomputation mode (empty: none).
    recompute: Vec<Recompute>,
    /// The data-parallel reduction, if any ([`set_reducer`](StreamExecutor::set_reducer)).
    reducer: Option<Arc<Reducer>>,
}

impl<D: Device, S: StreamStage<D::Stream, D::Payload>> StreamExecutor<D, S> {
    /// An executor for `schedule` over `stages` (global order) on `device`. Refuses a schedule that
    /// does not validate, a stage count that does not fit, and a program [`check`](fn@check) refuses.
    pub fn new(schedule: Schedule, stages: Vec<S>, mut device: D) -> Result<Self, RuntimeError> {
        crate::runtime::check::check_run(&schedule, stages.len())?;
        let program = StreamProgram::build(&schedule).map_err(RuntimeError::Streams)?;
        check(&program, &schedule).map_err(RuntimeError::Streams)?;
        let evaluation = evaluate::program(&schedule, &program)?;
        device
            .make_streams(&program.streams)
            .map_err(device_error)?;
        Ok(StreamExecutor {
            schedule,
            program,
            evaluation,
            device,
            stages,
            enqueue_seconds: 0.0,
            graph: None,
            ready: Ready::default(),
            recompute: Vec::new(),
            reducer: None,
        })
    }

    /// Runs stage `s` with recomputation `modes[s]` from the next step on (and in a step captured after) (a stage past the end
    /// of `modes` without): a stage with [`Recompute::Full`] keeps only (a copy of) its input
    /// from `F` to its backward, which runs the forward again first. The losses, gradients and
    /// parameters are those of a run without it, bit for bit (the forward is deterministic); the
    /// peak held bytes are lower where the stash is larger than the input.
    ///
    /// The input's copy is [`Device::copy`], on the forward's stream.
    pub fn set_recompute(&mut self, modes: &[Recompute]) {
        self.recompute = modes.to_vec();
    }

    /// The program each step enqueues.
    pub fn program(&self) -> &StreamProgram {
        &self.program
    }

    /// The stages, in global order.
    pub fn stages(&self) -> &[S] {
        &self.stages
    }

    /// The stages, in global order, for changing between steps.
    pub fn stages_mut(&mut self) -> &mut [S] {
        &mut self.stages
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device (an index among those the [`Device`] drives) that stage `stage` runs on: where
    /// its rank's main stream is. Stage 0's is where a step's inputs belong, the last stage's is
    /// where its targets belong (the executor refuses them elsewhere with
    /// [`RuntimeError::WrongDevice`]). `None` for a stage the schedule does not have.
    pub fn stage_device(&self, stage: usize) -> Option<usize> {
        if stage >= self.schedule.stages() {
            return None;
        }
        let rank = self.schedule.rank_of(stage);
        let stream = self.program.stream(StreamId { rank, lane: 0 })?;
        Some(self.device.stream_device(stream))
    }

    /// Sets (or clears) the data-parallel gradient reduction, the threaded
    /// [`Executor::set_reducer`](crate::runtime::Executor::set_reducer)'s [`Reducer`]: every step
    /// (plain, captured or replayed) ends, once the device synchronised, with each stage's
    /// gradients lent on the host ([`StreamStage::with_gradients`]) to `reducer`, stage by stage
    /// in stage order, which leaves in them what every replica's optimizer step applies. A
    /// reducer that waits for other replicas (the runtime's `AllReduce`) needs each replica's
    /// steps on a thread of its own.
    pub fn set_reducer(&mut self, reducer: Option<Arc<Reducer>>) {
        self.reducer = reducer;
    }

    /// Runs one training step: `inputs[k]` and `targets[k]` are microbatch `k`'s input and target.
    pub fn step<L: StreamLoss<D::Stream, D::Payload>>(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: &[D::Payload],
        loss: &L,
    ) -> Result<StepReport, RuntimeError> {
        self.train_step(inputs, targets, loss, None)
    }

    /// [`step`](StreamExecutor::step), telling `hook` of each action and of each stage whose
    /// gradients are final: the threaded [`Executor::step_with`](crate::runtime::Executor::step_with)'s
    /// [`StepEvent`]s. On the stream path they are told once the device synchronised (the host
    /// only enqueued before), on the calling thread, each rank's in its list's order, with the
    /// times of the device's timing marks (the report's timeline: on CUDA the streams' event
    /// times, not the host's enqueue times). A panic in the hook is
    /// [`RuntimeError::HookPanicked`]. Captured and replayed steps tell no hook (nothing is timed
    /// inside a graph).
    pub fn step_with<L: StreamLoss<D::Stream, D::Payload>, H: Fn(StepEvent) + Sync>(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: &[D::Payload],
        loss: &L,
        hook: H,
    ) -> Result<StepReport, RuntimeError> {
        self.train_step(inputs, targets, loss, Some(&hook))
    }

    /// [`step_with`](StreamExecutor::step_with) with an `FnMut` hook of its own for each rank,
    /// `hook_of(rank)` ([`Executor::step_with_each`](crate::runtime::Executor::step_with_each)).
    pub fn step_with_each<L, F, H>(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: &[D::Payload],
        loss: &L,
        hook_of: F,
    ) -> Result<StepReport, RuntimeError>
    where
        L: StreamLoss<D::Stream, D::Payload>,
        F: FnMut(usize) -> H,
        H: FnMut(StepEvent) + Send,
    {
        let hooks = EachRank::new(self.schedule.ranks, hook_of);
        self.step_with(inputs, targets, loss, |event| hooks.tell(event))
    }

    /// [`step`](StreamExecutor::step), also returning each rank's [`StepEvent`]s in its list's
    /// order (`events[rank]`), as [`Executor::step_with_events`](crate::runtime::Executor::step_with_events).
    pub fn step_with_events<L: StreamLoss<D::Stream, D::Payload>>(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: &[D::Payload],
        loss: &L,
    ) -> Result<(StepReport, Vec<Vec<StepEvent>>), RuntimeError> {
        let events = Events::new();
        let report = self.step_with_each(inputs, targets, loss, |_| events.hook())?;
        Ok((report, events.by_rank(self.schedule.ranks)))
    }

    /// A plain step, its hook told and its gradients reduced after the device synchronised.
    fn train_step<L: StreamLoss<D::Stream, D::Payload>>(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: &[D::Payload],
        loss: &L,
        hook: Hook<'_>,
    ) -> Result<StepReport, RuntimeError> {
        self.ready.stepped(false);
        self.check_batch(inputs.len(), targets.len())?;
        let wall = Instant::now();
        self.zero_grads()?;
        let mut step = self.new_step(inputs);
        let origin = self.device.origin().map_err(device_error)?;
        self.enqueue_ops(&mut step, targets, loss, true)?;
        self.enqueue_seconds = wall.elapsed().as_secs_f64();
        self.device.synchronize().map_err(device_error)?;
        let (mut report, timed) = self.report(Kind::Train, step, &origin)?;
        after::tell(&self.schedule, hook, &timed)?;
        self.reduce()?;
        report.seconds = wall.elapsed().as_secs_f64();
        self.ready.stepped(true);
        Ok(report)
    }

    /// The data-parallel reduction of every stage's gradients, when a reducer is set.
    fn reduce(&mut self) -> Result<(), RuntimeError> {
        let (schedule, program) = (&self.schedule, &self.program);
        let home = |s| home_stream(schedule, program, s);
        let stages = self.stages.iter_mut().enumerate();
        let reducer = self.reducer.as_deref();
        after::reduce(schedule, &self.device, stages, home, reducer)
    }

    /// Applies every stage's optimizer step (host calls, in stage order) to the gradients the last
    /// step (plain, captured or replayed) left, after the trainer read or changed them if it
    /// wants to. Refused with [`RuntimeError::NoGradients`] when no step succeeded since the last
    /// optimizer step; the first stage that fails is named.
    pub fn optimizer_step(&mut self) -> Result<(), RuntimeError> {
        self.ready.take()?;
        let (schedule, program) = (&self.schedule, &self.program);
        let home = |s| home_stream(schedule, program, s);
        let mut stages = bound_home(&self.device, self.stages.iter_mut().enumerate(), home)?;
        optimizer_steps(stages.iter_mut().map(|(s, b)| (*s, b)), |s| {
            schedule.rank_of(s)
        })
    }

    /// Host seconds the last step spent enqueuing its work before waiting for the device: with
    /// [`step`](StreamExecutor::step), every stage call, record, wait and timing mark; with
    /// [`replay`](StreamExecutor::replay), refreshing the inputs and launching the captured step.
    pub fn enqueue_seconds(&self) -> f64 {
        self.enqueue_seconds
    }

    /// The number of actions a step runs (what [`enqueue_seconds`](StreamExecutor::enqueue_seconds)
    /// is divided by for a time per action).
    pub fn actions(&self) -> usize {
        self.program
            .ops
            .iter()
            .filter(|o| matches!(o, StreamOp::Run { .. }))
            .count()
    }

    /// Every stage's zero-grad (host calls on the stage's main stream, before the step's work is
    /// enqueued).
    fn zero_grads(&mut self) -> Result<(), RuntimeError> {
        let (schedule, program) = (&self.schedule, &self.program);
        let home = |s| home_stream(schedule, program, s);
        let mut stages = bound_home(&self.device, self.stages.iter_mut().enumerate(), home)?;
        zero_grads(stages.iter_mut().map(|(s, b)| (*s, b)), |s| {
            schedule.rank_of(s)
        })
    }

    /// Refuses a batch whose size is not the schedule's microbatch count.
    fn check_batch(&self, inputs: usize, targets: usize) -> Result<(), RuntimeError> {
        let m = self.schedule.microbatches;
        if inputs != m || targets != m {
            return Err(RuntimeError::BatchCount {
                microbatches: m,
                inputs,
                targets,
            });
        }
        Ok(())
    }

    /// The empty state of a step whose microbatch inputs are `inputs`.
    fn new_step(&self, inputs: Vec<D::Payload>) -> Step<D, S::Stash> {
        Step::all_ranks(&self.schedule, inputs, &self.recompute)
    }

    /// Walks the program once (the evaluation's when `kind` says so): runs each action on its
    /// stream (between timing marks when `timed`), records and waits on events.
    fn enqueue_ops<L: StreamLoss<D::Stream, D::Payload>>(
        &mut self,
        step: &mut Step<D, S::Stash>,
        targets: &[D::Payload],
        loss: &L,
        timed: bool,
    ) -> Result<Vec<D::Event>, RuntimeError> {
        self.enqueue_program(Kind::Train, step, targets, loss, timed)
    }

    /// [`enqueue_ops`](Self::enqueue_ops) over the program of `kind`.
    fn enqueue_program<L: StreamLoss<D::Stream, D::Payload>>(
        &mut self,
        kind: Kind,
        step: &mut Step<D, S::Stash>,
        targets: &[D::Payload],
        loss: &L,
        timed: bool,
    ) -> Result<Vec<D::Event>, RuntimeError> {
        let count = self.program_of(kind).ops.len();
        let mut events = Vec::with_capacity(self.program_of(kind).events.len());
        for i in 0..count {
            match self.program_of(kind).ops[i] {
                StreamOp::Run { stream, action } if timed => {
                    let start = self.device.mark(stream).map_err(device_error)?;
                    self.run(step, stream, action, targets, loss)?;
                    let end = self.device.mark(stream).map_err(device_error)?;
                    step.marks.push((action, start, end));
                }
                StreamOp::Run { stream, action } => {
                    self.run(step, stream, action, targets, loss)?;
                }
                StreamOp::Record { stream, .. } => {
                    events.push(self.device.record(stream).map_err(device_error)?);
                }
                StreamOp::Wait { stream, event } => {
                    let e = events.get(event).ok_or_else(|| RuntimeError::Internal {
                        rank: self.program.streams[stream].rank,
                        message: format!("event {event} waited on before it was recorded"),
                    })?;
                    self.device.wait(stream, e).map_err(device_error)?;
                    self.adopt(kind, step, stream, event)?;
                }
            }
        }
        Ok(events)
    }

    /// After `stream` waited for event `event`: when the event is a transfer between ranks, the
    /// transferred payload (in the mailbox since its producer ran) is made usable on `stream`
    /// ([`Device::adopt`]: a peer copy when the ranks sit on different devices). A missing payload
    /// is left for its consumer to report.
    fn adopt(
        &mut self,
        kind: Kind,
        step: &mut Step<D, S::Stash>,
        stream: usize,
        event: usize,
    ) -> Result<(), RuntimeError> {
        let Some(&EventRole::Transfer(edge)) = self.program_of(kind).events.get(event) else {
            return Ok(());
        };
        let Some(machine) = step.machine(self.schedule.rank_of(edge.to())) else {
            return Ok(());
        };
        if let Some(payload) = machine.remove(edge) {
            let adopted = self.device.adopt(stream, payload).map_err(device_error)?;
            machine.put(edge, adopted);
        }
        Ok(())
    }
    /// Enqueues one action on `stream`: takes its input (refused when it lives on another device),
    /// calls the stage, holds the stash, hands on the output.
    fn run<L: StreamLoss<D::Stream, D::Payload>>(
        &mut self,
        step: &mut Step<D, S::Stash>,
        stream: usize,
        a: Action,
        targets: &[D::Payload],
        loss: &L,
    ) -> Result<(), RuntimeError> {
        run_action(
            &self.schedule,
            &self.device,
            stream,
            &mut self.stages[a.stage],
            step,
            a,
            targets,
            loss,
        )
    }

    /// The step report (its `seconds` left to the caller): losses read back, the timeline from
    /// the marks; and each action's start and end, in enqueue order.
    fn report(
        &self,
        kind: Kind,
        mut step: Step<D, S::Stash>,
        origin: &D::Mark,
    ) -> Result<(StepReport, Timed), RuntimeError> {
        let by_microbatch = step.losses(&self.schedule);
        let mut losses = Vec::with_capacity(by_microbatch.len());
        for (k, l) in by_microbatch.into_iter().enumerate() {
            let l = l.ok_or_else(|| RuntimeError::Internal {
                rank: self.schedule.rank_of(self.schedule.stages() - 1),
                message: format!("no loss for microbatch {k}"),
            })?;
            losses.push(D::Payload::loss_value(l).map_err(|e| device_error(e.into()))?);
        }
        let mut times: HashMap<Action, (f64, f64)> = HashMap::new();
        let mut action_seconds = Vec::with_capacity(step.marks.len());
        let mut timed = Vec::with_capacity(step.marks.len());
        for (a, start, end) in &step.marks {
            let s = self.device.seconds(origin, start).map_err(device_error)?;
            let e = self.device.seconds(origin, end).map_err(device_error)?;
            times.insert(*a, (s, e));
            action_seconds.push((*a, e - s));
            timed.push((*a, s, e));
        }
        let timeline = self.timeline(kind, &times, &step.bytes);
        let loss = losses.iter().sum::<f32>() / losses.len().max(1) as f32;
        let report = StepReport {
            loss,
            losses,
            timeline,
            peak_held_bytes: step.peaks(),
            seconds: 0.0,
            action_seconds,
            rebuild_seconds: Vec::new(),
        };
        Ok((report, timed))
    }

    fn timeline(
        &self,
        kind: Kind,
        times: &HashMap<Action, (f64, f64)>,
        bytes: &HashMap<Edge, usize>,
    ) -> Timeline {
        let mut t = Timeline::new(
            self.schedule.name.clone(),
            Source::Measured,
            self.schedule.ranks,
        );
        // An evaluation timed the forwards of the schedule's forward order, overlapped pairs'
        // forwards among them: its spans are those forwards alone.
        let forwards;
        let lists = match kind {
            Kind::Train => &self.schedule.actions,
            Kind::Evaluate => {
                forwards = crate::schedule::forward_only::forward_only(&self.schedule);
                &forwards.actions
            }
        };
        for (rank, list) in lists.iter().enumerate() {
            for item in list.iter().filter(|i| i.is_compute()) {
                let (mut s, mut e) = (f64::INFINITY, 0.0f64);
                for a in item.actions() {
                    if let Some(&(a0, a1)) = times.get(&a) {
                        s = s.min(a0);
                        e = e.max(a1);
                    }
                }
                if s.is_finite() {
                    t.push(rank, *item, s, e);
                }
            }
        }
        let lanes = lanes(&self.schedule);
        for role in &self.program_of(kind).events {
            let EventRole::Transfer(edge) = role else {
                continue;
            };
            let consumer = super::program::consumer(edge, &lanes);
            let producer = match edge.flow {
                Flow::Activation => edge.producer(),
                Flow::Gradient if times.contains_key(&edge.producer()) => edge.producer(),
                Flow::Gradient => Action::new(Op::B, edge.from, edge.microbatch),
            };
            if let (Some(&(_, sent)), Some(&(got, _))) =
                (times.get(&producer), times.get(&consumer))
            {
                t.transfers.push(Transfer::new(
                    self.schedule.rank_of(edge.from),
                    self.schedule.rank_of(edge.to()),
                    producer,
                    consumer,
                    sent,
                    got.max(sent),
                    bytes.get(edge).copied().unwrap_or(0) as f64,
                ));
            }
        }
        t
    }
}

/// Which of an executor's programs a walk runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The training step's.
    Train,
    /// The evaluation's (forwards only).
    Evaluate,
}

/// The main stream of stage `s`'s rank in `program`: where its host calls run.
fn home_stream(schedule: &Schedule, program: &StreamProgram, s: usize) -> Option<usize> {
    program.stream(StreamId {
        rank: schedule.rank_of(s),
        lane: 0,
    })
}

fn device_error(e: super::DeviceError) -> RuntimeError {
    RuntimeError::Device { message: e.message }
}

impl From<StageError> for super::DeviceError {
    fn from(e: StageError) -> Self {
        super::DeviceError::new(e.message())
    }
}
