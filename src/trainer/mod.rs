//! The one loop that trains: batch -> step -> progress -> checkpoint -> report, over one
//! [`StepRunner`] interface that every backend and launcher implements.
//!
//! [`train`] draws each step's global batch from the [`Teacher`] (it depends on `(seed, step)`
//! only, so a resumed run sees what an uninterrupted one would), hands it to the runner (whose step
//! ends with the gradients ready, averaged over replicas), asks the runner for the optimizer step,
//! shows the step's loss and time through a [`Progress`], saves a checkpoint when the [`Saver`]
//! says one is due, and at the end sums the steps' reports up into an [`Outcome`]. The runners:
//!
//! - [`Threads`]: the threaded executor, one OS thread per rank, `D` replicas side by side with
//!   their gradients averaged as soon as each stage's last backward is done ([`threads`]);
//! - [`Streams`]: the stream executor on any [`Device`](pipefill_host::runtime::streams::Device)
//!   (CUDA streams, with or without a captured whole-step graph, or their CPU twin
//!   [`CpuStreams`](pipefill_host::runtime::streams::CpuStreams)), `D` replicas on host threads
//!   of their own with their gradients averaged through the same `Reducer` once each replica's
//!   device synchronised ([`streams`]);
//! - one process per rank under MPI, CPU ranks or GPU ranks over NCCL (the `mpi` feature; the
//!   command line's launcher builds them).
//!
//! What a runner needs of its stages beyond running them (their checkpoint state) is
//! [`Trainable`] ([`stage`]).

pub mod cuda;
mod outcome;
mod saver;
pub mod stage;
pub mod streams;
pub mod threads;

pub use outcome::{median_index, Outcome};
pub use saver::Saver;
pub use stage::{states_of, Trainable};
pub use streams::{HostEnqueue, Streams, Upload};
pub use threads::Threads;

use std::path::PathBuf;
use std::time::Instant;

use pipefill_host::plan::Plan;
use pipefill_host::runtime::{StepReport, Tensor};
use thiserror::Error;

use crate::checkpoint::CheckpointError;
use crate::model::Teacher;

/// Why training stopped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TrainError {
    /// A step failed (a stage, the device, a rank, a transfer).
    #[error("step {step}: {message}")]
    Step {
        /// The step (from 0).
        step: usize,
        /// What failed.
        message: String,
    },
    /// A checkpoint could not be written.
    #[error("checkpoint `{}`: saving step {step}: {source}", dir.display())]
    Save {
        /// The checkpoint folder.
        dir: PathBuf,
        /// Steps done when saving.
        step: usize,
        /// What failed.
        source: CheckpointError,
    },
    /// The runner could not be built or could not go on (a device, a message between processes).
    #[error("{0}")]
    Runner(String),
    /// The run trained no step (nothing to report).
    #[error("no step was trained")]
    NoStep,
}

/// Steps `first_step..steps` of one run, and where its batches come from.
pub struct Run<'a> {
    /// The plan trained (schedule, split, the costs it was scored with).
    pub plan: &'a Plan,
    /// The data: each step's global batch.
    pub teacher: &'a Teacher,
    /// Rows of the global batch.
    pub batch: usize,
    /// Microbatches of the global batch: `M x D` (each replica takes `M` consecutive ones).
    pub microbatches: usize,
    /// Steps trained before (from a checkpoint; 0 otherwise).
    pub first_step: usize,
    /// Steps in all (the run trains `first_step..steps`).
    pub steps: usize,
    /// Checkpoints, if any.
    pub saver: Option<&'a Saver>,
    /// The measured timeline is rebuilt by the simulator from the action durations
    /// (`--replay`: one layer call at a time).
    pub replay: bool,
}

/// A step's global batch on the host: the microbatches' inputs and targets.
pub type HostBatch = (Vec<Tensor>, Vec<Tensor>);

/// What [`StepRunner::step`] returns: the step's report where this process reports.
pub type StepResult = Result<Option<StepReport>, TrainError>;

