//! Data parallelism in one process: [`AllReduce`] averages each stage's gradients over `D` pipeline
//! replicas, and [`Replicas`] runs the `D` [`Executor`]s of a step side by side.
//!
//! Each replica trains on its own share of the global batch (`batch / D` rows, as `M` microbatches);
//! because every microbatch gradient is already scaled by `1 / M`, the mean of the replicas'
//! gradients is the gradient of the mean loss over the global batch: the math of one replica
//! training on the whole batch. The reduction of a stage starts on its rank's thread as soon as the
//! stage's last `W`/`B` is done (through [`Executor::set_reducer`]), so it overlaps the cool-down of
//! the other stages; a step ends with every replica holding the mean, and
//! [`Replicas::optimizer_step`] applies it on every replica.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::{Executor, Loss, Reducer, RuntimeError, Stage, StageError, StepReport, Tensor};

/// What one stage's reduction holds while replicas arrive.
#[derive(Default)]
struct Slot {
    /// Each replica's flattened gradients, by replica.
    parts: Vec<Option<Vec<f32>>>,
    /// The mean, once every replica arrived.
    mean: Option<Vec<f32>>,
    /// Replicas that copied the mean back.
    taken: usize,
    /// Rounds completed (a replica waits for the round it joined).
    round: u64,
}

/// An in-process all-reduce (mean) of each stage's gradients over `D` replicas.
///
/// Deterministic: the mean is summed in replica order whatever order the replicas arrive in, so a
/// run is bit-for-bit repeatable. If a replica fails, [`poison`](AllReduce::poison) wakes the others
/// with an error instead of leaving them waiting.
///
/// ```
/// use std::sync::Arc;
/// use pipefill_host::runtime::AllReduce;
/// let ar = Arc::new(AllReduce::new(2, 1));
/// let other = Arc::clone(&ar);
/// let t = std::thread::spawn(move || {
///     let mut g = vec![3.0f32, 5.0];
///     other.reduce(1, 0, vec![&mut g[..]]).unwrap();
///     g
/// });
/// let mut g = vec![1.0f32, 1.0];
/// ar.reduce(0, 0, vec![&mut g[..]]).unwrap();
/// assert_eq!(g, vec![2.0, 3.0]);
/// assert_eq!(t.join().unwrap(), vec![2.0, 3.0]);
/// ```
pub struct AllReduce {
    replicas: usize,
    slots: Vec<Mutex<Slot>>,
    cond: Condvar,
    poisoned: AtomicBool,
}

