//! `pipefill train`: the main job. Trains the built-in model with a pipeline schedule on CPU threads.
//!
//! The flow, one function per phase; the CLI parses, calls the library and prints:
//!
//! 1. [`setup()`]: check the flags, build the model description;
//! 2. [`profile`]: time every layer's `F`, `I`, `W` briefly on one microbatch (the same
//!    measurement as `pipefill profile`, [`profile_model`]), on the CPU backend, which states its
//!    overlap share in the cost file;
//! 3. [`plans`]: the host planner scores each schedule family that fits and `auto` (or only
//!    `--schedule`, or the `--schedule-file`, whatever its name): its split (`--plan auto`: the best partition;
//!    `--plan uniform`: equal layer counts) simulated under the profile
//!    ([`pipefill_host::plan::plan_families`], [`pipefill_host::plan::plan_schedule`]); the best
//!    predicted step time is chosen;
//! 4. [`train`]: build the backend's step runner (CPU: one thread per rank; `--backend cuda`: the
//!    stream runtime, one host thread enqueuing per-rank streams; `D` replicas of either) and run
//!    [the one training loop](crate::trainer::train) over it: batches, steps, progress, checkpoints;
//! 5. [`report`]: losses, step time, measured vs predicted bubble per rank, the SVG, JSON.

mod checkpoint;
mod cuda;
mod devices;
#[cfg(feature = "mpi")]
mod launch;
mod output;
mod setup;

use std::io::IsTerminal;

use pipefill_host::cost::CostFile;
use pipefill_host::plan::{
    plan_families, plan_schedule, Plan, PlanError, PlanReport, Skipped, Split,
};
use pipefill_host::profile::{ProfileOptions, TimeSource};
use pipefill_host::runtime::Executor;
use pipefill_host::schedule::auto::AUTO;
use pipefill_host::schedule::Placement;
use pipefill_host::schedule::{families, Params};
use pipefill_host::sim::{simulate_with, DeviceSharing, SimOptions};
use pipefill_host::timeline::Timeline;

pub use crate::trainer::Outcome;
pub use checkpoint::{CheckpointArgs, Resume};
pub use setup::{setup, Args, Format, Launcher, Setup, TrainPlan};

use super::auto_flags;
use super::auto_plan::auto_schedule;
use super::profile::{pool_same_shape, profile_model, Backend, Measure};
use super::CliError;
use crate::layers::LinearStage;
use crate::model::{stage_ranges, Teacher};
use crate::trainer::{self, Run, Silent, StepRunner, Threads, TrainError};

/// The plan trained with, and its predicted timeline.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// The host planner's plan: schedule, split, the costs it was scored with.
    pub plan: Plan,
    /// The simulator's timeline of the plan under those costs.
    pub predicted: Timeline,
}

/// Runs `pipefill train`.
pub fn run(args: Args) -> Result<(), CliError> {
    #[cfg(feature = "mpi")]
    if args.launcher == Launcher::Mpi {
        return launch::run(args);
    }
    let setup = setup(args)?;
    // The `--checkpoint` folder's lock, held to the end of the run and taken before any work
    // (profile, plan, steps): a second run on the folder is refused at once.
    let _lock = (setup.args.checkpoint.checkpoint.as_deref())
        .map(checkpoint::lock_folder)
        .transpose()?;
    let mut plans = candidates(&setup)?;
    if setup.devices.as_ref().is_some_and(|d| d.shared()) {
        // All ranks share GPU 0: rank the candidates by the shared-device model, and hold the
        // run against that prediction. With a GPU per rank the per-rank simulation stands.
        plans = on_one_device(plans);
    }
    let chosen = choose(&plans)?;
    let outcome = train(&setup, &chosen)?;
    report(&setup, &plans, &chosen, &outcome)
}

/// The candidate plans, best first: profiled and planned, or the `--resume` checkpoint's plan
/// (a resumed run keeps its schedule, partition and costs).
pub fn candidates(setup: &Setup) -> Result<Vec<Plan>, CliError> {
    Ok(match &setup.resume {
        Some(r) => vec![r.manifest.plan.clone()],
        None => plans(setup, &profile(setup)?)?.plans,
    })
}

