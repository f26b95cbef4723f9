//! The built-in model's flags, shared by `pipefill train` and `pipefill profile` (flattened into
//! both), and their check at the edge.

use std::path::PathBuf;

use pipefill_host::cost::ActivationDtype;
use pipefill_kernels::Activation;

use super::CliError;
use crate::cuda::Precision;
use crate::layers::{LossKind, Optimizer};
use crate::model::{check_memory, Footprint, MemoryError, ModelSpec, RunShape};

/// Flags that describe the built-in model: a model file, or a uniform stack from widths.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// Model file (TOML or JSON, per-layer widths); replaces --layers/--hidden/--outputs/--activation/--loss.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Layers of the built-in model (the last one is the output layer).
    #[arg(long, default_value_t = 8)]
    pub layers: usize,
    /// Width of the input and of the hidden layers.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// Width of the output layer (classes for --loss ce).
    #[arg(long, default_value_t = 16)]
    pub outputs: usize,
    /// Rows per step (split into the microbatches).
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Activation of the hidden layers: identity, relu, gelu, silu.
    #[arg(long, default_value = "gelu")]
    pub activation: String,
    /// Loss: mse or ce (softmax cross-entropy).
    #[arg(long, default_value = "mse")]
    pub loss: String,
}

/// Flags of the layers' arithmetic and storage: `--precision` (the CUDA kernels) and `--activations`
/// (how the layers store activations, and so how the memory check and the cost file count them).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NumericsArgs {
    /// Arithmetic of the CUDA layers' matrix products: tf32 (tensor cores, the default on
    /// --backend cuda), fp32 (exact, the SIMT kernels) or bf16 (tensor cores, BF16 inputs). Only
    /// with --backend cuda: the CPU layers compute in f32.
    #[arg(long, value_name = "tf32|fp32|bf16")]
    pub precision: Option<Precision>,
    /// How the layers store activations: f32 (4 bytes) or bf16 (2 bytes: the stash of layer
    /// inputs, pre-activations and their gradients, and the tensors between layers and ranks, are
    /// rounded to BF16 on both backends; the math and the weights stay f32). The memory check
    /// and the cost file (and so the plan's memory) count them that way.
    #[arg(long, value_name = "f32|bf16", default_value = "f32")]
    pub activations: String,
}

impl NumericsArgs {
    /// The precision on `backend_flag` (`--backend cpu` refuses `--precision`; CUDA defaults to TF32).
    pub fn precision(&self, cuda: bool, backend_flag: &str) -> Result<Precision, CliError> {
        match (self.precision, cuda) {
            (Some(p), false) => Err(CliError::Usage(format!(
                "--precision {p} chooses the CUDA kernels' arithmetic, but {backend_flag} runs on the \
                 CPU (f32 only): give it with --backend cuda, or drop it"
            ))),
            (p, _) => Ok(p.unwrap_or_default()),
        }
    }

    /// `--activations`, checked.
    pub fn activations(&self) -> Result<ActivationDtype, CliError> {
        ActivationDtype::from_name(self.activations.trim()).ok_or_else(|| {
            CliError::Usage(format!(
                "--activations {}: give f32 or bf16 (how the layers store activations)",
                self.activations
            ))
        })
    }
}

impl ModelArgs {
    /// The model the flags describe, checked: each bad flag or file is a [`CliError::Usage`] naming it.
    pub fn spec(&self) -> Result<ModelSpec, CliError> {
        let usage = CliError::Usage;
        match &self.model {
            Some(path) => ModelSpec::from_file(path, self.batch),
            None => {
                let activation: Activation = self
                    .activation
                    .parse()
                    .map_err(|e| usage(format!("--activation: {e}")))?;
                let loss: LossKind = self
                    .loss
                    .parse()
                    .map_err(|e| usage(format!("--loss: {e}")))?;
                ModelSpec::uniform(
                    self.layers,
                    self.hidden,
                    self.outputs,
                    activation,
                    loss,
                    self.batch,
                )
            }
        }
        .map_err(|e| usage(e.0))
    }
}

