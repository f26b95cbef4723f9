//! [`Executor`]: runs a schedule's training steps on one OS thread per rank.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, Sender};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use super::worker::{Message, StepContext, Stop, Worker, WorkerOutput};
use super::{Loss, RuntimeError, Stage, Tensor};
use crate::schedule::{Action, Schedule};
use crate::timeline::{Source, Timeline};

/// Runs training steps of a [`Schedule`] over a trainer's [`Stage`]s, one OS thread per rank.
///
/// The executor owns the `S = P * V` stages (in global order; stage `s` runs on
/// `schedule.rank_of(s)`). Each [`step`](Executor::step):
///
/// - runs one worker per rank, each on its own OS thread (the rank holding stage 0 on the calling
///   thread, the others on threads started for the step); each runs its rank's list **strictly in
///   order** (it never reorders; an overlapped pair runs its forward half then its backward half);
/// - moves activations forward and gradients backward through channels, only between different
///   ranks (a hand-off between stages on the same rank is direct);
/// - keeps each microbatch's stash from `F` until its `W` (or `B`) and drops it there;
/// - computes the loss after the last stage's forward, and scales its gradient by `1 / M`;
/// - lets weight gradients accumulate over the microbatches (after
///   [`Stage::zero_grad`] at the start) and calls [`Stage::optimizer_step`] once, after every rank
///   has finished its list;
/// - times every item, returning a measured [`Timeline`] (the type the simulator returns).
///
/// A rank waiting for data polls its channel for a while before it blocks (see
/// [`set_poll`](Executor::set_poll)): waking a blocked thread costs both sides tens of
/// microseconds, more in a virtual machine, and a pipeline hands data over twice per microbatch
/// and stage boundary.
///
/// If a layer fails (an error or a panic) on any rank, the whole step stops: every other rank is
/// told to stop, no rank waits forever, no optimizer step is applied, and the error names the rank
/// and the action.
///
/// ```
/// use pipefill_host::runtime::{Executor, Stage, StageError, Tensor};
/// use pipefill_host::schedule::{Action, Item, Op, Placement, Schedule};
///
/// /// `y = x + b` with a learnable bias per stage (a stage needs no stash for this).
/// struct AddBias { b: f32, grad: f32 }
/// impl Stage for AddBias {
///     type Stash = Option<Tensor>; // the output gradient, kept from I to W
///     fn forward(&mut self, mut x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
///         x.data_mut().iter_mut().for_each(|v| *v += self.b);
///         Ok((x, None))
///     }
///     fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
///         *st = Some(dy.clone());
///         Ok(dy)
///     }
///     fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
///         self.grad += st.map_or(0.0, |dy| dy.data().iter().sum());
///         Ok(())
///     }
///     fn held_bytes(&self, st: &Self::Stash) -> usize { st.as_ref().map_or(0, Tensor::bytes) }
///     fn zero_grad(&mut self) { self.grad = 0.0; }
///     fn optimizer_step(&mut self) -> Result<(), StageError> { self.b -= 0.5 * self.grad; Ok(()) }
/// }
///
/// // Two ranks, one stage each, two microbatches, GPipe order written by hand.
/// let rank = |s: usize, text: &str| -> Vec<Item> {
///     text.split_whitespace().map(|a| a.replace('s', &s.to_string()).parse().unwrap()).collect()
/// };
/// let schedule = Schedule {
///     name: "gpipe".into(), ranks: 2, chunks: 1, microbatches: 2,
///     placement: Placement::Looped,
///     actions: vec![rank(0, "sF0 sF1 sB0 sB1"), rank(1, "sF0 sF1 sB0 sB1")],
/// };
/// let stages = vec![AddBias { b: 0.0, grad: 0.0 }, AddBias { b: 0.0, grad: 0.0 }];
/// let mut ex = Executor::new(schedule, stages).unwrap();
///
/// // Loss: half the squared distance to the target.
/// let loss = |y: &Tensor, t: &Tensor| -> Result<(f32, Tensor), StageError> {
///     let d: Vec<f32> = y.data().iter().zip(t.data()).map(|(a, b)| a - b).collect();
///     Ok((0.5 * d.iter().map(|v| v * v).sum::<f32>(), Tensor::new(y.shape().to_vec(), d)?))
/// };
/// let x = |v: f32| Tensor::new(vec![1, 1], vec![v]).unwrap();
/// let report = ex.step(vec![x(0.0), x(0.0)], &[x(1.0), x(1.0)], &loss).unwrap();
/// assert_eq!(report.loss, 0.5);
/// // d(mean loss)/d(b) = -1 for both biases; SGD with lr 0.5 moves each to 0.5.
/// assert_eq!(ex.stages()[0].b, 0.5);
/// assert_eq!(report.timeline.spans[1].len(), 4);
/// ```
pub struct Executor<S: Stage> {
    schedule: Schedule,
    stages: Vec<S>,
    exclusive: bool,
    poll: Duration,
}