/// The best of `plans` (sorted best first), with its predicted timeline (the shared-device one
/// for a plan re-scored for one device).
pub fn choose(plans: &[Plan]) -> Result<Chosen, CliError> {
    let (at, ties) =
        near_tie_choice(plans).ok_or_else(|| CliError::Failed("no candidate schedule".into()))?;
    let plan = plans[at].clone();
    if ties > 1 {
        eprintln!(
            "near-tie: {ties} candidates within {:.0}% of the best predicted step time; chose {} \
             (V = {}) as the simplest family among them, then the fewest chunks (predictions this \
             close are within the profile's noise)",
            NEAR_TIE * 100.0,
            plan.family,
            plan.chunks
        );
    }
    let predicted = match shared_timeline(&plan) {
        Some(t) if plan.step_time == t.makespan() => t,
        _ => plan
            .timeline()
            .map_err(|e| CliError::Failed(e.to_string()))?,
    };
    Ok(Chosen { plan, predicted })
}

/// Candidates whose predicted step time is within this share of the best one are a near-tie: the
/// profile's own noise (up to about 5% between two runs on a busy machine) could order them either way, so the first
/// of them by step time would change from run to run.
pub const NEAR_TIE: f64 = 0.05;

/// The indices of the candidates in a near-tie with the fastest.
fn tied(plans: &[Plan]) -> Vec<usize> {
    let best = plans
        .iter()
        .map(|p| p.step_time)
        .fold(f64::INFINITY, f64::min);
    (0..plans.len())
        .filter(|&i| plans[i].step_time <= best * (1.0 + NEAR_TIE))
        .collect()
}

/// The candidate to run: among those in a near-tie with the fastest, the simplest family (the
/// order of `FAMILIES`, `auto` last), then the fewest chunks, then the least peak memory; `None`
/// when there is none; with it, how many candidates were in the tie. A stated rule that depends on no measured time inside the tie (the split,
/// and so the memory, follows the profile), so two runs of the same job choose the same plan
/// even when the profile's noise reorders near-equal predictions.
fn near_tie_choice(plans: &[Plan]) -> Option<(usize, usize)> {
    let order = |family: &str| {
        families::FAMILIES
            .iter()
            .position(|f| f.name == family)
            .unwrap_or(families::FAMILIES.len())
    };
    let peak = |p: &Plan| p.peak_memory.iter().copied().fold(0.0, f64::max);
    let ties = tied(plans);
    let n = ties.len();
    ties.into_iter()
        .min_by(|&a, &b| {
            let (x, y) = (&plans[a], &plans[b]);
            order(&x.family)
                .cmp(&order(&y.family))
                .then(x.chunks.cmp(&y.chunks))
                .then(peak(x).total_cmp(&peak(y)))
                .then(x.step_time.total_cmp(&y.step_time))
        })
        .map(|at| (at, n))
}

/// `plan` simulated with every rank on one device (concurrent actions share it by the cost file's
/// overlap share: [`DeviceSharing::Shared`]); `None` for a schedule that mode does not take.
fn shared_timeline(plan: &Plan) -> Option<Timeline> {
    let options = SimOptions::ALL.on(DeviceSharing::Shared);
    simulate_with(&plan.schedule, &plan.cost, options)
        .ok()
        .map(|s| s.timeline)
}

/// Re-scores `plans` for ranks that all sit on one GPU: step time and bubble from the shared-device
/// simulation, best first (a plan the mode cannot take keeps its per-rank numbers and goes last).
fn on_one_device(plans: Vec<Plan>) -> Vec<Plan> {
    let mut scored: Vec<(bool, Plan)> = plans
        .into_iter()
        .map(|mut p| match shared_timeline(&p) {
            Some(t) => {
                p.step_time = t.makespan();
                p.bubble_fraction = t.bubble_fraction();
                (true, p)
            }
            None => (false, p),
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.step_time.total_cmp(&b.1.step_time)));
    scored.into_iter().map(|(_, p)| p).collect()
}