impl AllReduce {
    /// A reduction over `replicas` replicas of a model with `stages` stages.
    pub fn new(replicas: usize, stages: usize) -> Self {
        AllReduce {
            replicas,
            slots: (0..stages).map(|_| Mutex::new(Slot::default())).collect(),
            cond: Condvar::new(),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Replica `replica`'s part of stage `stage`'s reduction: waits for every replica, then leaves
    /// the mean of all replicas' `grads` in `grads`.
    pub fn reduce(
        &self,
        replica: usize,
        stage: usize,
        mut grads: Vec<&mut [f32]>,
    ) -> Result<(), StageError> {
        let slot = self
            .slots
            .get(stage)
            .ok_or_else(|| StageError::new(format!("no stage {stage} to reduce")))?;
        let mut s = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if s.parts.len() != self.replicas {
            s.parts = vec![None; self.replicas];
        }
        let flat: Vec<f32> = grads.iter().flat_map(|g| g.iter().copied()).collect();
        if s.parts.get(replica).is_none_or(Option::is_some) {
            return Err(StageError::new(format!(
                "replica {replica} reduced stage {stage} twice (or there is no such replica)"
            )));
        }
        s.parts[replica] = Some(flat);
        let round = s.round;
        if s.parts.iter().all(Option::is_some) {
            s.mean = Some(mean(&s.parts)?);
            self.cond.notify_all();
        }
        while s.round == round && s.mean.is_none() {
            if self.poisoned.load(Ordering::SeqCst) {
                return Err(StageError::new("another replica failed"));
            }
            s = self
                .cond
                .wait_timeout(s, Duration::from_millis(10))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let mean = s
            .mean
            .as_ref()
            .ok_or_else(|| StageError::new("lost round"))?;
        let mut at = 0;
        for g in grads.iter_mut() {
            let n = g.len();
            g.copy_from_slice(&mean[at..at + n]);
            at += n;
        }
        s.taken += 1;
        if s.taken == self.replicas {
            *s = Slot {
                round: round + 1,
                ..Slot::default()
            };
        }
        Ok(())
    }

    /// Wakes every waiting replica with an error (a replica failed) and refuses later rounds.
    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
        self.cond.notify_all();
    }

    /// Clears a poisoning and any half-done round (before retrying a step).
    pub fn reset(&self) {
        for slot in &self.slots {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = Slot::default();
        }
        self.poisoned.store(false, Ordering::SeqCst);
    }
}

/// The element-wise mean of equally long parts, summed in order.
fn mean(parts: &[Option<Vec<f32>>]) -> Result<Vec<f32>, StageError> {
    let first = parts.first().and_then(Option::as_ref).map_or(0, Vec::len);
    let mut sum = vec![0.0f32; first];
    for p in parts.iter().flatten() {
        if p.len() != first {
            return Err(StageError::new(format!(
                "replicas hold {} and {} gradient values for the same stage",
                first,
                p.len()
            )));
        }
        sum.iter_mut().zip(p).for_each(|(s, v)| *s += v);
    }
    let n = parts.len() as f32;
    sum.iter_mut().for_each(|s| *s /= n);
    Ok(sum)
}

/// `D` pipeline replicas of one schedule in one process, their gradients averaged by an
/// [`AllReduce`] during every step; [`optimizer_step`](Replicas::optimizer_step) then applies them.
pub struct Replicas<S: Stage> {
    executors: Vec<Executor<S>>,
    reduce: Arc<AllReduce>,
}

impl<S: Stage> Replicas<S> {
    /// Replicas from one executor per replica (same schedule; stages with equal weights).
    pub fn new(mut executors: Vec<Executor<S>>) -> Result<Self, RuntimeError> {
        let stages = executors.first().map_or(0, |e| e.schedule().stages());
        if executors.is_empty() {
            return Err(RuntimeError::NoStages);
        }
        let reduce = Arc::new(AllReduce::new(executors.len(), stages));
        for (d, ex) in executors.iter_mut().enumerate() {
            let ar = Arc::clone(&reduce);
            let reducer: Arc<Reducer> = Arc::new(move |stage, grads| ar.reduce(d, stage, grads));
            ex.set_reducer(Some(reducer));
        }
        Ok(Replicas { executors, reduce })
    }

    /// The executors, one per replica.
    pub fn executors(&self) -> &[Executor<S>] {
        &self.executors
    }

    /// The executors, one per replica, for changes between steps.
    pub fn executors_mut(&mut self) -> &mut [Executor<S>] {
        &mut self.executors
    }

    /// Every replica's optimizer step ([`Executor::optimizer_step`]), on the averaged gradients
    /// the last [`step`](Replicas::step) left; the first failure is returned.
    pub fn optimizer_step(&mut self) -> Result<(), RuntimeError> {
        self.executors
            .iter_mut()
            .map(Executor::optimizer_step)
            .fold(Ok(()), Result::and)
    }

    /// One step of every replica at once: `inputs[d]` / `targets[d]` are replica `d`'s `M`
    /// microbatches. Returns each replica's report; the step's loss is the mean of theirs. The step
    /// ends with every replica's gradients averaged; [`optimizer_step`](Replicas::optimizer_step)
    /// applies them.
    pub fn step<L: Loss>(
        &mut self,
        inputs: Vec<Vec<Tensor>>,
        targets: &[Vec<Tensor>],
        loss: &L,
    ) -> Result<Vec<StepReport>, RuntimeError> {
        let d = self.executors.len();
        if inputs.len() != d || targets.len() != d {
            return Err(RuntimeError::Internal {
                rank: 0,
                message: format!(
                    "{d} replicas need {d} input and target sets, got {} and {}",
                    inputs.len(),
                    targets.len()
                ),
            });
        }
        self.reduce.reset();
        let items = self.executors.iter_mut().zip(inputs).zip(targets);
        on_replicas(
            &self.reduce,
            items.collect(),
            lost_replica,
            |_, ((ex, x), t)| ex.step(x, t, loss),
        )
    }
}

/// The error of replica `d` whose thread panicked.
fn lost_replica(d: usize) -> RuntimeError {
    RuntimeError::Internal {
        rank: 0,
        message: format!("replica {d}'s thread panicked"),
    }
}

/// Runs `step(d, items[d])` for every replica `d` at once, each on a thread of its own: how
/// replicas whose steps reduce through `reduce` (which waits for every replica) run, on the
/// threaded path ([`Replicas`]) and on the stream path (a trainer's stream replicas). A replica
/// that fails (or whose thread panics: `lost(d)`) poisons `reduce`, so the others stop waiting in
/// it. The results by replica, or the error of the first replica to fail: the cause, since the
/// others fail only after it poisoned the reduction they wait in.
pub fn on_replicas<I: Send, R: Send, E: Send>(
    reduce: &AllReduce,
    items: Vec<I>,
    lost: fn(usize) -> E,
    step: impl Fn(usize, I) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E> {
    let first_failed = AtomicUsize::new(usize::MAX);
    let (first_failed, step) = (&first_failed, &step);
    let results: Vec<Result<R, E>> = std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .into_iter()
            .enumerate()
            .map(|(d, item)| {
                scope.spawn(move || {
                    let r = step(d, item);
                    if r.is_err() {
                        let _ = first_failed.compare_exchange(
                            usize::MAX,
                            d,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        );
                        reduce.poison();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(d, h)| {
                h.join().unwrap_or_else(|_| {
                    reduce.poison();
                    Err(lost(d))
                })
            })
            .collect()
    });
    let cause = first_failed.load(Ordering::SeqCst);
    let mut out = Vec::with_capacity(results.len());
    let mut first_error = None;
    for (d, r) in results.into_iter().enumerate() {
        match r {
            Ok(r) => out.push(r),
            Err(e) if d == cause => return Err(e),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(out),
    }
}