/// Refuses a `pipefill train` whose model, batch, microbatches, ranks and optimizer cannot fit the
/// machine's memory (estimated before anything is allocated): a [`CliError::Usage`] with the
/// flags, the estimate, the memory available and the fix.
pub fn check_train(
    spec: &ModelSpec,
    args: &super::train::Args,
    optimizer: Optimizer,
) -> Result<(), CliError> {
    let dtype = args.numerics.activations()?;
    // Each replica trains on its share of the batch, with its own copy of the model; in one
    // process unless every rank is a process of its own (MPI), which holds one replica's rank.
    let replicas = match args.launcher {
        super::train::Launcher::Mpi => 1,
        _ => args.data_parallel.max(1),
    };
    let run = RunShape::training(
        spec.batch / replicas,
        args.microbatches,
        args.ranks,
        optimizer,
    )
    .with_activation_dtype(dtype)
    .with_replicas(replicas);
    let context = format!(
        "{} with --microbatches {} --ranks {} --data-parallel {replicas} --optimizer {optimizer} \
         --activations {dtype}",
        args.model.describe(spec),
        args.microbatches,
        args.ranks
    );
    refuse_if_too_large(spec, &run, &context, ("--batch", args.model.size_flags()))
}

/// Refuses a `pipefill profile` whose model cannot fit the machine's memory at the largest
/// microbatch it measures (`batch / microbatches` rows, or the largest of `--sizes`).
pub fn check_profile(spec: &ModelSpec, args: &super::profile::Args) -> Result<(), CliError> {
    let rows = spec.batch / args.microbatches.max(1);
    let largest = super::profile::sizes(&args.sizes, spec.batch)?
        .into_iter()
        .fold(rows, usize::max);
    let dtype = args.numerics.activations()?;
    let context = format!(
        "{} with --microbatches {} --sizes {} --activations {dtype}",
        args.model.describe(spec),
        args.microbatches,
        args.sizes
    );
    let run = RunShape::profiling(largest).with_activation_dtype(dtype);
    let names = ("--batch or --sizes", args.model.size_flags());
    refuse_if_too_large(spec, &run, &context, names)
}

/// The memory check shared by the commands: `context` names the flags and their values, `names`
/// the flags that set the rows in flight and those that set the widths and layers.
fn refuse_if_too_large(
    spec: &ModelSpec,
    run: &RunShape,
    context: &str,
    names: (&str, &str),
) -> Result<(), CliError> {
    let e = match check_memory(spec, run, super::sizes::available()?) {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    let fix = match &e {
        MemoryError::Overflow { .. } => {
            "give widths, layers and batch of a size a machine can hold".to_string()
        }
        MemoryError::Absurd { footprint, .. } | MemoryError::TooLarge { footprint, .. } => {
            fix_for(footprint, names)
        }
        _ => "make the model or the batch smaller".to_string(),
    };
    let whose = match e {
        MemoryError::TooLarge { .. } => {
            " (MemAvailable in /proc/meminfo, or PIPEFILL_MAX_MEMORY when lower)"
        }
        _ => "",
    };
    Err(CliError::Usage(format!(
        "{context}: {e}{whose}; fix: {fix}"
    )))
}

/// What to shrink, after the largest part of `f`; `(rows, widths)` name the flags that set the
/// rows in flight and the widths and layers.
fn fix_for(f: &Footprint, (rows, widths): (&str, &str)) -> String {
    // The parts add up to the checked total: no overflow.
    let model = f.weights + f.gradients + f.optimizer;
    let largest = [model, f.activations, f.data, f.threads, f.layers]
        .into_iter()
        .max()
        .unwrap_or(0);
    if largest == f.threads {
        "give fewer --ranks (each rank is a thread with its own stack)".into()
    } else if largest == model {
        let sgd = if f.optimizer > f.weights {
            "; --optimizer sgd keeps one copy of the weights less than adamw"
        } else {
            ""
        };
        format!("shrink {widths}{sgd}")
    } else if largest == f.layers {
        format!("shrink {widths}")
    } else {
        format!("shrink {rows}, or {widths}")
    }
}

impl ModelArgs {
    /// The flags (or file) that set the model's widths and layer count, for messages.
    fn size_flags(&self) -> &'static str {
        match self.model {
            Some(_) => "the layer widths or count in the --model file",
            None => "--hidden or --layers",
        }
    }

    /// The model flags and their values, for messages.
    fn describe(&self, spec: &ModelSpec) -> String {
        match &self.model {
            Some(path) => format!(
                "the model in --model {} ({} layers, input width {}) with batch {}",
                path.display(),
                spec.layers.len(),
                spec.input,
                spec.batch
            ),
            None => format!(
                "--layers {} --hidden {} --outputs {} --batch {}",
                self.layers, self.hidden, self.outputs, spec.batch
            ),
        }
    }
}
