//! `pipefill train`: the main job. Trains the built-in model with a pipeline schedule on CPU threads.
//!
//! The flow, one function per phase (so `--plan auto` can replace the split without touching the
//! rest):
//!
//! 1. [`setup`]: check the flags, build the model description;
//! 2. [`profile`]: time every layer's `F`, `I`, `W` briefly on one microbatch (the same
//!    measurement as `pipefill profile`, [`profile_model`]);
//! 3. [`split`]: the stages of a schedule with `S = P * V` stages (`--plan auto`: the best partition;
//!    `--plan uniform`: equal layer counts);
//! 4. [`candidates`]: generate, validate and simulate each schedule family that fits (or only
//!    `--schedule`), and choose the lowest predicted step time;
//! 5. [`train`]: run the steps with the executor, showing progress;
//! 6. [`report`]: losses, step time, measured vs predicted bubble per rank, the SVG, JSON.

mod output;

use std::io::IsTerminal;
use std::path::PathBuf;

use pipefill_host::cost::{CostModel, LayerCost, LinkCost};
use pipefill_host::profile::ProfileOptions;
use pipefill_host::runtime::{Executor, StepReport};
use pipefill_host::schedule::{families, validate::validate, Params, Schedule};
use pipefill_host::timeline::Timeline;

use super::profile::profile_model;
use super::CliError;
use crate::layers::gemm::GemmBackend;
use crate::layers::Optimizer;
use crate::model::{stage_ranges, ModelSpec, Teacher};

/// Share of the shorter half of an overlapped F/B pair that is not hidden, on CPU threads: the
/// runtime runs the two halves sequentially, so nothing is hidden.
pub const CPU_OVERLAP_SHARE: f64 = 1.0;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A human-readable summary.
    Text,
    /// One JSON object on stdout (keys in the README).
    Json,
}

/// Flags of `pipefill train`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Ranks (worker threads), `P`.
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// Microbatches per step, `M` (must divide --batch).
    #[arg(long, default_value_t = 8)]
    pub microbatches: usize,
    /// Stages per rank, `V` (default: each family's own).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Schedule family to train with (default: the one with the lowest predicted step time).
    #[arg(long)]
    pub schedule: Option<String>,
    /// Train with the schedule in this file instead of a generated one (JSON, CSV or text grid,
    /// as `pipefill schedule --out` writes; it must validate). It gives `P`, `V` and `M`.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["schedule", "ranks", "microbatches", "chunks"]
    )]
    pub schedule_file: Option<PathBuf>,
    /// How to split the layers into stages: `auto` (the best partition for each schedule by simulated
    /// step time) or `uniform` (equal layer counts).
    #[arg(long, value_enum, default_value_t = super::plan::TrainPlan::Auto)]
    pub plan: super::plan::TrainPlan,
    /// Training steps.
    #[arg(long, default_value_t = 30)]
    pub steps: usize,
    /// Seed of the weights, the teacher and the data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the measured and predicted timelines as Chrome trace JSON (Perfetto) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Where to write the timeline SVG (measured, then predicted from the profile and from the
    /// run's own action durations).
    #[arg(long, default_value = "pipefill-timeline.svg")]
    pub svg: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Run one layer call at a time, then rebuild the timeline with the simulator from the measured
    /// per-action durations (use when ranks exceed cores).
    #[arg(long)]
    pub replay: bool,
    /// The built-in model.
    #[command(flatten)]
    pub model: super::model_flags::ModelArgs,
    /// Optimizer: adamw or sgd (momentum 0.9).
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f32,
    /// GEMM crate for the matrix products: matrixmultiply or gemm.
    #[arg(long, default_value = "matrixmultiply")]
    pub gemm: String,
}

/// Everything checked and ready to run.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The flags.
    pub args: Args,
    /// The model.
    pub spec: ModelSpec,
    /// Its optimizer.
    pub optimizer: Optimizer,
    /// The GEMM crate.
    pub gemm: GemmBackend,
    /// Cores this process may use.
    pub cores: usize,
    /// The schedule read from `--schedule-file` (then `args.ranks`, `microbatches` and `chunks`
    /// are its `P`, `M` and `V`).
    pub schedule_file: Option<Schedule>,
}

