//! [`Streams`]: the stream executor as a [`StepRunner`], on any [`Device`]: CUDA streams (with or
//! without a captured whole-step graph) or their CPU twin
//! [`CpuStreams`](pipefill_host::runtime::streams::CpuStreams).
//!
//! One host thread enqueues each step of a replica and waits for it. With `D > 1` replicas, each
//! replica (its own streams and its own copy of the stages, on the same devices) runs its step on a
//! host thread of its own ([`on_replicas`], as the threaded replicas), and each replica's step ends
//! with its stages' gradients reduced through the runtime's [`AllReduce`] as the threaded replicas'
//! [`Reducer`] (set on each executor: once its device
//! synchronised, on the host buffers each stage lends, through the host on a GPU); the trainer's
//! optimizer step then steps every replica. The step's time is the slowest replica's (the host
//! enqueue times are replica 0's). With `graph`, the first [`GRAPH_PLAIN_STEPS`]
//! steps run plain, the next is captured and the later ones replay it; a captured or replayed step
//! has no per-action timing (nothing is marked inside a graph), so its report carries the last
//! plain step's timeline and action times.

use std::sync::Arc;

use pipefill_host::cost::Recompute;
use pipefill_host::runtime::streams::{Device, Pending, StreamExecutor, StreamLoss, StreamStage};
use pipefill_host::runtime::{on_replicas, AllReduce, Reducer, RuntimeError, StepReport, Tensor};
use pipefill_host::schedule::Schedule;

use super::{
    by_replica, combine, optimizer_failed, states_of, HostBatch, Saver, StepResult, StepRunner,
    TrainError, Trainable,
};

/// Steps run plain before the captured one with a graph: a warm-up and a plain, measured step.
pub const GRAPH_PLAIN_STEPS: usize = 2;

/// Host seconds spent enqueuing each step, per action: what a captured graph saves.
#[derive(Debug, Clone, Default)]
pub struct HostEnqueue {
    /// Actions per step (the host's per-action divisor).
    pub actions: usize,
    /// Per plain step after the warm-up (the first step run): enqueue seconds / actions.
    pub plain: Vec<f64>,
    /// Per replayed step: seconds to refresh the inputs and launch the graph / actions.
    pub graph: Vec<f64>,
    /// Wall seconds of the same plain steps.
    pub plain_steps: Vec<f64>,
    /// Wall seconds of the same replayed steps.
    pub graph_steps: Vec<f64>,
    /// The step captured as a graph (`None` without a graph).
    pub captured_at: Option<usize>,
}

/// A step's inputs and targets on the device, or why they are not.
pub type Uploaded<P> = Result<(Vec<P>, Vec<P>), String>;

/// Puts a step's host microbatches on the device.
pub trait Upload<P> {
    /// `x` on device `on.0` (stage 0's) and `t` on device `on.1` (the last stage's), ready for a
    /// step (the copies are done when this returns).
    fn upload(&self, x: &[Tensor], t: &[Tensor], on: (usize, usize)) -> Uploaded<P>;
}

/// The upload of the CPU twin: the host tensors themselves, tagged with their device.
pub struct CpuUpload;

impl Upload<Pending<Tensor>> for CpuUpload {
    fn upload(&self, x: &[Tensor], t: &[Tensor], on: (usize, usize)) -> Uploaded<Pending<Tensor>> {
        let put =
            |d: usize, v: &[Tensor]| v.iter().map(|x| Pending::ready_on(d, x.clone())).collect();
        Ok((put(on.0, x), put(on.1, t)))
    }
}

/// How a step runs with or without `--graph`: plain, captured, or replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Enqueued action by action.
    Plain,
    /// Enqueued once under capture, then launched.
    Capture,
    /// The captured step launched again.
    Replay,
}