/// What one training step produced.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// The step's loss: the mean of the microbatch losses.
    pub loss: f32,
    /// The loss of each microbatch, by microbatch index.
    pub losses: Vec<f32>,
    /// When every item ran on every rank (starts at 0 with the first item).
    pub timeline: Timeline,
    /// Per rank, the most activation memory its stashes held at once (from [`Stage::held_bytes`]).
    pub peak_held_bytes: Vec<usize>,
    /// Wall-clock seconds of the whole step, threads and optimizer step included.
    pub seconds: f64,
    /// Seconds spent in the layers by each action (the loss is part of the last stage's `F`),
    /// every action of the schedule once.
    pub action_seconds: Vec<(Action, f64)>,
}

impl<S: Stage> Executor<S> {
    /// An executor for `schedule` over `stages` (global order, `schedule.stages()` of them).
    /// Refuses a schedule that does not validate or a stage count that does not fit.
    pub fn new(schedule: Schedule, stages: Vec<S>) -> Result<Self, RuntimeError> {
        super::check::check_schedule(&schedule)?;
        if stages.len() != schedule.stages() {
            return Err(RuntimeError::Setup(format!(
                "schedule `{}` has {} stages (P = {} x V = {}) but {} stages were given",
                schedule.name,
                schedule.stages(),
                schedule.ranks,
                schedule.chunks,
                stages.len()
            )));
        }
        let poll = default_poll(schedule.ranks);
        Ok(Executor {
            schedule,
            stages,
            exclusive: false,
            poll,
        })
    }

    /// With `true`, only one layer call runs at a time over all ranks (the ranks still follow
    /// their lists and exchange data as usual). Per-action durations are then free of time
    /// sharing when there are more ranks than cores; `--replay` rebuilds the timeline from them.
    pub fn set_exclusive(&mut self, exclusive: bool) {
        self.exclusive = exclusive;
    }

    /// How long a rank that waits for an activation or gradient polls its channel, yielding its
    /// core between polls, before it blocks until the data arrives.
    ///
    /// Polling saves a sleep and a wake-up per hand-off (measured on a 2-core virtual machine:
    /// about 50 µs for the receiver and as much again for the sender, which makes the wake-up
    /// call; see NOTES.md). It costs a core while polling, which is free when every rank has
    /// its own core. The default is [`default_poll`]: 5 ms when the ranks fit on the machine's
    /// cores, 30 µs when they do not (the waiting rank then soon gives its core to a rank with
    /// work).
    pub fn set_poll(&mut self, poll: Duration) {
        self.poll = poll;
    }

    /// How long a waiting rank polls before it blocks (see [`set_poll`](Executor::set_poll)).
    pub fn poll(&self) -> Duration {
        self.poll
    }

    /// The schedule it runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The stages, in global order.
    pub fn stages(&self) -> &[S] {
        &self.stages
    }

    /// The stages, in global order, for changing between steps.
    pub fn stages_mut(&mut self) -> &mut [S] {
        &mut self.stages
    }

    /// Gives the stages back.
    pub fn into_stages(self) -> Vec<S> {
        self.stages
    }

