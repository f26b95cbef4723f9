//! The flags of `pipefill train` and their checks: everything a user passes is checked here, before
//! any work, and refused with the flag and the fix (exit code 2).

use std::path::{Path, PathBuf};

use pipefill_host::auto::AUTO;
use pipefill_host::cost::ActivationDtype;
use pipefill_host::plan::Split;
use pipefill_host::schedule::{families, Schedule};

use crate::cli::profile::{cuda_or_usage, Backend};
use crate::cli::CliError;
use crate::cuda::Precision;
use crate::layers::gemm::GemmBackend;
use crate::layers::Optimizer;
use crate::model::ModelSpec;

/// How `pipefill train` splits the model's layers into stages (`--plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TrainPlan {
    /// For each schedule considered, the partition with the lowest simulated step time (exact
    /// bottleneck optimum, baselines, boundary refinement; `pipefill_host::plan::best_partition`).
    #[default]
    Auto,
    /// Equal layer counts per stage.
    Uniform,
}

impl TrainPlan {
    /// The host planner's split.
    pub fn split(self) -> Split {
        match self {
            TrainPlan::Auto => Split::Best,
            TrainPlan::Uniform => Split::Uniform,
        }
    }

    /// `auto` or `uniform`.
    pub fn name(self) -> &'static str {
        match self {
            TrainPlan::Auto => "auto",
            TrainPlan::Uniform => "uniform",
        }
    }
}

/// How the ranks run (`--launcher`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Launcher {
    /// One process, one thread per rank.
    #[default]
    Threads,
    /// One process per rank under `mpirun` (a build with the `mpi` feature).
    Mpi,
}

/// Where `pipefill train` runs the layers (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TrainBackend {
    /// CPU threads, one per rank.
    #[default]
    Cpu,
    /// The CUDA backend on device 0 (a usage error where there is no driver or device).
    Cuda,
    /// CUDA when a device is usable, else the CPU; says which it chose.
    Auto,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A human-readable summary.
    Text,
    /// One JSON object on stdout (keys in docs/formats.md).
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
    /// Schedule family to train with, or `auto` (default: the one with the lowest predicted step
    /// time among the families and `auto`).
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
    #[arg(long, value_enum, default_value_t = TrainPlan::Auto)]
    pub plan: TrainPlan,
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
    pub model: crate::cli::model_flags::ModelArgs,
    /// Optimizer: adamw or sgd (momentum 0.9).
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f32,
    /// GEMM crate for the matrix products: matrixmultiply or gemm.
    #[arg(long, default_value = "matrixmultiply")]
    pub gemm: String,
    /// Data-parallel replicas D of the pipeline (P x D rank threads). `--batch` stays the global
    /// batch: each replica trains on `batch / D` rows as `--microbatches` microbatches, and each
    /// stage's gradients are averaged over the replicas as soon as its last backward is done.
    #[arg(long, default_value_t = 1, value_name = "D")]
    pub data_parallel: usize,
    /// How the ranks run: `threads` (one process) or `mpi` (one process per rank of each replica:
    /// `mpirun -n P*D pipefill train --launcher mpi --ranks P --data-parallel D ...`, in a build
    /// with `--features mpi`).
    #[arg(long, value_enum, default_value_t = Launcher::Threads)]
    pub launcher: Launcher,
    /// Checkpoints: `--checkpoint`, `--checkpoint-every`, `--resume`.
    #[command(flatten)]
    pub checkpoint: super::checkpoint::CheckpointArgs,
    /// Where the layers run: cpu, cuda (device 0; the Rust kernels as PTX) or auto (CUDA when a
    /// device is usable, else the CPU).
    #[arg(long, value_enum, default_value_t = TrainBackend::Cpu)]
    pub backend: TrainBackend,
    /// With `--backend cuda`: capture the whole training step as one CUDA graph and replay it.
    /// Step 0 warms up, step 1 runs plain (measured), step 2 is captured, later steps replay it;
    /// the report gives the host time per action with and without the graph. Needs --steps 4+.
    #[arg(long)]
    pub graph: bool,
    /// With `--backend cuda`: which GPU each rank runs on: one (every rank on GPU 0), per-rank
    /// (rank r on GPU r mod the GPU count; needs 2+ GPUs) or auto (per-rank with 2+ GPUs, else
    /// one; says which it chose).
    #[arg(long, value_enum, value_name = "one|per-rank|auto")]
    pub devices: Option<super::devices::DevicesFlag>,
    /// The automatic scheduler's flags (for `--schedule auto`, and `auto` among the default
    /// candidates).
    #[command(flatten)]
    pub auto: crate::cli::auto_flags::AutoSteer,
    /// `--precision`, `--activations`.
    #[command(flatten)]
    pub numerics: crate::cli::model_flags::NumericsArgs,
    /// Bytes each rank may hold (parameters + activations in flight): only plans that fit are
    /// candidates, and with `--recompute auto` (the default with this flag) stages recompute where
    /// that lets a plan fit or buys a faster one. Default: no limit.
    #[arg(long = "memory-limit", value_name = "BYTES", value_parser = pipefill_host::cost::flag::parse_bytes, conflicts_with = "max_in_flight")]
    pub memory_limit: Option<f64>,
    /// Activation recomputation: none (keep each stash from F to its backward), full (every stage
    /// keeps only its input and runs its forward again right before I or B: less memory, a longer
    /// backward; the losses are the same), selective (every stage that can drops its layers'
    /// inputs after the first and rebuilds them elementwise before I or B; the losses are the
    /// same) or auto (chosen per stage with the schedule and the partition under
    /// --memory-limit). Default: auto with --memory-limit, else none.
    #[arg(long, value_name = "MODE", value_parser = super::recompute::parse)]
    pub recompute: Option<super::recompute::RecomputeFlag>,
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
    /// The `--resume` checkpoint, loaded and checked against the run.
    pub resume: Option<super::checkpoint::Resume>,
    /// Where the layers run (`--backend`, `auto` resolved).
    pub backend: Backend,
    /// The CUDA layers' arithmetic (`--precision`; TF32 unless given).
    pub precision: Precision,
    /// How activations are counted (`--activations`).
    pub activations: ActivationDtype,
    /// `--backend cuda`: the GPU of each rank (`--devices`, resolved); `None` on the CPU.
    pub devices: Option<super::devices::DeviceChoice>,
    /// The machine's load before the run (`None` where `/proc` cannot be read).
    pub load: Option<super::load::Load>,
}

