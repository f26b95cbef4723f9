//! `pipefill plan`: search partition x schedule family x V x M by simulated step time.
//!
//! ```text
//! pipefill plan --costs costs.json (--ranks 4 [--data-parallel 2] | --workers 8) --global-batch 64
//!     [--dp-bandwidth B/s] [--dp-latency S] [--memory-limit BYTES] [--recompute none|full|auto]
//!     [--cost-batch SAMPLES] [--activations f32|bf16]
//!     [--families 1f1b,zbv] [--chunks 1,2,4] [--max-microbatches 64]
//!     [--top 10] [--format table|json] [--svg best.svg]
//!     [--families auto,... [--max-in-flight N] [--objective makespan|span] [--time-budget S] [--seed N]]
//! ```
//!
//! Times are scaled to each microbatch size by interpolating between the sizes a layer was measured
//! at when every layer of the cost file has `samples` (`pipefill profile --sizes`, on by default), by
//! the affine model when every layer has a `fixed` part (`pipefill profile` fits it), linearly when
//! none has either (see [`pipefill_host::plan`]); the output says which
//! (`"scaling": "sampled" | "affine" | "linear" | "mixed"`).
//!
//! With `--data-parallel D`, each of `D` pipeline replicas trains on `N / D` samples and each plan's
//! step time includes its stages' ring all-reduces (`reduce_tail`: what they add after the pipeline);
//! `--workers W` searches every split of `W` into `P x D` as well.
//!
//! JSON: `{"ranks", "data_parallel", "workers", "global_batch", "memory_limit", "scaling", "overlap_share", "plans": [{family,
//! chunks, microbatches, microbatch_size, partition, layers_per_stage, step_time, bubble_fraction,
//! peak_memory, recompute, lower_bound, ratio_to_bound, bottleneck}, ...], "skipped": <count>, "chosen":
//! {<a plan's fields>, rank, near_tie}}`, best plan first (each plan as
//! [`pipefill_host::plan::Plan`] serialises it, less its schedule and costs).
//!
//! `auto` (in `--families`) is one more schedule source of the library's planner: solved at every
//! `P`, `D` and `M` tried (so with `--workers` and `--data-parallel` too), planned like the families.
//! The plan **chosen** is the fastest unless others are predicted within the cost file's recorded
//! spread of it (`meta.spread`, at least 2%, at most 10%): then the near-tie rule of
//! [`pipefill_host::plan::choose`] decides, and the output says so (the table's last line, the
//! JSON's `"chosen"`); `--svg` draws the chosen plan.
//!
//! `--activations bf16` (or `f32`) plans for activations stored in that type: the cost file's
//! activation, release and output bytes are rescaled from the type it records
//! (`meta.activation_dtype`) with [`CostFile::with_activation_dtype`], as `train --activations` does,
//! so the predicted peak memory and the transfer bytes follow. Without the flag, the file's type.
//!
//! `--recompute` says which recomputation modes the stages may take: `none`, `full` everywhere, or
//! `auto` (the default with `--memory-limit`; else `none`): chosen per stage with the partition and
//! the schedule, so a limit that no plan fits without recomputation gets a plan with it, and
//! otherwise recomputation is used only where it buys a faster predicted step
//! ([`pipefill_host::cost::RecomputeChoice`]). Each plan reports `recompute` per stage; the table
//! shows `-`, `full` or `k of S`.
//!
//! The overlap share of F/B pairs is the cost file's (`pipefill profile` writes the one of the
//! backend it measured on), or `--overlap-share X` (e.g. what `pipefill bench overlap` measured).

use std::path::PathBuf;

use pipefill_host::cost::flag::{parse_bytes, parse_time};
use pipefill_host::cost::{ActivationDtype, CostFile, RecomputeChoice};
use pipefill_host::partition::SPLIT_CELLS_PER_SECOND;
use pipefill_host::plan::{
    choose, estimated_work, estimated_workers_work, plan, plan_workers, recompute_summary,
    recorded_spread, Choice, Plan, PlanError, PlanReport, PlanRequest,
};
use pipefill_host::sim::data_parallel::DataParallel;
use pipefill_host::trace::{svg_gantt, SvgOptions};
use serde::Serialize;
use serde_json::Value;

use super::auto_flags::AutoArgs;
use super::partition::Format;
use super::CliError;

