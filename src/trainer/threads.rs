//! [`Threads`]: the threaded executor as a [`StepRunner`]: one OS thread per rank, and with `D > 1`
//! replicas the runtime's [`Replicas`] (each stage's gradients averaged over the replicas as soon
//! as its last backward is done, on its rank's thread).

use pipefill_host::runtime::{Executor, Loss, Replicas, Stage};

use super::{
    by_replica, combine, optimizer_failed, states_of, HostBatch, Saver, StepResult, StepRunner,
    TrainError, Trainable,
};

/// One executor, or `D` replicas of it.
enum Pipes<S: Stage> {
    One(Executor<S>),
    Many(Replicas<S>),
}

/// The threaded runner over stages `S` with the loss `L`.
pub struct Threads<S: Stage, L> {
    pipes: Pipes<S>,
    loss: L,
    /// Microbatches per replica, `M`.
    microbatches: usize,
}

impl<S: Stage + Trainable, L: Loss> Threads<S, L> {
    /// The runner over one executor per replica (same schedule, stages with equal weights): one
    /// executor runs alone, several as data-parallel replicas. `microbatches` is `M`, each
    /// replica's share of a step's `M x D`.
    pub fn new(
        mut executors: Vec<Executor<S>>,
        loss: L,
        microbatches: usize,
    ) -> Result<Self, TrainError> {
        let pipes = if executors.len() == 1 {
            Pipes::One(executors.remove(0))
        } else {
            Pipes::Many(Replicas::new(executors).map_err(|e| TrainError::Runner(e.to_string()))?)
        };
        Ok(Threads {
            pipes,
            loss,
            microbatches,
        })
    }

    /// Replica 0's executor.
    pub fn first(&self) -> Option<&Executor<S>> {
        match &self.pipes {
            Pipes::One(ex) => Some(ex),
            Pipes::Many(r) => r.executors().first(),
        }
    }
}

impl<S: Stage + Trainable, L: Loss> StepRunner for Threads<S, L> {
    fn step(&mut self, step: usize, (x, t): HostBatch) -> StepResult {
        let failed = |e: pipefill_host::runtime::RuntimeError| TrainError::Step {
            step,
            message: e.to_string(),
        };
        let r = match &mut self.pipes {
            Pipes::One(ex) => ex.step(x, &t, &self.loss).map_err(failed)?,
            Pipes::Many(replicas) => {
                let m = self.microbatches;
                let (xs, ts) = (by_replica(x, m), by_replica(t, m));
                combine(replicas.step(xs, &ts, &self.loss).map_err(failed)?)?
            }
        };
        Ok(Some(r))
    }

    fn optimizer_step(&mut self, step: usize) -> Result<(), TrainError> {
        match &mut self.pipes {
            Pipes::One(ex) => ex.optimizer_step(),
            Pipes::Many(replicas) => replicas.optimizer_step(),
        }
        .map_err(|e| optimizer_failed(step, e))
    }

    fn save(&mut self, saver: &Saver, done: usize) -> Result<(), TrainError> {
        let ex = self
            .first()
            .ok_or_else(|| TrainError::Runner("no replica".into()))?;
        let states = states_of(ex.stages().iter().enumerate(), done)?;
        saver.save(done, ex.schedule(), states)
    }
}
