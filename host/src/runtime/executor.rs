//! [`Executor`]: runs a schedule's training steps on one OS thread per rank.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::hook::{EachRank, Events};
use super::machine::{optimizer_steps, RankOutcome, Ready};
use super::program::RankProgram;
use super::report::{assemble, assemble_evaluation, lost_worker};
use super::transport::Channels;
use super::worker::{run_rank, RankStep, Reducer};
use super::{Evaluation, Loss, RuntimeError, Stage, StepEvent, StepReport, Tensor};
use crate::cost::Recompute;
use crate::schedule::Schedule;

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
///   [`Stage::zero_grad`] at the start), reduces them across replicas where a [`Reducer`] is set,
///   and ends with them ready: the optimizer is the trainer's call,
///   [`optimizer_step`](Executor::optimizer_step), so that a trainer can read and change every
///   stage's [`gradients`](Stage::gradients) first (clip their global norm, skip a step on
///   overflow) or step the stages itself through [`stages_mut`](Executor::stages_mut);
/// - times every item, returning a measured [`Timeline`](crate::timeline::Timeline) (the type the simulator returns).
///
/// A rank waiting for data polls its channel for a while before it blocks (see
/// [`set_poll`](Executor::set_poll)): waking a blocked thread costs both sides tens of
/// microseconds, more in a virtual machine, and a pipeline hands data over twice per microbatch
/// and stage boundary.
///
/// If a layer fails (an error or a panic) on any rank, the whole step stops: every other rank is
/// told to stop, no rank waits forever, the error names the rank and the action, and
/// [`optimizer_step`](Executor::optimizer_step) refuses the step's incomplete gradients.
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
/// // The step leaves the gradients ready: d(mean loss)/d(b) = -1 for both biases.
/// assert_eq!(ex.stages()[0].grad, -1.0);
/// // The optimizer is the trainer's call: SGD with lr 0.5 moves each bias to 0.5.
/// ex.optimizer_step().unwrap();
/// assert_eq!(ex.stages()[0].b, 0.5);
/// assert_eq!(report.timeline.spans[1].len(), 4);
/// ```
pub struct Executor<S: Stage> {
    schedule: Schedule,
    /// What the ranks execute: the schedule lowered, with its sends and receives.
    program: RankProgram,
    /// What the ranks execute in an evaluation: the schedule's forwards only.
    evaluation: RankProgram,
    stages: Vec<S>,
    exclusive: bool,
    poll: Duration,
    reducer: Option<Arc<Reducer>>,
    /// Each stage's recomputation mode (empty: none).
    recompute: Vec<Recompute>,
    /// Whether the stages hold a finished step's gradients, not yet applied.
    ready: Ready,
}

