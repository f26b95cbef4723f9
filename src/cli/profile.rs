//! `pipefill profile`: measure the built-in model's per-layer costs and write the cost file.
//!
//! ```text
//! pipefill profile [--backend cpu] [--model FILE | --layers 8 --hidden 256 --outputs 16 ...]
//!     [--batch 256 --microbatches 8] [--warmup 2 --repeats 7] --out costs.json
//! ```
//!
//! Each layer is wrapped alone in a [`LinearStage`] and measured through the `Stage` trait by
//! [`pipefill_host::profile`] on one microbatch (`batch / microbatches` rows). The file records the
//! microbatch size, backend and repeats in `meta`, and is written atomically.

use std::path::PathBuf;

use pipefill_host::cost::{CostFile, LinkCost};
use pipefill_host::profile::{profile_layers, ProfileOptions, ProfiledLayer};
use pipefill_host::runtime::Tensor;

use super::output::write_atomic;
use super::CliError;
use crate::layers::gemm::GemmBackend;
use crate::layers::{LinearStage, Optimizer};
use crate::model::ModelSpec;

/// Where to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// CPU threads (the built-in layers' host build), monotonic clock.
    Cpu,
}

/// Flags of `pipefill profile`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Device to measure on.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: Backend,
    /// Where to write the cost file (JSON).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// The built-in model.
    #[command(flatten)]
    pub model: super::model_flags::ModelArgs,
    /// Microbatches per step: layers are measured on `batch / microbatches` rows.
    #[arg(long, default_value_t = 8)]
    pub microbatches: usize,
    /// GEMM crate: matrixmultiply or gemm.
    #[arg(long, default_value = "matrixmultiply")]
    pub gemm: String,
    /// Untimed rounds before measuring.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Timed rounds (the median is kept).
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// The model the flags describe.
pub fn model_from_flags(args: &Args) -> Result<ModelSpec, CliError> {
    let usage = |m: String| CliError::Usage(m);
    let spec = args.model.spec()?;
    if args.microbatches == 0 || spec.batch % args.microbatches != 0 {
        return Err(usage(format!(
            "--microbatches {}: must be at least 1 and divide the batch ({} rows)",
            args.microbatches, spec.batch
        )));
    }
    Ok(spec)
}

/// Profiles every layer of `spec` on `rows` rows and returns the cost file (free transfers: ranks
/// are threads of one process; `meta` says how it was measured).
pub fn profile_model(
    spec: &ModelSpec,
    rows: usize,
    gemm: GemmBackend,
    options: ProfileOptions,
    seed: u64,
) -> Result<CostFile, CliError> {
    let mut stages: Vec<(String, LinearStage, f64)> = spec
        .init_layers(seed)
        .into_iter()
        .enumerate()
        .map(|(l, layer)| {
            let bytes = (layer.parameters() * std::mem::size_of::<f32>()) as f64;
            // Not first: its input gradient is computed, as in a stage that is not the model's first.
            let stage = LinearStage::new(vec![layer], Optimizer::sgd(0.0), gemm, false);
            (format!("linear{l}"), stage, bytes)
        })
        .collect();
    let layers = stages
        .iter_mut()
        .map(|(name, stage, bytes)| ProfiledLayer {
            name: name.clone(),
            stage,
            parameter_bytes: *bytes,
        })
        .collect();
    let input = Tensor::matrix(rows, spec.input, vec![0.5; rows * spec.input])
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let costs =
        profile_layers(layers, input, options).map_err(|e| CliError::Failed(e.to_string()))?;
    Ok(CostFile {
        layers: costs,
        transfer: LinkCost::default(),
        overlap_share: 0.0,
        meta: serde_json::json!({
            "backend": "cpu",
            "microbatch_size": rows,
            "gemm": gemm.name(),
            "warmup": options.warmup,
            "repeats": options.repeats,
            "clock": "std::time::Instant (monotonic), median of repeats",
        }),
    })
}

/// Runs `pipefill profile`.
pub fn run(args: Args) -> Result<(), CliError> {
    let spec = model_from_flags(&args)?;
    let gemm: GemmBackend = args
        .gemm
        .parse()
        .map_err(|e| CliError::Usage(format!("--gemm: {e}")))?;
    if args.repeats == 0 {
        return Err(CliError::Usage(
            "--repeats must be at least 1 (the median of the timed runs is kept)".into(),
        ));
    }
    let Backend::Cpu = args.backend;
    let rows = spec.batch / args.microbatches;
    let options = ProfileOptions {
        warmup: args.warmup,
        repeats: args.repeats,
    };
    let file = profile_model(&spec, rows, gemm, options, args.seed)?;
    write_atomic("--out", &args.out, file.to_json())?;
    let total: f64 = file.layers.iter().map(|l| l.total()).sum();
    eprintln!(
        "profiled {} layers on {rows} rows: F+I+W {:.6} s per microbatch in all; wrote {}",
        file.layers.len(),
        total,
        args.out.display()
    );
    Ok(())
}
