//! `pipefill profile`: measure the built-in model's per-layer costs and write the cost file.
//!
//! ```text
//! pipefill profile [--backend cpu|cuda] [--model FILE | --layers 8 --hidden 256 --outputs 16 ...]
//!     [--batch 256 --microbatches 8] [--fit-rows R] [--sizes auto|none|ROWS,...]
//!     [--warmup 2 --repeats 7] --out costs.json
//! ```
//!
//! Each layer is wrapped in a [`LinearStage`] of its own and measured through the `Stage` trait, in
//! passes over the whole model, by [`pipefill_host::profile`] on one microbatch (`batch / microbatches` rows), then again on `R` rows
//! (`--fit-rows`, default an eighth of the microbatch, at least 1; 0 to skip) to fit each layer's
//! fixed per-call part ([`pipefill_host::profile::fit_fixed`]), which `plan` uses to scale times to
//! other microbatch sizes, and at each of `--sizes` (default every power of two up to the batch), kept
//! as each layer's `samples`, between which `plan` interpolates. The backend states how it runs an
//! overlapped F/B pair ([`Backend::pair_execution`]): the file's `overlap_share` (1 on CPU, whose
//! ranks run a pair's halves one after the other). The file records the microbatch sizes, backend,
//! pair execution and repeats in `meta`, and is written atomically.
//!
//! `--backend cuda` runs the same passes on CUDA device 0 with the layers' device build
//! ([`crate::cuda::profile`]), each call timed with CUDA events; the rest (fit, samples, file) is
//! shared. Without a driver or device it is a usage error (exit code 2) naming what is missing.

use std::path::PathBuf;

use pipefill_host::cost::{ActivationDtype, CostFile, LayerCost, LinkCost, SizeSample};
use pipefill_host::plan::relative_spread;
use pipefill_host::profile::{
    fit_fixed, median, profile_layers, PairExecution, ProfileError, ProfileOptions, ProfiledLayer,
};
use pipefill_host::runtime::Tensor;

use super::output::write_atomic;
use super::CliError;
use crate::cuda::Precision;
use crate::layers::gemm::GemmBackend;
use crate::layers::{LinearStage, Optimizer};
use crate::model::ModelSpec;

/// Where to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// CPU threads (the built-in layers' host build), monotonic clock.
    Cpu,
    /// CUDA device 0 (the kernels' PTX), timed with CUDA events.
    Cuda,
}

impl Backend {
    /// The name in the cost file's `meta.backend`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }

    /// How this backend's runtime runs an overlapped F/B pair: on CPU each rank is one thread,
    /// which runs the forward half and then the backward half. The CUDA backend runs each rank's
    /// stages through the same per-rank threads (one stream per stage, synchronous per action),
    /// so its pairs are sequential too; `pipefill bench overlap` measures what two streams of
    /// one GPU would hide.
    pub fn pair_execution(self) -> PairExecution {
        match self {
            Backend::Cpu | Backend::Cuda => PairExecution::Sequential,
        }
    }

    /// How the times were taken (the cost file's `meta.clock`).
    fn clock(self) -> &'static str {
        match self {
            Backend::Cpu => "std::time::Instant (monotonic), median of repeats",
            Backend::Cuda => "CUDA events (cuEventElapsedTime) around each call, median of repeats",
        }
    }
}

/// CUDA device 0, or a usage error (exit code 2) naming `flag` and what is missing: "no CUDA
/// driver found" or "no CUDA device".
pub fn cuda_or_usage(flag: &str) -> Result<crate::cuda::DeviceInfo, CliError> {
    crate::cuda::probe().map_err(|e| {
        if e.is_unavailable() {
            CliError::Usage(format!(
                "{flag}: {e}; run on a machine with an NVIDIA GPU and driver, or use --backend cpu"
            ))
        } else {
            CliError::Failed(format!("{flag}: {e}"))
        }
    })
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
    /// Second microbatch size (rows) to measure, to fit each layer's fixed per-call cost (the cost
    /// file's `fixed`); below the microbatch size. Default: an eighth of it (at least 1); 0: measure
    /// one size only (plan then scales times linearly).
    #[arg(long, value_name = "ROWS")]
    pub fit_rows: Option<usize>,
    /// Further microbatch sizes to measure every layer at: rows, comma-separated (`8,64`), `auto`
    /// (every power of two up to the batch) or `none`. The cost file keeps each as a sample of every
    /// layer (`samples`), and `plan` interpolates times between the measured sizes instead of
    /// extrapolating the fixed part's line.
    #[arg(long, value_name = "LIST", default_value = "auto")]
    pub sizes: String,
    /// Untimed rounds before measuring.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Timed rounds (the median is kept).
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `--precision` (with --backend cuda), `--activations`.
    #[command(flatten)]
    pub numerics: super::model_flags::NumericsArgs,
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
    super::model_flags::check_profile(&spec, args)?;
    Ok(spec)
}

