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
//!    ([`pipefill_host::plan::plan_given`], [`pipefill_host::plan::plan_schedule_with`]); [`choose`]
//!    takes the best predicted step time, or in a near-tie within the profile's measured spread
//!    the library's stated rule ([`pipefill_host::plan::choose`]);
//! 4. [`train`]: build the backend's step runner (CPU: one thread per rank; `--backend cuda`: the
//!    stream runtime, one host thread enqueuing per-rank streams; `D` replicas of either) and run
//!    [the one training loop](crate::trainer::train) over it: batches, steps, progress, checkpoints;
//! 5. [`report`]: losses, step time, measured vs predicted bubble per rank, the SVG, JSON.

mod checkpoint;
mod cuda;
mod devices;
#[cfg(feature = "mpi")]
mod launch;
mod load;
mod output;
mod recompute;
mod setup;

use std::io::IsTerminal;

use pipefill_host::cost::CostFile;
use pipefill_host::plan::{
    on_one_device, plan_given, plan_schedule_with, recorded_spread, Candidates, NearTie, Plan,
    PlanError, PlanReport, SPREAD_KEY,
};
use pipefill_host::profile::{ProfileOptions, TimeSource};
use pipefill_host::runtime::Executor;
use pipefill_host::schedule::families::{AUTO, FAMILIES};
use pipefill_host::schedule::Params;
use pipefill_host::timeline::Timeline;

pub use crate::trainer::Outcome;
pub use checkpoint::{CheckpointArgs, Resume};
pub use setup::{setup, Args, Format, Launcher, Setup, TrainPlan};

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
    /// The near-tie the plan was chosen in, if the fastest did not win alone.
    pub near_tie: Option<NearTie>,
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
    let mut candidates = candidates(&setup)?;
    if setup.devices.as_ref().is_some_and(|d| d.shared()) {
        // All ranks share GPU 0: rank the candidates by the shared-device model, and hold the
        // run against that prediction. With a GPU per rank the per-rank simulation stands.
        candidates.plans = on_one_device(candidates.plans);
    }
    let chosen = choose(&candidates)?;
    let outcome = train(&setup, &chosen)?;
    report(&setup, &candidates.plans, &chosen, &outcome)
}

/// The candidate plans, best first, and the profile's measured spread: profiled and planned, or
/// the `--resume` checkpoint's plan (a resumed run keeps its schedule, partition and costs).
pub fn candidates(setup: &Setup) -> Result<Candidates, CliError> {
    let mut c = match &setup.resume {
        Some(r) => Candidates {
            plans: vec![r.manifest.plan.clone()],
            spread: 0.0,
        },
        None => {
            let costs = profile(setup)?;
            Candidates {
                plans: plans(setup, &costs)?.plans,
                spread: recorded_spread(&costs).unwrap_or(0.0),
            }
        }
    };
    // `--recompute none|full`: every plan priced as it will run (a resumed one too: the flag is the
    // run's); with `auto` each plan carries the planner's choice (a resumed one its checkpoint's).
    if let Some(mode) = recompute_flag(setup).mode() {
        c.plans = recompute::recomputed(c.plans, mode)?;
    }
    Ok(c)
}

/// The plan to run among `candidates` ([`pipefill_host::plan::choose`]: the fastest, or in a
/// near-tie within the profile's spread the stated rule's), with its predicted timeline (the
/// shared-device one for a plan re-scored for one device) and the near-tie it decided, which the
/// report states.
pub fn choose(candidates: &Candidates) -> Result<Chosen, CliError> {
    let choice = pipefill_host::plan::choose(&candidates.plans, candidates.spread)
        .ok_or_else(|| CliError::Failed("no candidate schedule".into()))?;
    let plan = candidates.plans[choice.index].clone();
    let predicted = plan
        .predicted()
        .map_err(|e| CliError::Failed(e.to_string()))?;
    Ok(Chosen {
        plan,
        predicted,
        near_tie: choice.near_tie,
    })
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
    let spread = pool_same_shape(&setup.spec, &mut costs);
    if let Some(meta) = costs.meta.as_object_mut() {
        meta.insert(SPREAD_KEY.into(), spread.into());
    }
    Ok(costs)
}

/// The host planner's plans, best first: the `--schedule-file` schedule, or one schedule per family
/// that fits the flags (only `--schedule` if given), each split by `--plan`.
pub fn plans(setup: &Setup, costs: &CostFile) -> Result<PlanReport, CliError> {
    let a = &setup.args;
    let split = a.plan.split();
    let choice = recompute_flag(setup).choice();
    if let (Some(s), Some(path)) = (&setup.schedule_file, &a.schedule_file) {
        return plan_schedule_with(costs, s, split, a.memory_limit, choice)
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
    // `--schedule`, or every family and `auto`, planned alike by the library.
    let names: Vec<String> = match &a.schedule {
        Some(name) => vec![name.clone()],
        None => FAMILIES
            .iter()
            .map(|f| f.name.to_string())
            .chain([AUTO.to_string()])
            .collect(),
    };
    let auto = a.auto.with_seed(a.seed).options(a.chunks);
    plan_given(costs, &params, &names, split, a.memory_limit, &auto, choice)
        .map_err(|e| no_plan(a.schedule.as_deref(), e))
}

/// `--recompute`, or its default (`auto` with `--memory-limit`, else `none`).
fn recompute_flag(setup: &Setup) -> recompute::RecomputeFlag {
    recompute::RecomputeFlag::or_default(setup.args.recompute, setup.args.memory_limit)
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
    if let Some(w) =
        (setup.load.as_ref()).and_then(|l| l.warning(setup.cores, output::threads(setup)))
    {
        eprintln!("{w}");
    }
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
        ex.set_recompute(&plan.cost.recompute());
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