    /// Runs one training step: `inputs[k]` and `targets[k]` are microbatch `k`'s input (to stage 0)
    /// and target (for `loss` after the last stage); there must be `M` of each.
    pub fn step<L: Loss>(
        &mut self,
        inputs: Vec<Tensor>,
        targets: &[Tensor],
        loss: &L,
    ) -> Result<StepReport, RuntimeError> {
        let m = self.schedule.microbatches;
        if inputs.len() != m || targets.len() != m {
            return Err(RuntimeError::Setup(format!(
                "schedule `{}` runs M = {m} microbatches per step, but {} inputs and {} targets \
                 were given",
                self.schedule.name,
                inputs.len(),
                targets.len()
            )));
        }
        let p = self.schedule.ranks;
        let failed = AtomicBool::new(false);
        let barrier = Barrier::new(p);
        let lock = Mutex::new(());
        let ctx = StepContext {
            schedule: &self.schedule,
            targets,
            loss,
            epoch: Instant::now(),
            failed: &failed,
            barrier: &barrier,
            exclusive: self.exclusive.then_some(&lock),
            poll: self.poll,
        };
        let first_rank = self.schedule.rank_of(0);
        let workers = make_workers(&self.schedule, &mut self.stages, inputs);
        let outputs: Vec<WorkerOutput> = std::thread::scope(|scope| {
            // The other ranks start first; the rank holding stage 0 (whose list starts with work
            // that waits for nobody) runs here, which saves starting and joining one thread.
            let mut here = None;
            let mut handles = Vec::with_capacity(p);
            for w in workers {
                if w.rank == first_rank {
                    here = Some(w);
                } else {
                    let ctx = &ctx;
                    handles.push((w.rank, scope.spawn(move || w.run(ctx))));
                }
            }
            let mine = here.map(|w| (w.rank, w.run(&ctx)));
            let mut outputs: Vec<(usize, WorkerOutput)> = handles
                .into_iter()
                .map(|(r, h)| (r, h.join().unwrap_or_else(|_| lost_worker())))
                .chain(mine)
                .collect();
            outputs.sort_by_key(|(r, _)| *r);
            outputs.into_iter().map(|(_, o)| o).collect()
        });
        let seconds = ctx.epoch.elapsed().as_secs_f64();
        report(&self.schedule, outputs, seconds)
    }
}

/// How long a waiting rank polls by default for `ranks` ranks: 5 ms when they fit on this
/// machine's cores ([`std::thread::available_parallelism`]), else 30 µs.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(pipefill_host::runtime::default_poll(usize::MAX), Duration::from_micros(30));
/// ```
pub fn default_poll(ranks: usize) -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if ranks <= cores {
        Duration::from_millis(5)
    } else {
        Duration::from_micros(30)
    }
}

/// The output of a worker whose thread died outside any guarded call (cannot happen unless the
/// runtime itself has a bug); reported rather than propagated as a panic.
fn lost_worker() -> WorkerOutput {
    WorkerOutput {
        spans: Vec::new(),
        transfers: Vec::new(),
        losses: Vec::new(),
        peak_held: 0,
        action_seconds: Vec::new(),
        result: Err(Stop::Failed(RuntimeError::Setup(
            "a worker thread of the runtime panicked outside a layer call".into(),
        ))),
    }
}

/// Splits the stages by rank and wires one channel per rank.
fn make_workers<'s, S: Stage>(
    schedule: &Schedule,
    stages: &'s mut [S],
    inputs: Vec<Tensor>,
) -> Vec<Worker<'s, S>> {
    let p = schedule.ranks;
    let (senders, receivers): (Vec<Sender<Message>>, Vec<_>) =
        (0..p).map(|_| mpsc::channel()).unzip();
    let mut local: Vec<Vec<(usize, &'s mut S)>> = (0..p).map(|_| Vec::new()).collect();
    for (s, stage) in stages.iter_mut().enumerate() {
        local[schedule.rank_of(s)].push((s, stage));
    }
    let first_rank = schedule.rank_of(0);
    let mut inputs = Some(inputs.into_iter().map(Some).collect::<Vec<_>>());
    receivers
        .into_iter()
        .zip(local)
        .enumerate()
        .map(|(rank, (rx, stages))| Worker {
            rank,
            stages,
            inputs: if rank == first_rank {
                inputs.take().unwrap_or_default()
            } else {
                Vec::new()
            },
            rx,
            peers: senders
                .iter()
                .enumerate()
                .map(|(r, tx)| (r != rank).then(|| tx.clone()))
                .collect(),
        })
        .collect()
}

/// Gathers the workers' outputs into a step report, or the error that stopped the step.
fn report(
    schedule: &Schedule,
    outputs: Vec<WorkerOutput>,
    seconds: f64,
) -> Result<StepReport, RuntimeError> {
    // The first rank that failed by itself is the cause; the others were told to stop.
    let mut first_error = None;
    for o in &outputs {
        if let Err(Stop::Failed(e)) = &o.result {
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
    for o in outputs {
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
    let mut timeline = Timeline {
        name: schedule.name.clone(),
        source: Source::Measured,
        spans,
        transfers,
    };
    timeline.shift_to_zero();
    let loss = losses.iter().sum::<f32>() / losses.len().max(1) as f32;
    Ok(StepReport {
        loss,
        losses,
        timeline,
        peak_held_bytes,
        seconds,
        action_seconds,
    })
}
