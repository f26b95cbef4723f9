//! [`StreamExecutor`]: runs training steps of a schedule on a [`Device`] from one host thread.

use std::collections::HashMap;
use std::time::Instant;

use super::program::lanes;
use super::{check, Device, EventRole, Misplaced, StreamId, StreamOp, StreamProgram};
use crate::runtime::worker::{grad_edge, input_edge};
use crate::runtime::{Loss, Payload, RuntimeError, Stage, StageError, StepReport};
use crate::schedule::deps::{output, Edge, Flow};
use crate::schedule::{Action, Op, Schedule};
use crate::timeline::{Source, Timeline, Transfer};

mod graph;

/// Runs training steps of a [`Schedule`] over stages whose work a [`Device`] runs on streams.
///
/// Built once per schedule: the [`StreamProgram`] is built and [`check`]ed, the device makes the
/// streams. Each [`step`](StreamExecutor::step) then enqueues the whole step from the calling thread
/// (stage calls, records, waits and timing marks), synchronises once, applies the optimizer steps
/// and returns the same [`StepReport`] as the threaded [`Executor`](crate::runtime::Executor), with the
/// timeline measured by the device's marks.
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
pub struct StreamExecutor<D: Device, S: Stage<D::Payload>> {
    schedule: Schedule,
    program: StreamProgram,
    device: D,
    stages: Vec<S>,
    /// Host seconds the last step spent enqueuing (or refreshing and replaying) its work.
    enqueue_seconds: f64,
    /// The captured step, once [`capture`](StreamExecutor::capture) ran (dropped after the device).
    graph: Option<graph::Captured<D>>,
}

/// A stash and whether `I` has run on it.
struct Held<T> {
    stash: T,
    input_done: bool,
    bytes: usize,
}

/// The state of one step while it is enqueued.
struct Step<D: Device, T> {
    stashes: HashMap<(usize, usize), Held<T>>,
    /// Data waiting for its consumer: `(edge, payload)` by edge.
    mailbox: HashMap<Edge, D::Payload>,
    inputs: Vec<Option<D::Payload>>,
    losses: Vec<Option<<D::Payload as Payload>::Loss>>,
    held: Vec<usize>,
    peak: Vec<usize>,
    /// Start and end marks of each action, in enqueue order.
    marks: Vec<(Action, D::Mark, D::Mark)>,
    bytes: HashMap<Edge, usize>,
}