/// Times every layer briefly on one microbatch, on the chosen backend (the cost file carries its
/// overlap share); layers of one shape get one cost ([`pool_same_shape`]).
pub fn profile(setup: &Setup) -> Result<CostFile, CliError> {
    // A replica's microbatch: the global batch over replicas and microbatches.
    let rows = setup.spec.batch / (setup.args.microbatches * setup.args.data_parallel.max(1));
    // The CPU layers run on the calling thread: its CPU clock leaves out the time other work on
    // the machine takes its core, which would otherwise reorder near-equal candidates run to run.
    let clock = match setup.backend {
        Backend::Cpu => TimeSource::ThreadCpu,
        Backend::Cuda => TimeSource::Wall,
    };
    let options = ProfileOptions {
        warmup: 1,
        repeats: 5,
        clock,
    };
    // Train runs at this microbatch size and never rescales: one size is enough.
    let measure = Measure {
        backend: setup.backend,
        rows,
        fit_rows: None,
        sizes: Vec::new(),
        gemm: setup.gemm,
        options,
        seed: setup.args.seed,
        precision: setup.precision,
        activations: setup.activations,
    };
    let mut costs = profile_model(&setup.spec, &measure)?;
    pool_same_shape(&setup.spec, &mut costs);
    Ok(costs)
}

/// The host planner's plans, best first: the `--schedule-file` schedule, or one schedule per family
/// that fits the flags (only `--schedule` if given), each split by `--plan`.
pub fn plans(setup: &Setup, costs: &CostFile) -> Result<PlanReport, CliError> {
    let a = &setup.args;
    let split = a.plan.split();
    if let (Some(s), Some(path)) = (&setup.schedule_file, &a.schedule_file) {
        return plan_schedule(costs, s, split, None)
            .map(|p| PlanReport {
                plans: vec![p],
                skipped: Vec::new(),
            })
            .map_err(|e| CliError::Usage(format!("--schedule-file `{}`: {e}", path.display())));
    }
    let params = Params {
        ranks: a.ranks,
        microbatches: a.microbatches,
        chunks: a.chunks,
        group_size: None,
    };
    let only_auto = a.schedule.as_deref() == Some(AUTO);
    let mut report = if only_auto {
        PlanReport {
            plans: Vec::new(),
            skipped: Vec::new(),
        }
    } else {
        let families: Vec<String> = a.schedule.iter().cloned().collect();
        match plan_families(costs, &params, &families, split, None) {
            Ok(r) => r,
            // With `auto` still to come, no fitting family is not yet an error.
            Err(PlanError::NoPlan { skipped }) if a.schedule.is_none() => PlanReport {
                plans: Vec::new(),
                skipped,
            },
            Err(e) => return Err(no_plan(a.schedule.as_deref(), e)),
        }
    };
    if a.schedule.is_none() || only_auto {
        match auto_plan(setup, costs, split) {
            Ok(p) => report.plans.push(p),
            Err(e) if only_auto => return Err(no_plan(Some(AUTO), e)),
            Err(e) => report.skipped.push(Skipped {
                family: AUTO.into(),
                chunks: a.chunks.unwrap_or(1),
                microbatches: a.microbatches,
                reason: e.to_string(),
            }),
        }
        report
            .plans
            .sort_by(|x, y| x.step_time.total_cmp(&y.step_time));
    }
    if report.plans.is_empty() {
        return Err(no_plan(
            a.schedule.as_deref(),
            PlanError::NoPlan {
                skipped: report.skipped,
            },
        ));
    }
    Ok(report)
}

/// `auto` for the run's `P`, `M` and `V` (1 when not given) on the profile, with the run's auto
/// flags (`--max-in-flight`, `--objective`, `--time-budget`, `--placement`) and its seed, planned like
/// the families (`--plan`).
fn auto_plan(setup: &Setup, costs: &CostFile, split: Split) -> Result<Plan, PlanError> {
    let a = &setup.args;
    let flags = a.auto.with_seed(a.seed);
    let shape = auto_flags::Shape {
        ranks: a.ranks,
        microbatches: a.microbatches,
        chunks: a.chunks.unwrap_or(match flags.steer.placement {
            Placement::Vshape => 2,
            Placement::Looped => 1,
        }),
    };
    let limit = auto_flags::limit(None, a.auto.max_in_flight);
    let schedule = auto_schedule(costs, shape, limit, &flags).map_err(|e| PlanError::NoPlan {
        skipped: vec![Skipped {
            family: AUTO.into(),
            chunks: shape.chunks,
            microbatches: shape.microbatches,
            reason: e.to_string(),
        }],
    })?;
    plan_schedule(costs, &schedule, split, None)
}