/// A schedule that fits, with its stages and predicted timeline.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The schedule.
    pub schedule: Schedule,
    /// Layers per stage.
    pub layers_per_stage: Vec<usize>,
    /// The cost model from the profile.
    pub cost: CostModel,
    /// The simulator's timeline.
    pub predicted: Timeline,
}

/// What the training phase produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// One loss per step.
    pub losses: Vec<f32>,
    /// Wall seconds per step.
    pub step_seconds: Vec<f64>,
    /// The measured timeline of the median step (rebuilt by the simulator with `--replay`).
    pub measured: Timeline,
    /// The simulator's timeline from the median step's own action durations (mean per stage and
    /// op): what the schedule would take if the runtime added nothing to the layers' time. Set
    /// apart from the profile-based prediction, it tells profile error from runtime overhead.
    pub resimulated: Timeline,
    /// Sequential step time estimate: the sum of the median step's layer seconds.
    pub work_seconds: f64,
}

/// Runs `pipefill train`.
pub fn run(args: Args) -> Result<(), CliError> {
    let setup = setup(args)?;
    let costs = profile(&setup)?;
    let candidates = candidates(&setup, &costs)?;
    let chosen = choose(&candidates)?;
    let outcome = train(&setup, chosen)?;
    report(&setup, &candidates, chosen, &outcome)
}