/// The error of step `step`'s optimizer step.
pub fn optimizer_failed(step: usize, e: impl std::fmt::Display) -> TrainError {
    TrainError::Step {
        step,
        message: format!("optimizer step: {e}"),
    }
}

/// One training step's work, on whatever backend and launcher: implemented by every runner.
pub trait StepRunner {
    /// Runs step `step` on its global batch (inputs and targets of the `M x D` microbatches,
    /// replica `d` taking `d*M .. (d+1)*M`); the step's report where this process reports
    /// (`None` on the other processes of a multi-process run). The report's loss is the mean over
    /// replicas, its time the slowest replica's, its timeline replica 0's. The step ends with the
    /// gradients ready (averaged over the replicas), not applied.
    fn step(&mut self, step: usize, batch: HostBatch) -> StepResult;

    /// Applies the optimizer to the gradients step `step` left, on every replica and rank this
    /// process runs (the runtime's `optimizer_step`); called by [`train`] after each step.
    fn optimizer_step(&mut self, step: usize) -> Result<(), TrainError>;

    /// Saves the checkpoint after `done` steps (replica 0's stages: every replica holds the same).
    fn save(&mut self, saver: &Saver, done: usize) -> Result<(), TrainError>;

    /// The host's enqueue time per action (the stream runner's; `None` elsewhere).
    fn host_enqueue(&self) -> Option<HostEnqueue> {
        None
    }
}

/// Where the loop shows each step (a bar, lines, or nothing).
pub trait Progress {
    /// Step `step` (from 0) finished with `loss` in `seconds`.
    fn step(&mut self, step: usize, loss: f32, seconds: f64);
    /// The run is over.
    fn finish(&mut self) {}
}

/// Shows nothing (a process that does not report).
pub struct Silent;

impl Progress for Silent {
    fn step(&mut self, _: usize, _: f32, _: f64) {}
}

/// Trains `run`'s steps with `runner`: for each step, its batch, the step, the optimizer step, its
/// progress and, when due, a checkpoint; then the report. `None` on a process that does not
/// report. A step's reported time includes its optimizer step.
pub fn train(
    run: &Run<'_>,
    runner: &mut dyn StepRunner,
    progress: &mut dyn Progress,
) -> Result<Option<Outcome>, TrainError> {
    let mut reports: Vec<StepReport> = Vec::new();
    let mut reporting = false;
    for step in run.first_step..run.steps {
        let batch = run.teacher.batch(step as u64, run.batch, run.microbatches);
        let report = runner.step(step, batch)?;
        let optimizer = Instant::now();
        runner.optimizer_step(step)?;
        if let Some(mut r) = report {
            r.seconds += optimizer.elapsed().as_secs_f64();
            progress.step(step, r.loss, r.seconds);
            reports.push(r);
            reporting = true;
        }
        if let Some(s) = run.saver.filter(|s| s.due(step + 1)) {
            runner.save(s, step + 1)?;
        }
    }
    progress.finish();
    if !reporting {
        return Ok(None);
    }
    let mut o = Outcome::of(run.plan, run.first_step, &reports, run.replay)?;
    o.host_enqueue = runner.host_enqueue();
    Ok(Some(o))
}

/// `v` in consecutive chunks of `m` (a global batch's microbatches, by replica).
pub fn by_replica<T>(v: Vec<T>, m: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut it = v.into_iter().peekable();
    while it.peek().is_some() {
        out.push(it.by_ref().take(m.max(1)).collect());
    }
    out
}

/// One step report from the replicas' (`D >= 1`): replica 0's, with the mean loss and the slowest
/// replica's time.
pub fn combine(mut reports: Vec<StepReport>) -> Result<StepReport, TrainError> {
    let d = reports.len();
    if d == 0 {
        return Err(TrainError::Runner("no replica reported".into()));
    }
    let mean = reports.iter().map(|r| r.loss).sum::<f32>() / d as f32;
    let seconds = reports.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let mut first = reports.swap_remove(0);
    if d > 1 {
        first.loss = mean;
        first.seconds = seconds;
    }
    Ok(first)
}