/// Flags of `pipefill plan`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Cost file (per-layer JSON, schema in docs/formats.md).
    #[arg(long, value_name = "FILE")]
    pub costs: PathBuf,
    /// Number of ranks P of one pipeline.
    #[arg(long, required_unless_present = "workers")]
    pub ranks: Option<usize>,
    /// Data-parallel replicas D of the pipeline: each trains on `global-batch / D` samples, and
    /// each stage's gradients are all-reduced over the replicas (ring model) as soon as its last
    /// backward is done.
    #[arg(
        long,
        default_value_t = 1,
        value_name = "D",
        conflicts_with = "workers"
    )]
    pub data_parallel: usize,
    /// Search the split of N workers into P ranks x D replicas too (instead of --ranks and
    /// --data-parallel).
    #[arg(long, value_name = "N", conflicts_with = "ranks")]
    pub workers: Option<usize>,
    /// Bandwidth between replicas for the all-reduce, bytes/s. Default: the cost file's transfer
    /// link.
    #[arg(long, value_name = "BYTES_PER_S")]
    pub dp_bandwidth: Option<f64>,
    /// Latency of one all-reduce, seconds. Default: the cost file's transfer latency.
    #[arg(long, value_name = "SECONDS", value_parser = parse_time)]
    pub dp_latency: Option<f64>,
    /// Samples per training step N (split into M microbatches of N / M samples).
    #[arg(long)]
    pub global_batch: usize,
    /// Bytes each rank may hold (parameters + activations in flight). Default: no limit.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, conflicts_with = "max_in_flight")]
    pub memory_limit: Option<f64>,
    /// Activation recomputation: `none`, `full` (every stage keeps only its input and runs its
    /// forward again before I/B), `selective` (every stage drops what its layers declare cheap to
    /// rebuild, `selective_bytes`), or `auto` (chosen per stage with the partition and schedule
    /// under --memory-limit). Default: `auto` with --memory-limit, else `none`.
    #[arg(long, value_name = "MODE", value_parser = parse_choice)]
    pub recompute: Option<RecomputeChoice>,
    /// Microbatch size (samples) the costs were measured at. Default: the cost file's
    /// `meta.microbatch_size` (written by `pipefill profile`).
    #[arg(long, value_name = "SAMPLES")]
    pub cost_batch: Option<f64>,
    /// How the run stores activations: f32 (4 bytes) or bf16 (2 bytes, `train --activations
    /// bf16`). The cost file's activation and transfer bytes are rescaled to it. Default: the cost
    /// file's `meta.activation_dtype` (f32 when absent).
    #[arg(long, value_name = "f32|bf16")]
    pub activations: Option<String>,
    /// Schedule families to try (comma separated), `auto` included. Default: all handcrafted ones.
    #[arg(long, value_delimiter = ',')]
    pub families: Vec<String>,
    /// Stages per rank V to try, for families that accept several.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub chunks: Vec<usize>,
    /// Largest number of microbatches M to try.
    #[arg(long, default_value_t = 64)]
    pub max_microbatches: usize,
    /// How many of the best candidates to refine by moving stage boundaries.
    #[arg(long, default_value_t = 4)]
    pub refine: usize,
    /// Non-overlapped share of an overlapped F/B pair (0 = perfect overlap, 1 = none); overrides
    /// the cost file's `overlap_share`.
    #[arg(long = "overlap-share", value_parser = super::simulate::parse_share)]
    pub overlap_share: Option<f64>,
    /// How many plans to print.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Write the chosen plan's predicted timeline as SVG to this file (atomically).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// The automatic scheduler's flags (for `--families auto`; its limit is --memory-limit or
    /// --max-in-flight).
    #[command(flatten)]
    pub auto: AutoArgs,
}

/// `--recompute`: none, full, selective or auto.
pub fn parse_choice(s: &str) -> Result<RecomputeChoice, String> {
    s.parse()
}

/// Whether some layer after the first declares a selective part (a stage holding it and the layer
/// before can recompute selectively).
pub fn declares_selective(costs: &pipefill_host::cost::CostFile) -> bool {
    costs.layers.iter().skip(1).any(|l| l.selective_bytes > 0.0)
}

