//! `train --data-parallel D`: `D` pipeline replicas in one process, gradients averaged per stage.

use pipefill_host::runtime::{Executor, Replicas, StepReport};

use super::{build, checkpoint, outcome, progress, Chosen, Format, Outcome, Setup};
use crate::cli::CliError;
use crate::model::Teacher;

/// Trains `--steps` steps with `D` replicas: replica `d` takes microbatches `d*M .. (d+1)*M` of the
/// global batch split into `M * D` (the same rows, in the same order, as one replica's `M`). The
/// reported loss of a step is the mean over replicas, its time the slowest replica's; the timelines
/// are replica 0's. Every replica starts from the same weights (the seed's, or `--resume`'s) and
/// applies the same averaged gradients, so a checkpoint saves replica 0's stages.
pub fn train(setup: &Setup, chosen: &Chosen) -> Result<Outcome, CliError> {
    let a = &setup.args;
    let (d, m) = (a.data_parallel, a.microbatches);
    let failed = |e: String| CliError::Failed(e);
    let plan = &chosen.plan;
    let mut executors = Vec::with_capacity(d);
    let mut first_step = 0;
    for _ in 0..d {
        let (stages, first) = build(setup, plan)?;
        first_step = first;
        let mut ex =
            Executor::new(plan.schedule.clone(), stages).map_err(|e| failed(e.to_string()))?;
        ex.set_exclusive(a.replay);
        executors.push(ex);
    }
    let mut replicas = Replicas::new(executors).map_err(|e| failed(e.to_string()))?;
    let saver = checkpoint::Saver::new(setup, plan);
    let teacher = Teacher::new(&setup.spec, a.seed);
    let loss = setup.spec.loss;
    let text = a.format == Format::Text;
    let mut progress = progress(setup, first_step);
    let mut reports: Vec<StepReport> = Vec::new();
    for step in first_step..a.steps {
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
        if let Some(s) = saver.as_ref().filter(|s| s.due(step + 1)) {
            let ex = &replicas.executors()[0];
            s.save(step + 1, ex.schedule(), ex.stages())?;
        }
    }
    progress.finish();
    outcome(setup, plan, first_step, &reports)
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