/// The error when no plan is left: which schedules were ruled out, and why.
fn no_plan(schedule: Option<&str>, e: PlanError) -> CliError {
    let why = match e {
        PlanError::NoPlan { skipped } => skipped
            .iter()
            .map(|s| format!("{}: {}", s.family, s.reason))
            .collect::<Vec<_>>()
            .join("; "),
        e => e.to_string(),
    };
    CliError::Usage(match schedule {
        Some(name) => format!("--schedule {name} cannot run with these flags: {why}"),
        None => format!("no schedule family fits these flags: {why}"),
    })
}

/// The model's stages for `plan`, with their initial weights, or the `--resume` checkpoint's
/// state; and the steps already trained.
pub fn build(setup: &Setup, plan: &Plan) -> Result<(Vec<LinearStage>, usize), CliError> {
    let (stages, first_step) = build_where(setup, plan, |_| true)?;
    Ok((stages.into_iter().map(|(_, s)| s).collect(), first_step))
}

/// [`build`], only the stages `keep` takes, as `(stage index, stage)` (a process of a
/// multi-process run builds and restores only its own rank's).
pub fn build_where(
    setup: &Setup,
    plan: &Plan,
    keep: impl Fn(usize) -> bool,
) -> Result<(Vec<(usize, LinearStage)>, usize), CliError> {
    let mut stages = setup
        .spec
        .build_stages_where(
            &stage_ranges(&plan.layers_per_stage),
            setup.optimizer,
            setup.gemm,
            setup.args.seed,
            keep,
        )
        .map_err(|e| CliError::Failed(e.0))?
        .into_iter()
        .map(|(i, s)| (i, s.with_activations(setup.activations)))
        .collect::<Vec<_>>();
    let first_step = match &setup.resume {
        Some(r) => {
            checkpoint::restore(r, plan, &mut stages)?;
            r.step()
        }
        None => 0,
    };
    Ok((stages, first_step))
}

/// The progress display of this run.
fn progress(setup: &Setup, first_step: usize) -> output::Progress {
    let a = &setup.args;
    let text = a.format == Format::Text;
    let mut p = output::Progress::new(a.steps, text && std::io::stderr().is_terminal(), text);
    p.skip(first_step);
    p
}

/// Trains `--steps` steps with the chosen schedule: the runner of the run's backend (threads, or
/// the stream runtime with `--backend cuda`), driven by [the loop](crate::trainer::train).
pub fn train(setup: &Setup, chosen: &Chosen) -> Result<Outcome, CliError> {
    let plan = &chosen.plan;
    let (mut runner, first_step): (Box<dyn StepRunner>, usize) = match setup.backend {
        Backend::Cuda => cuda::runner(setup, plan)?,
        Backend::Cpu => threads(setup, plan)?,
    };
    run_loop(setup, plan, first_step, runner.as_mut(), true)?
        .ok_or_else(|| CliError::Failed(TrainError::NoStep.to_string()))
}

/// The threaded runner: one executor per replica (`--data-parallel`), each with the model's
/// stages (the seed's weights or `--resume`'s); the steps already trained.
fn threads(setup: &Setup, plan: &Plan) -> Result<(Box<dyn StepRunner>, usize), CliError> {
    let a = &setup.args;
    let failed = |e: String| CliError::Failed(e);
    let mut executors = Vec::with_capacity(a.data_parallel.max(1));
    let mut first_step = 0;
    for _ in 0..a.data_parallel.max(1) {
        let (stages, first) = build(setup, plan)?;
        first_step = first;
        let mut ex =
            Executor::new(plan.schedule.clone(), stages).map_err(|e| failed(e.to_string()))?;
        ex.set_exclusive(a.replay);
        executors.push(ex);
    }
    let runner = Threads::new(executors, setup.spec.loss, a.microbatches)?;
    Ok((Box::new(runner), first_step))
}

/// [The loop](crate::trainer::train) over `runner` for this run's steps, data and checkpoints;
/// `reporting`: this process shows the progress (and gets the outcome).
pub fn run_loop(
    setup: &Setup,
    plan: &Plan,
    first_step: usize,
    runner: &mut dyn StepRunner,
    reporting: bool,
) -> Result<Option<Outcome>, CliError> {
    let a = &setup.args;
    let saver = checkpoint::saver(setup, plan);
    let teacher = Teacher::new(&setup.spec, a.seed);
    let run = Run {
        plan,
        teacher: &teacher,
        batch: setup.spec.batch,
        microbatches: a.microbatches * a.data_parallel.max(1),
        first_step,
        steps: a.steps,
        saver: saver.as_ref(),
        replay: a.replay,
    };
    let outcome = if reporting {
        trainer::train(&run, runner, &mut progress(setup, first_step))
    } else {
        trainer::train(&run, runner, &mut Silent)
    };
    Ok(outcome?)
}