/// `--sizes` for a batch of `batch` rows: the extra sizes to measure (may include the microbatch
/// size itself, which is then skipped).
pub fn sizes(flag: &str, batch: usize) -> Result<Vec<usize>, CliError> {
    match flag.trim() {
        "none" => Ok(Vec::new()),
        "auto" => Ok((0..usize::BITS)
            .map(|k| 1usize << k)
            .take_while(|&s| s <= batch)
            .collect()),
        list => list
            .split(',')
            .map(|x| match x.trim().parse::<usize>() {
                Ok(s) if s > 0 => Ok(s),
                _ => Err(CliError::Usage(format!(
                    "--sizes {flag}: `{}` is not a number of rows >= 1; give rows separated by \
                     commas (e.g. `--sizes 8,64`), `auto` or `none`",
                    x.trim()
                ))),
            })
            .collect(),
    }
}

/// `--fit-rows` for a microbatch of `rows` rows: `None` to measure one size only.
pub fn fit_rows(flag: Option<usize>, rows: usize) -> Result<Option<usize>, CliError> {
    match flag {
        None if rows >= 2 => Ok(Some((rows / 8).max(1))),
        None | Some(0) => Ok(None),
        Some(r) if r < rows => Ok(Some(r)),
        Some(r) => Err(CliError::Usage(format!(
            "--fit-rows {r}: must be below the microbatch size ({rows} rows), or 0 to measure one size"
        ))),
    }
}

/// What [`profile_model`] measures, where and how.
#[derive(Debug, Clone)]
pub struct Measure {
    /// The device (it states the overlap share of F/B pairs).
    pub backend: Backend,
    /// Rows of the microbatch the main times are measured at.
    pub rows: usize,
    /// A smaller microbatch to fit each layer's fixed part at; `None` to skip.
    pub fit_rows: Option<usize>,
    /// Further microbatch sizes (rows) kept as samples.
    pub sizes: Vec<usize>,
    /// The GEMM crate.
    pub gemm: GemmBackend,
    /// Warm-up and timed rounds.
    pub options: ProfileOptions,
    /// Seed of the weights.
    pub seed: u64,
    /// The CUDA layers' arithmetic (ignored on the CPU).
    pub precision: Precision,
    /// How the cost file counts activations (`meta.activation_dtype`).
    pub activations: ActivationDtype,
}

/// Gives the layers of one shape (input width, width, activation) one cost: per time field, the
/// median of their measurements. Such layers do the same work, so what differs between their
/// times is noise (another process on a core, a page fault); a planner that sees that noise as
/// real ranks near-equal schedules differently from run to run. The medians over a group of `k`
/// layers vary far less than any one layer's time. Layers of a shape of their own keep theirs.
///
/// Returns the measured spread of those equal measurements
/// ([`pipefill_host::plan::relative_spread`] over every group and time field; 0 when no two
/// layers share a shape), which the planners take as the width of a near-tie.
pub fn pool_same_shape(spec: &ModelSpec, costs: &mut CostFile) -> f64 {
    if costs.layers.len() != spec.layers.len() {
        return 0.0;
    }
    let shape = |i: usize| {
        let input = if i == 0 {
            spec.input
        } else {
            spec.layers[i - 1].width
        };
        (input, spec.layers[i].width, spec.layers[i].activation)
    };
    let measured = costs.layers.clone();
    let field = |c: &LayerCost| [c.forward, c.backward_input, c.backward_weight, c.backward];
    let mut groups: Vec<Vec<f64>> = Vec::new();
    for (i, layer) in costs.layers.iter_mut().enumerate() {
        let group: Vec<&LayerCost> = (0..measured.len())
            .filter(|&j| shape(j) == shape(i))
            .map(|j| &measured[j])
            .collect();
        if group.len() < 2 {
            continue;
        }
        let times: Vec<Vec<f64>> = (0..4)
            .map(|f| group.iter().map(|c| field(c)[f]).collect())
            .collect();
        let pooled: Vec<f64> = times.iter().map(|t| median(&mut t.clone())).collect();
        // One group per shape (its first layer's turn), F, I and W (B is I + W's own measurement).
        if (0..i).all(|j| shape(j) != shape(i)) {
            groups.extend(times.into_iter().take(3));
        }
        layer.forward = pooled[0];
        layer.backward_input = pooled[1];
        layer.backward_weight = pooled[2];
        layer.backward = pooled[3];
    }
    relative_spread(&groups)
}