/// The mode of the `ran`-th step a runner runs (from 0): without a graph always plain; with one,
/// [`GRAPH_PLAIN_STEPS`] plain steps, the capture, then replays.
pub fn mode(graph: bool, ran: usize) -> Mode {
    if !graph || ran < GRAPH_PLAIN_STEPS {
        Mode::Plain
    } else if ran == GRAPH_PLAIN_STEPS {
        Mode::Capture
    } else {
        Mode::Replay
    }
}

/// One replica: its executor and its loss (on its device).
type Replica<D, S, L> = (StreamExecutor<D, S>, L);

/// The stream runner: `D` replicas of stages `S` on devices `D` with losses `L`, batches put on
/// the device by `U`.
pub struct Streams<D: Device, S: StreamStage<D::Stream, D::Payload>, L, U> {
    schedule: Schedule,
    replicas: Vec<Replica<D, S, L>>,
    /// The replicas' gradient reduction (`D > 1`).
    reduce: Option<Arc<AllReduce>>,
    upload: U,
    microbatches: usize,
    graph: bool,
    ran: usize,
    host: HostEnqueue,
    /// The last plain step's report (for the graph steps' timeline).
    last_plain: Option<StepReport>,
    /// The first step's enqueue time per action and wall time (counted only when it is the
    /// only step: it warms up).
    warmup: Option<(f64, f64)>,
}