impl<D: Device, S: Stage<D::Payload>> StreamExecutor<D, S> {
    /// An executor for `schedule` over `stages` (global order) on `device`. Refuses a schedule that
    /// does not validate, a stage count that does not fit, and a program [`check`] refuses.
    pub fn new(schedule: Schedule, stages: Vec<S>, mut device: D) -> Result<Self, RuntimeError> {
        crate::runtime::check::check_run(&schedule, stages.len())?;
        let program = StreamProgram::build(&schedule).map_err(RuntimeError::Streams)?;
        check(&program, &schedule).map_err(RuntimeError::Streams)?;
        device
            .make_streams(&program.streams)
            .map_err(device_error)?;
        Ok(StreamExecutor {
            schedule,
            program,
            device,
            stages,
            enqueue_seconds: 0.0,
            graph: None,
        })
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

    /// Runs one training step: `inputs[k]` and `targets[k]` are microbatch `k`'s input and target.
    pub fn step<L: Loss<D::Payload>>(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: &[D::Payload],
        loss: &L,
    ) -> Result<StepReport, RuntimeError> {
        self.check_batch(inputs.len(), targets.len())?;
        let wall = Instant::now();
        for stage in &mut self.stages {
            stage.zero_grad();
        }
        let mut step = self.new_step(inputs);
        let origin = self.device.origin().map_err(device_error)?;
        self.enqueue_ops(&mut step, targets, loss, true)?;
        self.enqueue_seconds = wall.elapsed().as_secs_f64();
        self.device.synchronize().map_err(device_error)?;
        self.optimizer_steps()?;
        self.report(step, &origin, wall.elapsed().as_secs_f64())
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

    /// Every stage's optimizer step (host calls, after the step's work is done).
    fn optimizer_steps(&mut self) -> Result<(), RuntimeError> {
        for (s, stage) in self.stages.iter_mut().enumerate() {
            stage
                .optimizer_step()
                .map_err(|e| RuntimeError::OptimizerFailed {
                    rank: self.schedule.rank_of(s),
                    stage: s,
                    message: e.to_string(),
                })?;
        }
        Ok(())
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
        let (p, m) = (self.schedule.ranks, self.schedule.microbatches);
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

    /// Walks the program once: binds, runs each action (between timing marks when `timed`),
    /// records and waits on events.
    fn enqueue_ops<L: Loss<D::Payload>>(
        &mut self,
        step: &mut Step<D, S::Stash>,
        targets: &[D::Payload],
        loss: &L,
        timed: bool,
    ) -> Result<Vec<D::Event>, RuntimeError> {
        let mut events = Vec::with_capacity(self.program.events.len());
        for i in 0..self.program.ops.len() {
            match self.program.ops[i] {
                StreamOp::Run { stream, action } if timed => {
                    self.device.bind(stream).map_err(device_error)?;
                    let start = self.device.mark(stream).map_err(device_error)?;
                    self.run(step, stream, action, targets, loss)?;
                    let end = self.device.mark(stream).map_err(device_error)?;
                    step.marks.push((action, start, end));
                }
                StreamOp::Run { stream, action } => {
                    self.device.bind(stream).map_err(device_error)?;
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
                    self.adopt(step, stream, event)?;
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
        step: &mut Step<D, S::Stash>,
        stream: usize,
        event: usize,
    ) -> Result<(), RuntimeError> {
        let Some(EventRole::Transfer(edge)) = self.program.events.get(event) else {
            return Ok(());
        };
        if let Some(payload) = step.mailbox.remove(edge) {
            let adopted = self.device.adopt(stream, payload).map_err(device_error)?;
            step.mailbox.insert(*edge, adopted);
        }
        Ok(())
    }

    /// Refuses `payload` for action `a` on `stream` when it lives on another device.
    fn placed(&self, stream: usize, a: Action, payload: &D::Payload) -> Result<(), RuntimeError> {
        let stream_device = self.device.stream_device(stream);
        match self.device.payload_device(payload) {
            Some(payload_device) if payload_device != stream_device => {
                Err(RuntimeError::WrongDevice {
                    rank: self.schedule.rank_of(a.stage),
                    action: a,
                    misplaced: Misplaced {
                        stream,
                        stream_device,
                        payload_device,
                    },
                })
            }
            _ => Ok(()),
        }
    }

    /// Enqueues one action on `stream`: takes its input (refused when it lives on another device),
    /// calls the stage, holds the stash, hands on the output.
    fn run<L: Loss<D::Payload>>(
        &mut self,
        step: &mut Step<D, S::Stash>,
        stream: usize,
        a: Action,
        targets: &[D::Payload],
        loss: &L,
    ) -> Result<(), RuntimeError> {
        let rank = self.schedule.rank_of(a.stage);
        let handed: Option<D::Payload> = match a.op {
            Op::F => self.forward(step, stream, a, targets, loss)?,
            Op::I | Op::B => Some(self.backward(step, stream, a)?),
            Op::W => {
                let key = (a.stage, a.microbatch);
                let h = step.stashes.remove(&key).ok_or_else(|| no_stash(rank, a))?;
                if !h.input_done {
                    return Err(act(rank, a, "W before I for this microbatch"));
                }
                step.hold(rank, 0, h.bytes);
                self.stages[a.stage]
                    .backward_weight(h.stash)
                    .map_err(|e| act(rank, a, e))?;
                None
            }
        };
        if let (Some(data), Some(edge)) = (handed, output(a, self.schedule.stages())) {
            step.bytes.insert(edge, data.bytes());
            step.mailbox.insert(edge, data);
        }
        Ok(())
    }

    /// `F`: the stage's forward on its input, the stash held; on the last stage the loss, its
    /// gradient left in the mailbox. Returns the output to hand on (`None` on the last stage).
    fn forward<L: Loss<D::Payload>>(
        &mut self,
        step: &mut Step<D, S::Stash>,
        stream: usize,
        a: Action,
        targets: &[D::Payload],
        loss: &L,
    ) -> Result<Option<D::Payload>, RuntimeError> {
        let rank = self.schedule.rank_of(a.stage);
        let input = if a.stage == 0 {
            step.inputs.get_mut(a.microbatch).and_then(Option::take)
        } else {
            step.mailbox.remove(&input_edge(a))
        };
        let input = input.ok_or_else(|| no_input(rank, a))?;
        self.placed(stream, a, &input)?;
        let stage = &mut self.stages[a.stage];
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
        if a.stage + 1 < self.schedule.stages() {
            return Ok(Some(out));
        }
        let target = targets.get(a.microbatch).ok_or_else(|| no_input(rank, a))?;
        self.placed(stream, a, target)?;
        let (value, mut grad) = loss.loss(&out, target).map_err(|e| act(rank, a, e))?;
        grad.scale_by(1.0 / self.schedule.microbatches as f32)
            .map_err(|e| act(rank, a, e))?;
        step.losses[a.microbatch] = Some(value);
        step.mailbox.insert(grad_edge(a), grad);
        Ok(None)
    }

    /// `I` or `B`: the stage's backward on the output's gradient; returns the input's gradient.
    fn backward(
        &mut self,
        step: &mut Step<D, S::Stash>,
        stream: usize,
        a: Action,
    ) -> Result<D::Payload, RuntimeError> {
        let rank = self.schedule.rank_of(a.stage);
        let key = (a.stage, a.microbatch);
        let grad = step
            .mailbox
            .remove(&grad_edge(a))
            .ok_or_else(|| no_input(rank, a))?;
        self.placed(stream, a, &grad)?;
        let stage = &mut self.stages[a.stage];
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

    /// The step report: losses read back, the timeline from the marks.
    fn report(
        &self,
        step: Step<D, S::Stash>,
        origin: &D::Mark,
        seconds: f64,
    ) -> Result<StepReport, RuntimeError> {
        let mut losses = Vec::with_capacity(step.losses.len());
        for (k, l) in step.losses.into_iter().enumerate() {
            let l = l.ok_or_else(|| RuntimeError::Internal {
                rank: self.schedule.rank_of(self.schedule.stages() - 1),
                message: format!("no loss for microbatch {k}"),
            })?;
            losses.push(D::Payload::loss_value(l).map_err(|e| device_error(e.into()))?);
        }
        let mut times: HashMap<Action, (f64, f64)> = HashMap::new();
        let mut action_seconds = Vec::with_capacity(step.marks.len());
        for (a, start, end) in &step.marks {
            let s = self.device.seconds(origin, start).map_err(device_error)?;
            let e = self.device.seconds(origin, end).map_err(device_error)?;
            times.insert(*a, (s, e));
            action_seconds.push((*a, e - s));
        }
        let timeline = self.timeline(&times, &step.bytes);
        let loss = losses.iter().sum::<f32>() / losses.len().max(1) as f32;
        Ok(StepReport {
            loss,
            losses,
            timeline,
            peak_held_bytes: step.peak,
            seconds,
            action_seconds,
        })
    }

    fn timeline(
        &self,
        times: &HashMap<Action, (f64, f64)>,
        bytes: &HashMap<Edge, usize>,
    ) -> Timeline {
        let mut t = Timeline::new(
            self.schedule.name.clone(),
            Source::Measured,
            self.schedule.ranks,
        );
        for (rank, list) in self.schedule.actions.iter().enumerate() {
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
        for role in &self.program.events {
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

impl<D: Device, T> Step<D, T> {
    fn hold(&mut self, rank: usize, add: usize, remove: usize) {
        self.held[rank] = (self.held[rank] + add).saturating_sub(remove);
        self.peak[rank] = self.peak[rank].max(self.held[rank]);
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

fn device_error(e: super::DeviceError) -> RuntimeError {
    RuntimeError::Device { message: e.message }
}

impl From<StageError> for super::DeviceError {
    fn from(e: StageError) -> Self {
        super::DeviceError::new(e.message())
    }
}