/// Profiles every layer of `spec` on `m.rows` rows on `m.backend` and returns the cost file (free
/// transfers: ranks are threads of one process; the overlap share the backend states; `meta` says
/// how it was measured). With `fit_rows`, profiles again on that many rows and records each layer's
/// fixed part ([`fit_fixed`]). Each of `sizes` (rows, other than `rows`) is profiled too and kept as
/// a [`SizeSample`] of every layer.
pub fn profile_model(spec: &ModelSpec, m: &Measure) -> Result<CostFile, CliError> {
    let Measure {
        backend,
        rows,
        fit_rows,
        ref sizes,
        gemm,
        options,
        seed,
        precision,
        activations,
    } = *m;
    let failed = |e: ProfileError| CliError::Failed(e.to_string());
    let stages = || one_layer_stages(spec, gemm, seed, activations);
    let at = |rows| match backend {
        Backend::Cpu => profile_rows(spec, stages(), rows, options),
        Backend::Cuda => profile_rows_cuda(spec, stages(), rows, options, precision),
    };
    let mut costs = at(rows)?;
    // What the CPU runtime's selective recomputation drops and rebuilds (the CUDA stages and BF16
    // activations drop nothing).
    if backend == Backend::Cpu && activations == ActivationDtype::F32 {
        profile_selective(&mut costs, stages(), rows, options)?;
    }
    let mut sampled: Vec<(usize, Vec<LayerCost>)> = Vec::new();
    for &size in sizes.iter() {
        if size != rows && size > 0 && !sampled.iter().any(|(s, _)| *s == size) {
            sampled.push((size, at(size)?));
        }
    }
    if let Some(small) = fit_rows {
        let at_small = match sampled.iter().find(|(s, _)| *s == small) {
            Some((_, c)) => c.clone(),
            None => at(small)?,
        };
        fit_fixed(&mut costs, rows, &at_small, small).map_err(failed)?;
    }
    for (size, at) in &sampled {
        for (c, s) in costs.iter_mut().zip(at) {
            c.samples.push(SizeSample {
                scale: *size as f64 / rows as f64,
                forward: s.forward,
                backward_input: s.backward_input,
                backward_weight: s.backward_weight,
                backward: s.backward,
            });
        }
    }
    let sample_rows: Vec<usize> = sampled.iter().map(|(s, _)| *s).collect();
    let file = CostFile {
        layers: costs,
        transfer: LinkCost::default(),
        overlap_share: backend.pair_execution().overlap_share(),
        meta: serde_json::json!({
            "backend": backend.name(),
            "pair_execution": backend.pair_execution().name(),
            "microbatch_size": rows,
            "fit_microbatch_size": fit_rows,
            "sample_microbatch_sizes": sample_rows,
            "gemm": match backend {
                Backend::Cpu => gemm.name().to_string(),
                Backend::Cuda => format!("pipefill-kernels (PTX), {precision}"),
            },
            "warmup": options.warmup,
            "repeats": options.repeats,
            "clock": backend.clock(),
            // The layers stored their activations in this type while measured: the byte counts
            // are in it.
            (pipefill_host::cost::dtype::META_KEY): activations.name(),
        }),
    };
    Ok(file)
}