impl<D: Device, S: StreamStage<D::Stream, D::Payload>, L, U> Streams<D, S, L, U> {
    /// The runner for `schedule` over `replicas` (each: its stages in global order, its device,
    /// its loss on that device), `microbatches` (`M`) per replica, capturing a graph when `graph`.
    pub fn new(
        schedule: &Schedule,
        replicas: Vec<(Vec<S>, D, L)>,
        upload: U,
        microbatches: usize,
        graph: bool,
    ) -> Result<Self, TrainError> {
        let mut replicas = replicas
            .into_iter()
            .map(|(stages, device, loss)| {
                StreamExecutor::new(schedule.clone(), stages, device).map(|ex| (ex, loss))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TrainError::Runner(e.to_string()))?;
        if replicas.is_empty() {
            return Err(TrainError::Runner("no replica".into()));
        }
        let actions = replicas[0].0.actions();
        let n = replicas.len();
        let reduce = (n > 1).then(|| Arc::new(AllReduce::new(n, schedule.stages())));
        for (d, (ex, _)) in replicas.iter_mut().enumerate() {
            let reducer = reduce.as_ref().map(|ar| {
                let ar = Arc::clone(ar);
                Arc::new(move |s, g: Vec<&mut [f32]>| ar.reduce(d, s, g)) as Arc<Reducer>
            });
            ex.set_reducer(reducer);
        }
        Ok(Streams {
            schedule: schedule.clone(),
            replicas,
            reduce,
            upload,
            microbatches,
            graph,
            ran: 0,
            host: HostEnqueue {
                actions,
                ..HostEnqueue::default()
            },
            last_plain: None,
            warmup: None,
        })
    }

    /// This runner with stage `s` of every replica run with recomputation `modes[s]`
    /// ([`StreamExecutor::set_recompute`]).
    pub fn recomputing(mut self, modes: &[Recompute]) -> Self {
        for (ex, _) in &mut self.replicas {
            ex.set_recompute(modes);
        }
        self
    }

    /// Each replica's executor.
    pub fn executors(&self) -> impl Iterator<Item = &StreamExecutor<D, S>> {
        self.replicas.iter().map(|(ex, _)| ex)
    }
}

/// One step of `replica` on its microbatches `x`, `t` (put on the devices of stage 0 and of stage
/// `last` by `upload`).
fn replica_step<D, S, L, U>(
    (ex, loss): &mut Replica<D, S, L>,
    upload: &U,
    last: usize,
    mode: Mode,
    x: &[Tensor],
    t: &[Tensor],
) -> Result<StepReport, String>
where
    D: Device,
    S: StreamStage<D::Stream, D::Payload>,
    L: StreamLoss<D::Stream, D::Payload>,
    U: Upload<D::Payload>,
{
    let on = |s: usize| ex.stage_device(s).unwrap_or(0);
    let (inputs, targets) = upload.upload(x, t, (on(0), on(last)))?;
    let r: Result<StepReport, RuntimeError> = match mode {
        Mode::Plain => ex.step(inputs, &targets, loss),
        Mode::Capture => ex.capture(inputs, targets, loss),
        Mode::Replay => ex.replay(inputs, targets),
    };
    r.map_err(|e| e.to_string())
}

impl<D, S, L, U> StepRunner for Streams<D, S, L, U>
where
    D: Device,
    S: StreamStage<D::Stream, D::Payload> + Trainable + Send,
    L: StreamLoss<D::Stream, D::Payload> + Send,
    U: Upload<D::Payload> + Sync,
    StreamExecutor<D, S>: Send,
{
    fn step(&mut self, step: usize, (x, t): HostBatch) -> StepResult {
        let failed = |message: String| TrainError::Step { step, message };
        let m = mode(self.graph, self.ran);
        let (xs, ts) = (
            by_replica(x, self.microbatches),
            by_replica(t, self.microbatches),
        );
        // Every replica at once, each on a thread of its own, with replicas (their reducer waits
        // for all of them).
        let (upload, last) = (&self.upload, self.schedule.stages() - 1);
        let items: Vec<_> = self.replicas.iter_mut().zip(xs.iter().zip(&ts)).collect();
        type Item<'a, D, S, L> = (&'a mut Replica<D, S, L>, (&'a Vec<Tensor>, &'a Vec<Tensor>));
        let one = |_: usize, (replica, (x, t)): Item<'_, D, S, L>| {
            replica_step(replica, upload, last, m, x, t)
        };
        let reports = match &self.reduce {
            None => items.into_iter().map(|item| one(0, item)).collect(),
            Some(reduce) => {
                reduce.reset();
                let lost = |d: usize| format!("replica {d}'s thread panicked");
                on_replicas(reduce, items, lost, one)
            }
        };
        let reports = reports.map_err(failed)?;
        let enqueue = self.replicas[0].0.enqueue_seconds();
        let mut r = combine(reports)?;
        let per_action = enqueue / self.host.actions.max(1) as f64;
        match m {
            Mode::Plain if self.ran > 0 => {
                self.host.plain.push(per_action);
                self.host.plain_steps.push(r.seconds);
            }
            Mode::Replay => {
                self.host.graph.push(per_action);
                self.host.graph_steps.push(r.seconds);
            }
            Mode::Capture => self.host.captured_at = Some(step),
            Mode::Plain => self.warmup = Some((per_action, r.seconds)),
        }
        if m == Mode::Plain {
            self.last_plain = Some(r.clone());
        } else if let Some(last) = &self.last_plain {
            r.timeline = last.timeline.clone();
            r.action_seconds = last.action_seconds.clone();
        }
        self.ran += 1;
        Ok(Some(r))
    }

    fn optimizer_step(&mut self, step: usize) -> Result<(), TrainError> {
        for (ex, _) in &mut self.replicas {
            ex.optimizer_step().map_err(|e| optimizer_failed(step, e))?;
        }
        Ok(())
    }

    fn save(&mut self, saver: &Saver, done: usize) -> Result<(), TrainError> {
        let ex = &self.replicas[0].0;
        let states = states_of(ex.stages().iter().enumerate(), done)?;
        saver.save(done, &self.schedule, states)
    }

    fn host_enqueue(&self) -> Option<HostEnqueue> {
        let mut host = self.host.clone();
        if let (Some((per_action, seconds)), 1) = (self.warmup, self.ran) {
            host.plain.push(per_action);
            host.plain_steps.push(seconds);
        }
        Some(host)
    }
}