impl<S: Stage> Executor<S> {
    /// An executor for `schedule` over `stages` (global order, `schedule.stages()` of them).
    /// Refuses a schedule that does not validate or a stage count that does not fit.
    pub fn new(schedule: Schedule, stages: Vec<S>) -> Result<Self, RuntimeError> {
        super::check::check_run(&schedule, stages.len())?;
        let poll = default_poll(schedule.ranks);
        Ok(Executor {
            program: RankProgram::of(&schedule),
            evaluation: RankProgram::evaluation_of(&schedule),
            schedule,
            stages,
            exclusive: false,
            poll,
            reducer: None,
            recompute: Vec::new(),
            ready: Ready::default(),
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
    /// call; see docs/measurements.md). It costs a core while polling, which is free when every rank has
    /// its own core. The default is [`default_poll`]: 5 ms when the ranks fit on the machine's
    /// cores, 30 µs when they do not (the waiting rank then soon gives its core to a rank with
    /// work).
    pub fn set_poll(&mut self, poll: Duration) {
        self.poll = poll;
    }

    /// Sets the data-parallel gradient reduction every rank calls for each of its stages right after
    /// the stage's last `W`/`B` of a step (so a stage's reduction overlaps the cool-down of the
    /// others); the step ends with the reduced gradients: see [`Reducer`] and
    /// [`AllReduce`](super::AllReduce).
    pub fn set_reducer(&mut self, reducer: Option<Arc<Reducer>>) {
        self.reducer = reducer;
    }

    /// Runs stage `s` with recomputation `modes[s]` from the next step on (a stage past the end
    /// of `modes` without): a stage with [`Recompute::Full`] keeps only (a copy of) its input
    /// from `F` to its backward, which runs the forward again first. The losses, gradients and
    /// parameters are those of a run without it, bit for bit (the forward is deterministic); the
    /// peak held bytes are lower where the stash is larger than the input.
    pub fn set_recompute(&mut self, modes: &[Recompute]) {
        self.recompute = modes.to_vec();
    }

    /// Each stage's recomputation mode, as [`set_recompute`](Executor::set_recompute) set it.
    pub fn recompute(&self) -> &[Recompute] {
        &self.recompute
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
    /// and target (for `loss` after the last stage); there must be `M` of each. The step ends with
    /// every stage's gradients ready; [`optimizer_step`](Executor::optimizer_step) applies them.
    pub fn step<L: Loss>(
        &mut self,
        inputs: Vec<Tensor>,
        targets: &[Tensor],
        loss: &L,
    ) -> Result<StepReport, RuntimeError> {
        self.train_step(inputs, targets, loss, None)
    }

    /// Runs one evaluation step: the schedule's forwards only, in the order its ranks run them
    /// ([`forward_only`](crate::schedule::forward_only::forward_only), lowered), with the
    /// activations' transfers as in [`step`](Executor::step). No gradient is computed, no stage's
    /// `zero_grad` or `optimizer_step` is called, and each forward's stash is dropped as soon as
    /// the forward returns, so a rank holds at most one stash at a time. `inputs` and `targets`
    /// are as for [`step`](Executor::step); the [`Evaluation`] has each microbatch's loss and
    /// last-stage output. The forwards are the training step's: on the same weights, the losses
    /// are the same, bit for bit.
    ///
    /// ```
    /// # use pipefill_host::runtime::{Executor, Stage, StageError, Tensor};
    /// # use pipefill_host::schedule::{families, Params};
    /// # struct Id;
    /// # impl Stage for Id {
    /// #     type Stash = Tensor;
    /// #     fn forward(&mut self, x: Tensor) -> Result<(Tensor, Tensor), StageError> { Ok((x.clone(), x)) }
    /// #     fn backward_input(&mut self, _: &mut Tensor, g: Tensor) -> Result<Tensor, StageError> { Ok(g) }
    /// #     fn backward_weight(&mut self, _: Tensor) -> Result<(), StageError> { Ok(()) }
    /// #     fn held_bytes(&self, x: &Tensor) -> usize { x.bytes() }
    /// #     fn zero_grad(&mut self) {}
    /// #     fn optimizer_step(&mut self) -> Result<(), StageError> { Ok(()) }
    /// # }
    /// let schedule = families::generate("1f1b", &Params::new(2, 4)).unwrap();
    /// let mut ex = Executor::new(schedule, vec![Id, Id]).unwrap();
    /// let loss = |y: &Tensor, _: &Tensor| Ok((y.data()[0], y.clone()));
    /// let x: Vec<Tensor> = (0..4).map(|k| Tensor::new(vec![1, 1], vec![k as f32]).unwrap()).collect();
    /// let eval = ex.evaluate(x.clone(), &x, &loss).unwrap();
    /// assert_eq!(eval.losses, vec![0.0, 1.0, 2.0, 3.0]);
    /// assert_eq!(eval.outputs[3].data(), &[3.0]);
    /// assert_eq!(eval.peak_held_bytes, vec![4, 4]); // one 1x1 f32 stash at a time
    /// ```
    pub fn evaluate<L: Loss>(
        &mut self,
        inputs: Vec<Tensor>,
        targets: &[Tensor],
        loss: &L,
    ) -> Result<Evaluation, RuntimeError> {
        let (outcomes, seconds) = self.run_ranks(true, inputs, targets, loss, None)?;
        assemble_evaluation(&self.schedule, outcomes, seconds)
    }

    /// [`step`](Executor::step), telling `hook` of each action as it completes and of each stage
    /// whose weight gradients are final for the step ([`StepEvent`]).
    ///
    /// The hook is called on the thread of the rank that ran the action, right after the action
    /// (so it must be `Fn + Sync`), while that rank's next action waits: keep it short, e.g. send
    /// the event down a channel, or start an asynchronous data-parallel reduction of a stage's
    /// gradients on [`StepEvent::GradientsReady`]. Each rank's events come in its list's order;
    /// events of different ranks interleave. If the hook panics, the step stops with
    /// [`RuntimeError::HookPanicked`], as if a layer had failed.
    ///
    /// ```
    /// # use pipefill_host::runtime::{Executor, Stage, StageError, StepEvent, Tensor};
    /// # use pipefill_host::schedule::{families, Params};
    /// # struct Id;
    /// # impl Stage for Id {
    /// #     type Stash = ();
    /// #     fn forward(&mut self, x: Tensor) -> Result<(Tensor, ()), StageError> { Ok((x, ())) }
    /// #     fn backward_input(&mut self, _: &mut (), g: Tensor) -> Result<Tensor, StageError> { Ok(g) }
    /// #     fn backward_weight(&mut self, _: ()) -> Result<(), StageError> { Ok(()) }
    /// #     fn held_bytes(&self, _: &()) -> usize { 0 }
    /// #     fn zero_grad(&mut self) {}
    /// #     fn optimizer_step(&mut self) -> Result<(), StageError> { Ok(()) }
    /// # }
    /// use std::sync::Mutex;
    /// let schedule = families::generate("1f1b", &Params::new(2, 4)).unwrap();
    /// let mut ex = Executor::new(schedule, vec![Id, Id]).unwrap();
    /// let loss = |y: &Tensor, _: &Tensor| Ok((0.0, y.clone()));
    /// let ready = Mutex::new(Vec::new());
    /// let x = vec![Tensor::zeros(vec![1, 1]); 4];
    /// ex.step_with(x.clone(), &x, &loss, |event| {
    ///     if let StepEvent::GradientsReady { stage, .. } = event {
    ///         ready.lock().unwrap().push(stage); // e.g. start this stage's all-reduce here
    ///     }
    /// })
    /// .unwrap();
    /// let mut ready = ready.into_inner().unwrap();
    /// ready.sort();
    /// assert_eq!(ready, vec![0, 1]);
    /// ```
    pub fn step_with<L: Loss, H: Fn(StepEvent) + Sync>(
        &mut self,
        inputs: Vec<Tensor>,
        targets: &[Tensor],
        loss: &L,
        hook: H,
    ) -> Result<StepReport, RuntimeError> {
        self.train_step(inputs, targets, loss, Some(&hook))
    }

    /// Applies every stage's optimizer step ([`Stage::optimizer_step`]) to the gradients the last
    /// [`step`](Executor::step) left (after the trainer read or changed them, if it wants to): each
    /// rank's stages on a thread of their own, as the step ran them. Refused with
    /// [`RuntimeError::NoGradients`] when no step succeeded since the last optimizer step; the
    /// first stage that fails (an error or a panic) is named.
    pub fn optimizer_step(&mut self) -> Result<(), RuntimeError> {
        self.ready.take()?;
        let schedule = &self.schedule;
        let rank_of = |s: usize| schedule.rank_of(s);
        let mut ranks = by_rank(schedule, &mut self.stages).into_iter();
        let here = ranks.next();
        std::thread::scope(|scope| {
            let others: Vec<_> = ranks
                .map(|stages| scope.spawn(move || optimizer_steps(stages, rank_of)))
                .collect();
            let mut result = here.map_or(Ok(()), |stages| optimizer_steps(stages, rank_of));
            for (i, h) in others.into_iter().enumerate() {
                let r = h.join().unwrap_or_else(|_| Err(lost_optimizer(i + 1)));
                result = result.and(r);
            }
            result
        })
    }

    /// [`step_with`](Executor::step_with) with a hook of its own for each rank: `hook_of(rank)`
    /// is called once per rank before the step, and each rank's hook is an `FnMut` called only by
    /// that rank, with its events in its list's order (no `Mutex` and no `Sync` needed: send the
    /// events down a channel, or count them).
    ///
    /// ```
    /// # use pipefill_host::runtime::{Executor, Stage, StageError, StepEvent, Tensor};
    /// # use pipefill_host::schedule::{families, Params};
    /// # struct Id;
    /// # impl Stage for Id {
    /// #     type Stash = ();
    /// #     fn forward(&mut self, x: Tensor) -> Result<(Tensor, ()), StageError> { Ok((x, ())) }
    /// #     fn backward_input(&mut self, _: &mut (), g: Tensor) -> Result<Tensor, StageError> { Ok(g) }
    /// #     fn backward_weight(&mut self, _: ()) -> Result<(), StageError> { Ok(()) }
    /// #     fn held_bytes(&self, _: &()) -> usize { 0 }
    /// #     fn zero_grad(&mut self) {}
    /// #     fn optimizer_step(&mut self) -> Result<(), StageError> { Ok(()) }
    /// # }
    /// use std::sync::mpsc;
    /// let schedule = families::generate("1f1b", &Params::new(2, 4)).unwrap();
    /// let mut ex = Executor::new(schedule, vec![Id, Id]).unwrap();
    /// let loss = |y: &Tensor, _: &Tensor| Ok((0.0, y.clone()));
    /// let x = vec![Tensor::zeros(vec![1, 1]); 4];
    /// let (tx, rx) = mpsc::channel();
    /// ex.step_with_each(x.clone(), &x, &loss, |rank| {
    ///     let tx = tx.clone();
    ///     let mut done = 0;
    ///     move |event| {
    ///         if let StepEvent::ActionDone { .. } = event {
    ///             done += 1;
    ///             tx.send((rank, done)).unwrap();
    ///         }
    ///     }
    /// })
    /// .unwrap();
    /// drop(tx);
    /// // Each rank ran 4 F and 4 B; its hook counted them in order.
    /// let last: Vec<(usize, i32)> = rx.iter().filter(|(_, n)| *n == 8).collect();
    /// assert_eq!(last.len(), 2);
    /// ```
    pub fn step_with_each<L, F, H>(
        &mut self,
        inputs: Vec<Tensor>,
        targets: &[Tensor],
        loss: &L,
        hook_of: F,
    ) -> Result<StepReport, RuntimeError>
    where
        L: Loss,
        F: FnMut(usize) -> H,
        H: FnMut(StepEvent) + Send,
    {
        let hooks = EachRank::new(self.schedule.ranks, hook_of);
        self.step_with(inputs, targets, loss, |event| hooks.tell(event))
    }

    /// [`step`](Executor::step), also returning each rank's [`StepEvent`]s in the order they
    /// happened on it (`events[rank]`), gathered over a channel
    /// ([`step_with_each`](Executor::step_with_each)).
    pub fn step_with_events<L: Loss>(
        &mut self,
        inputs: Vec<Tensor>,
        targets: &[Tensor],
        loss: &L,
    ) -> Result<(StepReport, Vec<Vec<StepEvent>>), RuntimeError> {
        let events = Events::new();
        let report = self.step_with_each(inputs, targets, loss, |_| events.hook())?;
        Ok((report, events.by_rank(self.schedule.ranks)))
    }

    /// Runs every rank's list (the training program, or with `evaluation` the forward-only one)
    /// and returns the ranks' outcomes in rank order with the wall-clock seconds.
    fn run_ranks<L: Loss>(
        &mut self,
        evaluation: bool,
        inputs: Vec<Tensor>,
        targets: &[Tensor],
        loss: &L,
        hook: Option<&(dyn Fn(StepEvent) + Sync)>,
    ) -> Result<(Vec<RankOutcome>, f64), RuntimeError> {
        let m = self.schedule.microbatches;
        if inputs.len() != m || targets.len() != m {
            return Err(RuntimeError::BatchCount {
                microbatches: m,
                inputs: inputs.len(),
                targets: targets.len(),
            });
        }
        let p = self.schedule.ranks;
        let lock = Mutex::new(());
        let epoch = Instant::now();
        let first_rank = self.schedule.rank_of(0);
        let mut transports = Channels::connect(p, self.poll);
        let local = by_rank(&self.schedule, &mut self.stages);
        let mut inputs = Some(inputs);
        let program = if evaluation {
            &self.evaluation
        } else {
            &self.program
        };
        let schedule = &self.schedule;
        let reduce = if evaluation {
            None
        } else {
            self.reducer.as_deref()
        };
        let exclusive = self.exclusive.then_some(&lock);
        let recompute = &self.recompute;
        let steps: Vec<RankStep<'_, S, L>> = local
            .into_iter()
            .enumerate()
            .map(|(rank, stages)| RankStep {
                schedule,
                program,
                rank,
                stages,
                inputs: if rank == first_rank {
                    inputs.take().unwrap_or_default()
                } else {
                    Vec::new()
                },
                targets,
                loss,
                epoch,
                exclusive,
                hook,
                reduce,
                recompute,
            })
            .collect();
        let outputs: Vec<RankOutcome> = std::thread::scope(|scope| {
            // The other ranks start first; the rank holding stage 0 (whose list starts with work
            // that waits for nobody) runs here, which saves starting and joining one thread.
            let mut here = None;
            let mut handles = Vec::with_capacity(p);
            for (step, transport) in steps.into_iter().zip(transports.iter_mut()) {
                let rank = step.rank;
                if rank == first_rank {
                    here = Some((step, transport));
                } else {
                    handles.push((rank, scope.spawn(move || run_rank(step, transport))));
                }
            }
            let mine = here.map(|(step, t)| (step.rank, run_rank(step, t)));
            let mut outputs: Vec<(usize, RankOutcome)> = handles
                .into_iter()
                .map(|(r, h)| (r, h.join().unwrap_or_else(|_| lost_worker(r))))
                .chain(mine)
                .collect();
            outputs.sort_by_key(|(r, _)| *r);
            outputs.into_iter().map(|(_, o)| o).collect()
        });
        Ok((outputs, epoch.elapsed().as_secs_f64()))
    }

    /// A training step: the ranks' outcomes assembled into the report; the gradients are ready for
    /// [`optimizer_step`](Executor::optimizer_step) only when it succeeded.
    fn train_step<L: Loss>(
        &mut self,
        inputs: Vec<Tensor>,
        targets: &[Tensor],
        loss: &L,
        hook: Option<&(dyn Fn(StepEvent) + Sync)>,
    ) -> Result<StepReport, RuntimeError> {
        self.ready.stepped(false);
        let (outcomes, seconds) = self.run_ranks(false, inputs, targets, loss, hook)?;
        let report = assemble(&self.schedule, outcomes, seconds);
        self.ready.stepped(report.is_ok());
        report
    }
}

/// `(global stage, stage)` of each rank's stages, by rank.
fn by_rank<'a, S>(schedule: &Schedule, stages: &'a mut [S]) -> Vec<Vec<(usize, &'a mut S)>> {
    let mut local: Vec<Vec<(usize, &mut S)>> = (0..schedule.ranks).map(|_| Vec::new()).collect();
    for (s, stage) in stages.iter_mut().enumerate() {
        local[schedule.rank_of(s)].push((s, stage));
    }
    local
}

/// The error of a rank whose optimizer thread was lost (the steps themselves catch panics).
fn lost_optimizer(rank: usize) -> RuntimeError {
    RuntimeError::Internal {
        rank,
        message: "the optimizer step's thread was lost".into(),
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