/// Maps planning errors to the CLI (all usage errors, exit code 2), naming the flag when one is
/// at fault.
fn plan_error(e: PlanError) -> CliError {
    let flag = match &e {
        PlanError::NoRanks => Some("--ranks".to_string()),
        PlanError::Replicas { .. } => Some("--data-parallel".to_string()),
        PlanError::TooFewLayers { stages, .. } => Some(format!("--ranks {stages}")),
        PlanError::NoSamples => Some("--global-batch".to_string()),
        PlanError::CostBatch { .. } => Some("--cost-batch".to_string()),
        PlanError::MemoryLimit { .. } => Some("--memory-limit".to_string()),
        PlanError::NoChunks => Some("--chunks".to_string()),
        PlanError::UnknownFamily { .. } => Some("--families".to_string()),
        _ => None,
    };
    CliError::Usage(match flag {
        Some(f) => format!("{f}: {e}"),
        None => e.to_string(),
    })
}

/// The microbatch size the costs were measured at: the flag, else the file's meta.
pub fn cost_batch(flag: Option<f64>, file: &CostFile) -> Result<f64, CliError> {
    let value = match flag {
        Some(b) => b,
        None => file
            .meta
            .get("microbatch_size")
            .and_then(|v| v.as_f64())
            .ok_or_else(|| {
                CliError::Usage(
                    "the cost file does not say at which microbatch size it was measured (meta.microbatch_size); pass --cost-batch SAMPLES".into(),
                )
            })?,
    };
    if !(value.is_finite() && value > 0.0) {
        return Err(CliError::Usage(format!(
            "--cost-batch {value}: give the microbatch size in samples (> 0) the costs were measured at"
        )));
    }
    Ok(value)
}

/// `--activations`, checked: `None` when absent.
fn activations(flag: Option<&str>) -> Result<Option<ActivationDtype>, CliError> {
    flag.map(|text| {
        ActivationDtype::from_name(text.trim()).ok_or_else(|| {
            CliError::Usage(format!(
                "--activations {text}: give f32 or bf16 (how the run stores activations; the \
                 cost file's activation bytes are rescaled to it)"
            ))
        })
    })
    .transpose()
}

/// Reads the cost file and builds the request from the flags.
pub fn request_from_flags(args: &Args) -> Result<PlanRequest, CliError> {
    let dtype = activations(args.activations.as_deref())?;
    let mut file = CostFile::load(&args.costs).map_err(|e| CliError::Usage(e.to_string()))?;
    if let Some(d) = dtype {
        file = file.with_activation_dtype(d);
    }
    let b0 = cost_batch(args.cost_batch, &file)?;
    let ranks = args.ranks.unwrap_or(1);
    if ranks == 0 {
        return Err(CliError::Usage("--ranks must be at least 1".into()));
    }
    if args.workers == Some(0) {
        return Err(CliError::Usage("--workers must be at least 1".into()));
    }
    if args.data_parallel == 0 {
        return Err(CliError::Usage(
            "--data-parallel must be at least 1 (1: no data parallelism)".into(),
        ));
    }
    let mut link = file.transfer;
    if let Some(b) = args.dp_bandwidth {
        if b.is_nan() || b <= 0.0 {
            return Err(CliError::Usage(format!(
                "--dp-bandwidth {b}: give bytes per second > 0 (inf for free all-reduces)"
            )));
        }
        link.bandwidth = b;
    }
    if let Some(l) = args.dp_latency {
        if !(l.is_finite() && l >= 0.0) {
            return Err(CliError::Usage(format!(
                "--dp-latency {l}: give seconds >= 0"
            )));
        }
        link.latency = l;
    }
    if args.global_batch == 0 {
        return Err(CliError::Usage(
            "--global-batch must be at least 1 sample".into(),
        ));
    }
    if args.max_microbatches == 0 {
        return Err(CliError::Usage(
            "--max-microbatches must be at least 1".into(),
        ));
    }
    if args.chunks.contains(&0) {
        return Err(CliError::Usage(
            "--chunks: every V must be at least 1".into(),
        ));
    }
    let mut req = PlanRequest::new(file, b0, ranks, args.global_batch);
    req.data_parallel = DataParallel {
        replicas: args.data_parallel,
        link,
    };
    req.memory_limit = args.memory_limit;
    req.recompute = args.recompute.unwrap_or(match args.memory_limit {
        Some(_) => RecomputeChoice::Auto,
        None => RecomputeChoice::None,
    });
    if req.recompute == RecomputeChoice::Selective && !declares_selective(&req.costs) {
        return Err(CliError::Usage(
            "--recompute selective: no layer after another declares anything selective (selective_bytes) in the cost file; profile the model with `pipefill profile`, or give --recompute full".into(),
        ));
    }
    req.families = args.families.clone();
    req.chunks = args.chunks.clone();
    req.max_microbatches = args.max_microbatches;
    req.refine = args.refine;
    req.auto = args.auto.options(None);
    if let Some(x) = args.overlap_share {
        req.costs.overlap_share = x;
    }
    Ok(req)
}