impl From<TrainError> for CliError {
    fn from(e: TrainError) -> Self {
        match e {
            // The flag the folder came from.
            TrainError::Save { .. } => CliError::Failed(format!("--{e}")),
            e => CliError::Failed(e.to_string()),
        }
    }
}

/// Prints the summary (text or JSON) and writes the SVG and trace.
pub fn report(
    setup: &Setup,
    candidates: &[Plan],
    chosen: &Chosen,
    outcome: &Outcome,
) -> Result<(), CliError> {
    output::write_files(setup, chosen, outcome)?;
    match setup.args.format {
        Format::Text => output::print_text(setup, candidates, chosen, outcome),
        Format::Json => output::print_json(setup, candidates, chosen, outcome),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use pipefill_host::cost::{CostFile, LayerCost, LinkCost};
    use pipefill_host::plan::{plan_families, Split};
    use pipefill_host::schedule::Params;

    use super::{choose, near_tie_choice, on_one_device, NEAR_TIE};

    /// A cost file of `layers` with a free link and overlap share 1.
    fn free_link(layers: Vec<LayerCost>) -> CostFile {
        CostFile {
            layers,
            transfer: LinkCost::default(),
            overlap_share: 1.0,
            meta: serde_json::Value::Null,
        }
    }

    /// With overlap share 1 (no overlap on the device) the shared-device step is the serial sum of
    /// every action, whatever the schedule; the re-scored plans come best first and the chosen
    /// plan's predicted timeline is the shared one.
    #[test]
    fn one_device_scores_plans_by_the_shared_model() {
        let costs = free_link(
            (0..4)
                .map(|i| LayerCost::new(format!("l{i}"), 1.0, 1.0 + i as f64 * 0.1, 0.5))
                .collect(),
        );
        let fams = vec!["1f1b".to_string(), "zb-h1".to_string(), "gpipe".to_string()];
        let report =
            plan_families(&costs, &Params::new(2, 4), &fams, Split::Uniform, None).unwrap();
        let serial = 4.0 * (4.0 * 1.0 + (1.0 + 1.1 + 1.2 + 1.3) + 4.0 * 0.5);
        let plans = on_one_device(report.plans);
        assert_eq!(plans.len(), 3);
        for p in &plans {
            assert!(
                (p.step_time - serial).abs() < 1e-9,
                "{}: {}",
                p.family,
                p.step_time
            );
        }
        let chosen = choose(&plans).unwrap();
        assert!((chosen.predicted.makespan() - serial).abs() < 1e-9);
    }

    /// Near-equal predictions (within the profile's noise) are decided by the stated rule, not by
    /// their order: the simplest family; a clear winner still wins.
    #[test]
    fn near_ties_are_decided_by_the_simplest_family_whatever_the_order() {
        let costs = free_link(
            (0..4)
                .map(|i| LayerCost::new(format!("l{i}"), 1.0, 1.0, 1.0))
                .collect(),
        );
        let names = ["zb-h2", "1f1b", "zb-h1"].map(String::from);
        let report =
            plan_families(&costs, &Params::new(2, 8), &names, Split::Uniform, None).unwrap();
        let mut plans = report.plans;
        let best = plans
            .iter()
            .map(|p| p.step_time)
            .fold(f64::INFINITY, f64::min);
        for p in &mut plans {
            p.step_time = best * (1.0 + NEAR_TIE / 2.0); // all tied
        }
        let first = plans[near_tie_choice(&plans).unwrap().0].clone();
        plans.reverse();
        let again = plans[near_tie_choice(&plans).unwrap().0].clone();
        assert_eq!(first.family, again.family, "the order decided");
        assert_eq!(first.family, "1f1b", "the simplest family of the tie");
        // A candidate clearly faster than the rest is chosen, however complex.
        let at = plans.iter().position(|p| p.family == "zb-h2").unwrap();
        plans[at].step_time = best * (1.0 - 2.0 * NEAR_TIE);
        assert_eq!(choose(&plans).unwrap().plan.family, "zb-h2");
    }
}