/// Checks the flags (exit code 2 with the field and the fix on any problem).
pub fn setup(mut args: Args) -> Result<Setup, CliError> {
    let usage = |m: String| CliError::Usage(m);
    let schedule_file = match &args.schedule_file {
        Some(path) => {
            let (s, _) = super::schedule::read_schedule_file("--schedule-file", path)?;
            args.ranks = s.ranks;
            args.microbatches = s.microbatches;
            args.chunks = Some(s.chunks);
            Some(s)
        }
        None => None,
    };
    for (name, v) in [
        ("--ranks", args.ranks),
        ("--microbatches", args.microbatches),
        ("--steps", args.steps),
    ] {
        if v == 0 {
            return Err(usage(format!("{name} must be at least 1")));
        }
    }
    if args.chunks == Some(0) {
        return Err(usage("--chunks must be at least 1".into()));
    }
    if !(args.lr.is_finite() && args.lr > 0.0) {
        return Err(usage(format!(
            "--lr must be a positive number, got {}",
            args.lr
        )));
    }
    let gemm: GemmBackend = args
        .gemm
        .parse()
        .map_err(|e| usage(format!("--gemm: {e}")))?;
    let optimizer = match args.optimizer.as_str() {
        "adamw" => Optimizer::adamw(args.lr),
        "sgd" => Optimizer::sgd(args.lr),
        other => {
            return Err(usage(format!(
                "--optimizer: unknown optimizer `{other}`: use `adamw` or `sgd`"
            )))
        }
    };
    let spec = args.model.spec()?;
    super::model_flags::check_train(&spec, &args, optimizer)?;
    if spec.batch % args.microbatches != 0 {
        return Err(usage(match &args.schedule_file {
            Some(path) => format!(
                "--batch {} does not split into the {} microbatches of --schedule-file `{}`: give \
                 a batch that is a multiple of {}",
                spec.batch,
                args.microbatches,
                path.display(),
                args.microbatches
            ),
            None => format!(
                "--batch {} does not split into --microbatches {}: give a batch that is a \
                 multiple of the microbatch count",
                spec.batch, args.microbatches
            ),
        }));
    }
    if let Some(s) = &schedule_file {
        if spec.layers.len() < s.stages() {
            return Err(usage(format!(
                "the model has {} layers for the {} stages of --schedule-file `{}` (P = {} x V = \
                 {}): every stage needs at least one layer; give --layers (or model file layers) \
                 >= {}",
                spec.layers.len(),
                s.stages(),
                args.schedule_file
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                s.ranks,
                s.chunks,
                s.stages()
            )));
        }
    }
    if let Some(name) = &args.schedule {
        families::family(name).map_err(|e| usage(format!("--schedule: {e}")))?;
    }
    if spec.layers.len() < args.ranks {
        return Err(usage(format!(
            "the model has {} layers for --ranks {}: every rank needs at least one layer; give \
             --layers (or model file layers) >= {}, or fewer --ranks",
            spec.layers.len(),
            args.ranks,
            args.ranks
        )));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(Setup {
        args,
        spec,
        optimizer,
        gemm,
        cores,
        schedule_file,
    })
}

/// Times every layer briefly on one microbatch.
pub fn profile(setup: &Setup) -> Result<Vec<LayerCost>, CliError> {
    let rows = setup.spec.batch / setup.args.microbatches;
    let options = ProfileOptions {
        warmup: 1,
        repeats: 5,
    };
    // Train runs at this microbatch size and never rescales: one size is enough.
    Ok(profile_model(
        &setup.spec,
        rows,
        None,
        &[],
        setup.gemm,
        options,
        setup.args.seed,
    )?
    .layers)
}

/// Layer counts per stage of `schedule`: `--plan auto` (default) the best partition for it from the
/// profile, `--plan uniform` equal counts (see [`super::plan::train_split`]).
pub fn split(
    setup: &Setup,
    schedule: &Schedule,
    costs: &[LayerCost],
) -> Result<Vec<usize>, String> {
    super::plan::train_split(setup.args.plan, schedule, costs, CPU_OVERLAP_SHARE)
}

/// The candidate for one schedule that validated: its split, costs and predicted timeline.
fn candidate(setup: &Setup, s: Schedule, costs: &[LayerCost]) -> Result<Candidate, String> {
    let counts = split(setup, &s, costs)?;
    let mut cost =
        CostModel::from_layers(costs, &counts, LinkCost::default()).map_err(|e| e.to_string())?;
    // The CPU runtime runs an overlapped pair's halves one after the other.
    cost.overlap_share = CPU_OVERLAP_SHARE;
    let predicted = predict(&s, &cost)?;
    Ok(Candidate {
        schedule: s,
        layers_per_stage: counts,
        cost,
        predicted,
    })
}

/// Generates, validates and simulates every family that fits (only `--schedule` if given; only
/// the file's schedule with `--schedule-file`).
pub fn candidates(setup: &Setup, costs: &[LayerCost]) -> Result<Vec<Candidate>, CliError> {
    let a = &setup.args;
    if let Some(s) = &setup.schedule_file {
        return candidate(setup, s.clone(), costs)
            .map(|c| vec![c])
            .map_err(|e| CliError::Usage(format!("--schedule-file: {e}")));
    }
    let mut out = Vec::new();
    let mut refusals = Vec::new();
    for family in families::FAMILIES {
        if a.schedule.as_deref().is_some_and(|s| s != family.name) {
            continue;
        }
        let params = Params {
            ranks: a.ranks,
            microbatches: a.microbatches,
            chunks: a.chunks,
            group_size: None,
        };
        let attempt = families::generate(family.name, &params)
            .and_then(|s| validate(&s).map(|_| s))
            .map_err(|e| e.to_string())
            .and_then(|s| candidate(setup, s, costs));
        match attempt {
            Ok(c) => out.push(c),
            Err(e) => refusals.push(format!("{}: {e}", family.name)),
        }
    }
    if out.is_empty() {
        let why = refusals.join("; ");
        return Err(if a.schedule.is_some() {
            CliError::Usage(format!("--schedule cannot run with these flags: {why}"))
        } else {
            CliError::Usage(format!("no schedule family fits these flags: {why}"))
        });
    }
    Ok(out)
}

/// The simulator's timeline of `schedule` under `cost`.
pub fn predict(schedule: &Schedule, cost: &CostModel) -> Result<Timeline, String> {
    pipefill_host::sim::simulate(schedule, cost)
        .map(|s| s.timeline)
        .map_err(|e| e.to_string())
}

/// The candidate with the lowest predicted step time (the first of equals).
pub fn choose(candidates: &[Candidate]) -> Result<&Candidate, CliError> {
    candidates
        .iter()
        .min_by(|x, y| x.predicted.makespan().total_cmp(&y.predicted.makespan()))
        .ok_or_else(|| CliError::Failed("no candidate schedule".into()))
}

/// Trains `--steps` steps with the chosen schedule.
pub fn train(setup: &Setup, chosen: &Candidate) -> Result<Outcome, CliError> {
    let a = &setup.args;
    let failed = |e: String| CliError::Failed(e);
    let stages = setup
        .spec
        .build_stages(
            &stage_ranges(&chosen.layers_per_stage),
            setup.optimizer,
            setup.gemm,
            a.seed,
        )
        .map_err(|e| failed(e.0))?;
    let mut ex =
        Executor::new(chosen.schedule.clone(), stages).map_err(|e| failed(e.to_string()))?;
    ex.set_exclusive(a.replay);
    let teacher = Teacher::new(&setup.spec, a.seed);
    let loss = setup.spec.loss;
    let mut progress = output::Progress::new(
        a.steps,
        a.format == Format::Text && std::io::stderr().is_terminal(),
    );
    let mut reports: Vec<StepReport> = Vec::with_capacity(a.steps);
    for step in 0..a.steps {
        let (x, t) = teacher.batch(step as u64, setup.spec.batch, a.microbatches);
        let r = ex
            .step(x, &t, &loss)
            .map_err(|e| failed(format!("step {step}: {e}")))?;
        progress.step(step, r.loss, r.seconds, a.format == Format::Text);
        reports.push(r);
    }
    progress.finish();
    let losses = reports.iter().map(|r| r.loss).collect();
    let step_seconds: Vec<f64> = reports.iter().map(|r| r.seconds).collect();
    let median_step = median_index(&step_seconds);
    let r = &reports[median_step];
    let work_seconds = r.action_seconds.iter().map(|(_, t)| t).sum();
    let resimulated = predict(&chosen.schedule, &measured_cost(&chosen.cost, r)).map_err(failed)?;
    let measured = if a.replay {
        let mut t = resimulated.clone();
        t.source = pipefill_host::timeline::Source::Measured;
        t
    } else {
        r.timeline.clone()
    };
    Ok(Outcome {
        losses,
        step_seconds,
        measured,
        resimulated,
        work_seconds,
    })
}

/// The cost model with every stage's F, I, W, B times replaced by the mean measured durations of
/// that stage's actions in `report` (the byte sizes and link are kept).
pub fn measured_cost(base: &CostModel, report: &StepReport) -> CostModel {
    use pipefill_host::schedule::Op;
    let mut cost = base.clone();
    for (s, st) in cost.stages.iter_mut().enumerate() {
        let mean = |op: Op| {
            let v: Vec<f64> = report
                .action_seconds
                .iter()
                .filter(|(a, _)| a.stage == s && a.op == op)
                .map(|(_, t)| *t)
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        if let Some(f) = mean(Op::F) {
            st.forward = f;
        }
        let (i, w, b) = (mean(Op::I), mean(Op::W), mean(Op::B));
        if let (Some(i), Some(w)) = (i, w) {
            st.backward_input = i;
            st.backward_weight = w;
            st.backward = b.unwrap_or(i + w);
        } else if let Some(b) = b {
            // Only full backwards ran: keep the profile's I:W ratio.
            let old = st.backward_input + st.backward_weight;
            let share = if old > 0.0 {
                st.backward_input / old
            } else {
                0.5
            };
            st.backward = b;
            st.backward_input = b * share;
            st.backward_weight = b - st.backward_input;
        }
    }
    cost
}

/// Index of the median of `v`.
fn median_index(v: &[f64]) -> usize {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    idx.get(v.len() / 2).copied().unwrap_or(0)
}

/// Prints the summary (text or JSON) and writes the SVG and trace.
pub fn report(
    setup: &Setup,
    candidates: &[Candidate],
    chosen: &Candidate,
    outcome: &Outcome,
) -> Result<(), CliError> {
    output::write_files(setup, chosen, outcome)?;
    match setup.args.format {
        Format::Text => output::print_text(setup, candidates, chosen, outcome),
        Format::Json => output::print_json(setup, candidates, chosen, outcome),
    }
    Ok(())
}
