//! `train --data-parallel D`: `D` pipeline replicas in one process, gradients averaged per stage.

use std::io::IsTerminal;

use pipefill_host::runtime::{Executor, Replicas, StepReport};

use super::{outcome, output, Chosen, Format, Outcome, Setup};
use crate::cli::CliError;
use crate::model::{stage_ranges, Teacher};

/// Trains `--steps` steps with `D` replicas: replica `d` takes microbatches `d*M .. (d+1)*M` of the
/// global batch split into `M * D` (the same rows, in the same order, as one replica's `M`). The
/// reported loss of a step is the mean over replicas; the timelines are replica 0's.
pub fn train(setup: &Setup, chosen: &Chosen) -> Result<Outcome, CliError> {
    let a = &setup.args;
    let (d, m) = (a.data_parallel, a.microbatches);
    let failed = |e: String| CliError::Failed(e);
    let plan = &chosen.plan;
    let mut executors = Vec::with_capacity(d);
    for _ in 0..d {
        // Same seed: every replica starts from the same weights.
        let stages = setup
            .spec
            .build_stages(
                &stage_ranges(&plan.layers_per_stage),
                setup.optimizer,
                setup.gemm,
                a.seed,
            )
            .map_err(|e| failed(e.0))?;
        let mut ex =
            Executor::new(plan.schedule.clone(), stages).map_err(|e| failed(e.to_string()))?;
        ex.set_exclusive(a.replay);
        executors.push(ex);
    }
    let mut replicas = Replicas::new(executors).map_err(|e| failed(e.to_string()))?;
    let teacher = Teacher::new(&setup.spec, a.seed);
    let loss = setup.spec.loss;
    let text = a.format == Format::Text;
    let mut progress = output::Progress::new(a.steps, text && std::io::stderr().is_terminal());
    let mut reports: Vec<StepReport> = Vec::with_capacity(a.steps);
    for step in 0..a.steps {
        let (x, t) = teacher.batch(step as u64, setup.spec.batch, m * d);
        let (xs, ts) = (split(x, m), split(t, m));
        let mut r = replicas
            .step(xs, &ts, &loss)
            .map_err(|e| failed(format!("step {step}: {e}")))?;
        let mean = r.iter().map(|r| r.loss).sum::<f32>() / d as f32;
        let seconds = r.iter().map(|r| r.seconds).fold(0.0, f64::max);
        let mut first = r.swap_remove(0);
        first.loss = mean;
        first.seconds = seconds;
        progress.step(step, first.loss, first.seconds, text);
        reports.push(first);
    }
    progress.finish();
    outcome(setup, chosen, &reports)
}

/// `v` in consecutive chunks of `m`.
fn split<T>(v: Vec<T>, m: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut it = v.into_iter().peekable();
    while it.peek().is_some() {
        out.push(it.by_ref().take(m).collect());
    }
    out
}
