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

use std::io::Write;
use std::path::{Path, PathBuf};

use pipefill_host::cost::{CostFile, LinkCost};
use pipefill_host::profile::{profile_layers, ProfileOptions, ProfiledLayer};
use pipefill_host::runtime::Tensor;
use pipefill_kernels::Activation;

use super::CliError;
use crate::layers::gemm::GemmBackend;
use crate::layers::{LinearStage, LossKind, Optimizer};
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
    /// Model file (TOML or JSON, per-layer widths); replaces --layers/--hidden/--outputs/--activation/--loss.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Layers of the built-in model (the last one is the output layer).
    #[arg(long, default_value_t = 8)]
    pub layers: usize,
    /// Width of the input and of the hidden layers.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// Width of the output layer.
    #[arg(long, default_value_t = 16)]
    pub outputs: usize,
    /// Activation of the hidden layers: identity, relu, gelu, silu.
    #[arg(long, default_value = "gelu")]
    pub activation: String,
    /// Loss: mse or ce.
    #[arg(long, default_value = "mse")]
    pub loss: String,
    /// Rows per step.
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
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

/// Writes `bytes` to `path` via a temporary file in the same folder and a rename, so the file is
/// either the old one or the complete new one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| CliError::Usage(format!("{}: not a file name", path.display())))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let fail = |e: std::io::Error| {
        CliError::Usage(format!(
            "cannot write {}: {e}; check that the folder exists and is writable",
            path.display()
        ))
    };
    let result = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|_| f.sync_all()))
        .and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    Ok(())
}

/// The model the flags describe.
pub fn model_from_flags(args: &Args) -> Result<ModelSpec, CliError> {
    let usage = |m: String| CliError::Usage(m);
    let spec = match &args.model {
        Some(path) => ModelSpec::from_file(path, args.batch),
        None => {
            let activation: Activation = args
                .activation
                .parse()
                .map_err(|e| usage(format!("--activation: {e}")))?;
            let loss: LossKind = args
                .loss
                .parse()
                .map_err(|e| usage(format!("--loss: {e}")))?;
            ModelSpec::uniform(
                args.layers,
                args.hidden,
                args.outputs,
                activation,
                loss,
                args.batch,
            )
        }
    }
    .map_err(|e| usage(e.0))?;
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
    write_atomic(&args.out, file.to_json().as_bytes())?;
    let total: f64 = file.layers.iter().map(|l| l.total()).sum();
    eprintln!(
        "profiled {} layers on {rows} rows: F+I+W {:.6} s per microbatch in all; wrote {}",
        file.layers.len(),
        total,
        args.out.display()
    );
    Ok(())
}