#[derive(Serialize)]
struct JsonOut {
    ranks: usize,
    data_parallel: usize,
    workers: Option<usize>,
    global_batch: usize,
    memory_limit: Option<f64>,
    scaling: &'static str,
    overlap_share: f64,
    plans: Vec<Value>,
    skipped: usize,
    chosen: Value,
}

/// The chosen plan as JSON: its summary, its place in the ranking (`"rank"`, 1 = fastest) and the
/// near-tie that decided it (`"near_tie"`, null when the fastest won alone).
fn chosen_json(report: &PlanReport, choice: &Choice) -> Result<Value, CliError> {
    let mut v = summary(&report.plans[choice.index])?;
    if let Some(o) = v.as_object_mut() {
        o.insert("rank".into(), (choice.index + 1).into());
        let tie = serde_json::to_value(&choice.near_tie)
            .map_err(|e| CliError::Failed(format!("cannot write JSON: {e}")))?;
        o.insert("near_tie".into(), tie);
    }
    Ok(v)
}

/// The table's last line: which plan is chosen, and why when it was a near-tie.
fn chosen_line(report: &PlanReport, choice: &Choice) -> String {
    let p = &report.plans[choice.index];
    let which = format!(
        "chosen: #{} {} (V = {}, M = {})",
        choice.index + 1,
        p.family,
        p.chunks,
        p.microbatches
    );
    match &choice.near_tie {
        None => format!("{which}, the fastest"),
        Some(t) => format!(
            "{which}: near-tie, {} plans within {:.1}% of the fastest ({}; profile spread {:.1}%), \
             decided by the rule: {}",
            t.candidates,
            100.0 * t.window,
            t.fastest,
            100.0 * t.spread,
            t.rule
        ),
    }
}

/// A plan as JSON without its schedule and costs (a plan's full form, with them, is what
/// [`Plan`] serialises to).
fn summary(p: &Plan) -> Result<Value, CliError> {
    let mut v =
        serde_json::to_value(p).map_err(|e| CliError::Failed(format!("cannot write JSON: {e}")))?;
    if let Some(o) = v.as_object_mut() {
        o.remove("schedule");
        o.remove("cost");
    }
    Ok(v)
}

/// Runs `pipefill plan`.
pub fn run(args: Args) -> Result<(), CliError> {
    if let Some(path) = &args.svg {
        super::output::check_output("--svg", path)?;
    }
    let req = request_from_flags(&args)?;
    let report = match args.workers {
        Some(n) => {
            let _progress = plan_work(&req, estimated_workers_work(&req, n), "--workers")?;
            plan_workers(&req, n).map_err(plan_error)?
        }
        None => {
            let _progress = plan_work(&req, estimated_work(&req), "--families")?;
            plan(&req).map_err(plan_error)?
        }
    };
    // Near-equal predictions are decided by the stated rule, within the cost file's recorded
    // spread (the narrowest window when it records none).
    let choice = choose(&report.plans, recorded_spread(&req.costs).unwrap_or(0.0))
        .ok_or_else(|| CliError::Failed("no plan to choose".into()))?;
    let shown = &report.plans[..report.plans.len().min(args.top.max(1))];
    match args.format {
        Format::Json => {
            let out = JsonOut {
                ranks: req.ranks,
                data_parallel: req.data_parallel.replicas,
                workers: args.workers,
                global_batch: req.global_batch,
                memory_limit: req.memory_limit,
                scaling: scaling(&req.costs),
                overlap_share: req.costs.overlap_share,
                plans: shown.iter().map(summary).collect::<Result<_, _>>()?,
                skipped: report.skipped.len(),
                chosen: chosen_json(&report, &choice)?,
            };
            let text = serde_json::to_string_pretty(&out)
                .map_err(|e| CliError::Failed(format!("cannot write JSON: {e}")))?;
            println!("{text}");
        }
        Format::Table => {
            print_table(&req, args.workers, &report, shown);
            println!("{}", chosen_line(&report, &choice));
        }
    }
    if let Some(path) = &args.svg {
        let svg = best_timeline_svg(&report.plans[choice.index])?;
        super::output::write_atomic("--svg", path, svg)?;
    }
    Ok(())
}