/// Every layer of `spec` as a one-layer stage storing `activations`: name, stage, parameter bytes.
fn one_layer_stages(
    spec: &ModelSpec,
    gemm: GemmBackend,
    seed: u64,
    activations: ActivationDtype,
) -> Vec<(String, LinearStage, f64)> {
    spec.init_layers(seed)
        .into_iter()
        .enumerate()
        .map(|(l, layer)| {
            let bytes = (layer.parameters() * std::mem::size_of::<f32>()) as f64;
            // Layer 0 is always in the model's first stage, which skips its input gradient (nobody
            // needs it); every other layer computes it, whichever stage it lands in.
            let stage = LinearStage::new(vec![layer], Optimizer::sgd(0.0), gemm, l == 0)
                .with_activations(activations);
            (format!("linear{l}"), stage, bytes)
        })
        .collect()
}

/// Each layer's selective part after the first ([`LayerCost::selective_bytes`],
/// [`LayerCost::selective_time`]): the layer and the one before as one stage on `rows` rows, its
/// stash shrunk ([`Stage::shrink`](pipefill_host::runtime::Stage::shrink): the bytes it drops)
/// and rebuilt ([`Stage::rebuild`](pipefill_host::runtime::Stage::rebuild): the median time over
/// `options.repeats`, after `options.warmup`).
fn profile_selective(
    costs: &mut [LayerCost],
    stages: Vec<(String, LinearStage, f64)>,
    rows: usize,
    options: ProfileOptions,
) -> Result<(), CliError> {
    use pipefill_host::runtime::Stage;
    let failed = |e: pipefill_host::runtime::StageError| CliError::Failed(e.to_string());
    let layers: Vec<_> = stages.into_iter().map(|(_, s, _)| s).collect();
    for (l, pair) in layers.windows(2).enumerate() {
        let mut stage = pair[0].clone();
        stage.layers.extend(pair[1].layers.iter().cloned());
        let width = stage.inputs();
        let x = Tensor::matrix(rows, width, vec![0.5; rows * width])
            .map_err(|e| CliError::Failed(e.to_string()))?;
        let (_, mut stash) = stage.forward(x).map_err(failed)?;
        let whole = stage.held_bytes(&stash);
        if !stage.shrink(&mut stash).map_err(failed)? {
            continue;
        }
        let dropped = whole.saturating_sub(stage.held_bytes(&stash));
        let mut times = Vec::with_capacity(options.repeats);
        for round in 0..options.warmup + options.repeats {
            if round > 0 {
                stage.shrink(&mut stash).map_err(failed)?;
            }
            let t = std::time::Instant::now();
            stage.rebuild(&mut stash).map_err(failed)?;
            if round >= options.warmup {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        if let Some(c) = costs.get_mut(l + 1) {
            c.selective_bytes = dropped as f64;
            c.selective_time = median(&mut times);
        }
    }
    Ok(())
}

/// The profile's input: `rows` rows of `0.5`.
fn profile_input(spec: &ModelSpec, rows: usize) -> Result<Tensor, CliError> {
    Tensor::matrix(rows, spec.input, vec![0.5; rows * spec.input])
        .map_err(|e| CliError::Failed(e.to_string()))
}

/// Every layer of `spec` (its one-layer `stages`) profiled on `rows` rows on the CPU, in passes over
/// the whole model.
fn profile_rows(
    spec: &ModelSpec,
    mut stages: Vec<(String, LinearStage, f64)>,
    rows: usize,
    options: ProfileOptions,
) -> Result<Vec<LayerCost>, CliError> {
    let layers = stages
        .iter_mut()
        .map(|(name, stage, bytes)| ProfiledLayer {
            name: name.clone(),
            stage,
            parameter_bytes: *bytes,
        })
        .collect();
    let input = profile_input(spec, rows)?;
    profile_layers(layers, input, options).map_err(|e| CliError::Failed(e.to_string()))
}

/// Every layer of `spec` (its one-layer `stages`) profiled on `rows` rows on CUDA device 0, timed
/// with CUDA events, in the same passes as on the CPU ([`crate::cuda::profile`]).
fn profile_rows_cuda(
    spec: &ModelSpec,
    stages: Vec<(String, LinearStage, f64)>,
    rows: usize,
    options: ProfileOptions,
    precision: Precision,
) -> Result<Vec<LayerCost>, CliError> {
    use crate::cuda::profile::{device_layers, profile_device_layers};
    let failed = |e: crate::cuda::CudaError| CliError::Failed(e.to_string());
    let gpu = crate::cuda::Gpu::open(0).map_err(failed)?;
    let mut layers = device_layers(&gpu, stages, precision).map_err(failed)?;
    let input = profile_input(spec, rows)?;
    profile_device_layers(&mut layers, &input, options).map_err(failed)
}

/// The most repeats (and warm-up runs) `profile` takes per layer.
pub const MAX_REPEATS: usize = 10_000;

/// Runs `pipefill profile`.
pub fn run(args: Args) -> Result<(), CliError> {
    super::output::check_output("--out", &args.out)?;
    let spec = model_from_flags(&args)?;
    if args.backend == Backend::Cuda {
        cuda_or_usage("--backend cuda")?;
    }
    let precision = args
        .numerics
        .precision(args.backend == Backend::Cuda, "--backend cpu")?;
    let activations = args.numerics.activations()?;
    let gemm: GemmBackend = args
        .gemm
        .parse()
        .map_err(|e| CliError::Usage(format!("--gemm: {e}")))?;
    for (flag, v) in [("--repeats", args.repeats), ("--warmup", args.warmup)] {
        if v > MAX_REPEATS {
            return Err(CliError::Usage(format!(
                "{flag} {v} is more than {MAX_REPEATS}: each repeat runs every layer's F, I and W \
                 once; a few are enough for a median"
            )));
        }
    }
    if args.repeats == 0 {
        return Err(CliError::Usage(
            "--repeats must be at least 1 (the median of the timed runs is kept)".into(),
        ));
    }
    let rows = spec.batch / args.microbatches;
    let options = ProfileOptions {
        warmup: args.warmup,
        repeats: args.repeats,
        ..ProfileOptions::default()
    };
    let measure = Measure {
        backend: args.backend,
        rows,
        fit_rows: fit_rows(args.fit_rows, rows)?,
        sizes: sizes(&args.sizes, spec.batch)?,
        gemm,
        options,
        seed: args.seed,
        precision,
        activations,
    };
    let file = profile_model(&spec, &measure)?;
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

#[cfg(test)]
mod tests {
    use super::pool_same_shape;
    use crate::layers::LossKind;
    use crate::model::{LayerSpec, ModelSpec};
    use pipefill_host::cost::{CostFile, LayerCost, LinkCost};
    use pipefill_kernels::Activation;

    #[test]
    fn layers_of_one_shape_get_the_median_of_their_times() {
        let layer = |width, activation| LayerSpec { width, activation };
        // Three 8 -> 8 GELU layers (the first takes the input of width 8), then an 8 -> 2 head.
        let spec = ModelSpec {
            input: 8,
            layers: vec![
                layer(8, Activation::Gelu),
                layer(8, Activation::Gelu),
                layer(8, Activation::Gelu),
                layer(2, Activation::Identity),
            ],
            loss: LossKind::Mse,
            batch: 4,
        };
        let times = [
            (1.0, 2.0, 3.0),
            (5.0, 1.0, 3.5),
            (2.0, 9.0, 1.0),
            (7.0, 7.0, 7.0),
        ];
        let mut costs = CostFile {
            layers: times
                .iter()
                .enumerate()
                .map(|(i, &(f, b, w))| LayerCost::new(format!("linear{i}"), f, b, w))
                .collect(),
            transfer: LinkCost::default(),
            overlap_share: 1.0,
            meta: serde_json::Value::Null,
        };
        let spread = pool_same_shape(&spec, &mut costs);
        // The ranges of the group's F, I, W (4, 8, 2.5) over their medians (2, 2, 3); the head,
        // alone of its shape, says nothing of the noise.
        assert!((spread - 14.5 / 7.0).abs() < 1e-12, "{spread}");
        for l in &costs.layers[..3] {
            assert_eq!(
                (l.forward, l.backward_input, l.backward_weight),
                (2.0, 2.0, 3.0)
            );
        }
        let head = &costs.layers[3];
        assert_eq!(
            (head.forward, head.backward_input, head.backward_weight),
            (7.0, 7.0, 7.0)
        );
    }
}