/// Checks the flags (exit code 2 with the field and the fix on any problem).
pub fn setup(mut args: Args) -> Result<Setup, CliError> {
    let schedule_file = match &args.schedule_file {
        Some(path) => {
            let (s, _) = crate::cli::schedule::read_schedule_file("--schedule-file", path)?;
            args.ranks = s.ranks;
            args.microbatches = s.microbatches;
            args.chunks = Some(s.chunks);
            Some(s)
        }
        None => None,
    };
    check_counts(&args)?;
    // Every output path is checked before any work (a bad one would lose the run's report).
    crate::cli::output::check_output("--svg", &args.svg)?;
    if let Some(path) = &args.trace {
        crate::cli::output::check_output("--trace", path)?;
    }
    let (optimizer, gemm) = training(&args)?;
    let spec = args.model.spec()?;
    super::super::model_flags::check_train(&spec, &args, optimizer)?;
    check_model(&args, &spec, schedule_file.as_ref())?;
    // Each step's report is kept to the end (at the largest default V of the families, 2).
    let shape = crate::cli::sizes::Shape {
        ranks: args.ranks,
        microbatches: args.microbatches,
        chunks: args.chunks.unwrap_or(2),
    };
    crate::cli::sizes::step_reports(args.steps, &shape)?;
    if let Some(name) = args.schedule.as_deref().filter(|n| *n != AUTO) {
        families::family(name).map_err(|e| {
            usage(format!(
                "--schedule: {e}, or auto (the automatic scheduler)"
            ))
        })?;
        // `auto` is not among the candidates: its flags would do nothing.
        crate::cli::auto_flags::only_for_auto(args.auto.given())?;
    }
    if args.schedule_file.is_some() {
        crate::cli::auto_flags::only_for_auto(args.auto.given())?;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let backend = resolve_backend(args.backend)?;
    check_graph(&args, backend)?;
    let devices = resolve_devices(&args, backend)?;
    let flag = match args.backend {
        TrainBackend::Cpu => "--backend cpu",
        TrainBackend::Cuda => "--backend cuda",
        TrainBackend::Auto => "--backend auto (which found no GPU here)",
    };
    let precision = args.numerics.precision(backend == Backend::Cuda, flag)?;
    let activations = args.numerics.activations()?;
    let mut setup = Setup {
        args,
        spec,
        optimizer,
        gemm,
        cores,
        schedule_file,
        resume: None,
        backend,
        precision,
        activations,
        devices,
        load: super::load::Load::sample(),
    };
    setup.resume = super::checkpoint::prepare(&setup)?;
    Ok(setup)
}

/// The steps before the captured one with `--graph`: a warm-up and a plain, measured step.
pub use crate::trainer::streams::GRAPH_PLAIN_STEPS;

/// `--graph`: only on the CUDA backend, and with a step left to replay after the capture.
fn check_graph(args: &Args, backend: Backend) -> Result<(), CliError> {
    if !args.graph {
        return Ok(());
    }
    if backend != Backend::Cuda {
        return Err(usage(
            "--graph: whole-step graphs need --backend cuda (the CPU path runs one thread per \
             rank and has no graph to capture): add --backend cuda, or drop --graph"
                .to_string(),
        ));
    }
    let least = GRAPH_PLAIN_STEPS + 2;
    if args.steps < least {
        return Err(usage(format!(
            "--graph: --steps {} leaves no step to replay (step 0 warms up, step 1 runs plain, \
             step 2 is captured, later steps replay it): give --steps {least} or more",
            args.steps
        )));
    }
    Ok(())
}

/// `--devices`: only for the CUDA backend (refused with `--backend cpu`, ignored with a note when
/// `--backend auto` found no GPU); resolved against the machine's GPU count and printed.
fn resolve_devices(
    args: &Args,
    backend: Backend,
) -> Result<Option<super::devices::DeviceChoice>, CliError> {
    use super::devices::{DeviceChoice, DevicesFlag};
    if backend != Backend::Cuda {
        return match (args.devices, args.backend) {
            (None, _) => Ok(None),
            (Some(_), TrainBackend::Auto) => {
                eprintln!("--devices: ignored (--backend auto runs on the cpu here)");
                Ok(None)
            }
            (Some(f), _) => Err(usage(format!(
                "--devices {}: chooses GPUs for --backend cuda: add --backend cuda (or auto), \
                 or drop --devices",
                f.name()
            ))),
        };
    }
    let available =
        crate::cuda::device_count().map_err(|e| CliError::Failed(format!("--devices: {e}")))?;
    let flag = args.devices.unwrap_or(DevicesFlag::Auto);
    let choice = DeviceChoice::resolve(flag, args.ranks, available).map_err(usage)?;
    eprintln!("{}", choice.describe());
    Ok(Some(choice))
}

/// `--backend`: `cuda` must find a device (else a usage error saying what is missing); `auto` takes
/// CUDA when a device is usable, else the CPU, and says on stderr which it chose and why.
fn resolve_backend(flag: TrainBackend) -> Result<Backend, CliError> {
    match flag {
        TrainBackend::Cpu => Ok(Backend::Cpu),
        TrainBackend::Cuda => cuda_or_usage("--backend cuda").map(|_| Backend::Cuda),
        TrainBackend::Auto => match crate::cuda::probe() {
            Ok(info) => {
                eprintln!(
                    "--backend auto: using cuda (device 0 of {}: {})",
                    info.count, info.name
                );
                Ok(Backend::Cuda)
            }
            Err(e) if e.is_unavailable() => {
                eprintln!("--backend auto: using cpu ({e})");
                Ok(Backend::Cpu)
            }
            Err(e) => Err(CliError::Failed(format!("--backend auto: {e}"))),
        },
    }
}

fn usage(m: String) -> CliError {
    CliError::Usage(m)
}

/// `--ranks`, `--microbatches`, `--steps`, `--chunks` at least 1.
/// The most steps one `train` run takes (each step's report is kept until the end of the run).
pub const MAX_STEPS: usize = 10_000_000;

fn check_counts(args: &Args) -> Result<(), CliError> {
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
    if args.steps > MAX_STEPS {
        return Err(usage(format!(
            "--steps {} is more than {MAX_STEPS}: the run keeps one report a step; train in runs of \
             at most {MAX_STEPS} steps with --checkpoint and --resume",
            args.steps
        )));
    }
    if args.launcher == Launcher::Mpi {
        if !cfg!(feature = "mpi") {
            return Err(usage(
                "--launcher mpi: this pipefill was built without MPI; rebuild it with \
                 `cargo build --release --features mpi` (needs an MPI library and libclang)"
                    .into(),
            ));
        }
        if args.replay {
            return Err(usage(
                "--replay runs one layer call at a time within one process: give it without \
                 --launcher mpi"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// `--optimizer` with `--lr`, and `--gemm`.
fn training(args: &Args) -> Result<(Optimizer, GemmBackend), CliError> {
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
    Ok((optimizer, gemm))
}

/// The batch splits into the microbatches, and every stage (every rank) gets a layer.
fn check_model(args: &Args, spec: &ModelSpec, file: Option<&Schedule>) -> Result<(), CliError> {
    let path = args
        .schedule_file
        .as_deref()
        .map(Path::display)
        .map(|p| p.to_string())
        .unwrap_or_default();
    let d = args.data_parallel;
    if d == 0 {
        return Err(usage(
            "--data-parallel 0: give at least one replica (1 trains without data parallelism)"
                .to_string(),
        ));
    }
    if d > 1 && spec.batch % (args.microbatches * d) != 0 {
        return Err(usage(format!(
            "--batch {} does not split into --data-parallel {d} replicas of --microbatches {} \
             microbatches: give a batch that is a multiple of {}",
            spec.batch,
            args.microbatches,
            args.microbatches * d
        )));
    }
    if spec.batch % args.microbatches != 0 {
        return Err(usage(match file {
            Some(_) => format!(
                "--batch {} does not split into the {} microbatches of --schedule-file `{path}`: \
                 give a batch that is a multiple of {}",
                spec.batch, args.microbatches, args.microbatches
            ),
            None => format!(
                "--batch {} does not split into --microbatches {}: give a batch that is a \
                 multiple of the microbatch count",
                spec.batch, args.microbatches
            ),
        }));
    }
    if let Some(s) = file {
        if spec.layers.len() < s.stages() {
            return Err(usage(format!(
                "the model has {} layers for the {} stages of --schedule-file `{path}` (P = {} x \
                 V = {}): every stage needs at least one layer; give --layers (or model file \
                 layers) >= {}",
                spec.layers.len(),
                s.stages(),
                s.ranks,
                s.chunks,
                s.stages()
            )));
        }
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
    // Checked before any schedule of P x V stages is built: V chunks per rank need P x V layers.
    if let (Some(v), None) = (args.chunks, file) {
        let stages = args.ranks.checked_mul(v);
        if stages.is_none_or(|s| s > spec.layers.len()) {
            return Err(usage(format!(
                "--chunks {v} with --ranks {}: the model has {} layers for {} stages (P x V), and \
                 every stage needs at least one layer; give --chunks <= {} (or more --layers)",
                args.ranks,
                spec.layers.len(),
                stages.map_or("more than 2^64".to_string(), |s| s.to_string()),
                spec.layers.len() / args.ranks
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{check_graph, Args, Backend};
    use crate::cli::{Cli, Command};

    fn train(flags: &[&str]) -> Args {
        let argv = ["pipefill", "train", "--backend", "cuda"]
            .iter()
            .chain(flags);
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Train(a)) => a,
            other => panic!("{flags:?}: {other:?}"),
        }
    }

    /// `--graph` is taken with every launcher and device choice of the CUDA backend, replicas
    /// and checkpoints included; what is left refused is a step count with nothing to replay.
    #[test]
    fn graph_is_taken_with_every_cuda_launcher_and_device_choice() {
        let taken: [&[&str]; 5] = [
            &["--data-parallel", "2", "--checkpoint", "ck"],
            &["--devices", "per-rank"],
            &["--launcher", "mpi"],
            &[
                "--launcher",
                "mpi",
                "--data-parallel",
                "2",
                "--checkpoint",
                "ck",
            ],
            &["--launcher", "mpi", "--devices", "per-rank"],
        ];
        for flags in taken {
            let args = train(&[&["--graph", "--steps=4"][..], flags].concat());
            assert!(check_graph(&args, Backend::Cuda).is_ok(), "{flags:?}");
        }
        let args = train(&["--graph", "--steps=3", "--launcher", "mpi"]);
        let e = check_graph(&args, Backend::Cuda).unwrap_err().to_string();
        assert!(e.starts_with("--graph") && e.contains("--steps 4"), "{e}");
    }
}