/// Refuses a search of `cells` (cells of the exact split) estimated past the bound, naming
/// `flag` among the fixes; the progress of one that runs (see `super::sizes::work`).
fn plan_work(
    req: &PlanRequest,
    cells: u64,
    flag: &str,
) -> Result<super::sizes::Progress, CliError> {
    super::sizes::work(
        &format!(
            "plan over {} layers (one exact split per family, V and M tried)",
            req.costs.layers.len()
        ),
        cells as f64 / SPLIT_CELLS_PER_SECOND,
        &format!(
            "fewer --chunks, a smaller --max-microbatches or fewer {flag}, or fewer layers \
             (merge neighbouring layers of the --costs file)"
        ),
    )
}

/// How times are scaled to other microbatch sizes: `sampled` when every layer has samples,
/// `affine` when every layer has a fixed part (and none samples), `linear` when none has either,
/// `mixed` otherwise.
pub fn scaling(costs: &CostFile) -> &'static str {
    let n = costs.layers.len();
    let sampled = costs
        .layers
        .iter()
        .filter(|l| !l.samples.is_empty())
        .count();
    let fixed = costs.layers.iter().filter(|l| l.fixed.is_some()).count();
    match (sampled, fixed) {
        (s, _) if s == n && n > 0 => "sampled",
        (0, 0) => "linear",
        (0, f) if f == n => "affine",
        _ => "mixed",
    }
}

fn print_table(req: &PlanRequest, workers: Option<usize>, report: &PlanReport, shown: &[Plan]) {
    println!(
        "{} plans for {} N={}{}, {} time scaling, overlap share {} ({} candidates ruled out); \
         best first:",
        report.plans.len(),
        match workers {
            Some(n) => format!("{n} workers (P x D)"),
            None => format!("P={} D={}", req.ranks, req.data_parallel.replicas),
        },
        req.global_batch,
        req.memory_limit
            .map(|l| format!(" memory limit {l:.0} B/rank"))
            .unwrap_or_default(),
        scaling(&req.costs),
        req.costs.overlap_share,
        report.skipped.len()
    );
    println!(
        "{:>3}  {:<17} {:>2} {:>2} {:>2} {:>4} {:>5}  {:<19} {:>12} {:>7} {:>14} {:>9} {:>8}  layers per stage",
        "#", "family", "P", "D", "V", "M", "mb", "partition", "step (s)", "bubble", "peak mem (B)", "recompute", "/bound"
    );
    for (i, p) in shown.iter().enumerate() {
        let mem = p.peak_memory.iter().copied().fold(0.0, f64::max);
        println!(
            "{:>3}  {:<17} {:>2} {:>2} {:>2} {:>4} {:>5}  {:<19} {:>12.6} {:>6.1}% {:>14.0} {:>9} {:>8.3}  {:?}",
            i + 1,
            p.family,
            p.ranks,
            p.data_parallel,
            p.chunks,
            p.microbatches,
            p.microbatch_size,
            p.partition,
            p.step_time,
            100.0 * p.bubble_fraction,
            mem,
            recompute_summary(&p.recompute),
            p.ratio_to_bound,
            p.layers_per_stage
        );
    }
}

/// The chosen plan's predicted timeline as SVG (its schedule simulated under the costs it was scored
/// with).
fn best_timeline_svg(best: &Plan) -> Result<String, CliError> {
    let timeline = best
        .timeline()
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let options = SvgOptions {
        title: format!(
            "chosen plan: {} V={} M={} {} {:?}: predicted {:.6} s",
            best.family,
            best.chunks,
            best.microbatches,
            best.partition,
            best.layers_per_stage,
            best.step_time
        ),
        rebuild_share: vec![best.cost.rebuild_shares(&best.schedule)],
        ..SvgOptions::default()
    };
    Ok(svg_gantt(&[&timeline], &options))
}
