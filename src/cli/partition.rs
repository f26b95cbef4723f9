//! `pipefill partition`: split the layers of a cost file into stages.
//!
//! ```text
//! pipefill partition --costs costs.json --stages 4 [--ranks 2] [--placement looped|vshape]
//!     [--method optimal|uniform|parameters|time-greedy|all] [--format table|json]
//!     [--memory-limit BYTES --schedule 1f1b --microbatches 8]
//! ```
//!
//! JSON (`--format json`): one object per method (an array with `--method all`) with `method`,
//! `ranks`, `chunks`, `placement`, `layers_per_stage`, `boundaries`, `stage_costs`, `rank_loads`,
//! `bottleneck` (seconds, per microbatch, `F + I + W` plus boundary transfers), `exact`, and
//! `ratio_to_optimal`.

use std::path::PathBuf;

use clap::ValueEnum;
use pipefill_host::cost::flag::parse_bytes_u64;
use pipefill_host::cost::CostFile;
use pipefill_host::partition::{
    split_work, Layout, MemoryLimit, Method, Partition, PartitionError, Problem, NANOS_PER_SECOND,
    SPLIT_CELLS_PER_SECOND,
};
use pipefill_host::schedule::{families, Params, Placement, ScheduleError};
use serde::Serialize;

use super::CliError;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A table for people.
    Table,
    /// JSON for programs.
    Json,
}

/// Which balancer(s) to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MethodArg {
    /// Minimise the slowest rank exactly.
    Optimal,
    /// Equal layer counts.
    Uniform,
    /// Balance parameter bytes (DeepSpeed's default balancer).
    Parameters,
    /// torchgpipe's balance_by_time (block partition heuristic).
    TimeGreedy,
    /// All of the above, compared.
    All,
}

impl MethodArg {
    fn methods(self) -> Vec<Method> {
        match self {
            MethodArg::Optimal => vec![Method::Optimal],
            MethodArg::Uniform => vec![Method::Uniform],
            MethodArg::Parameters => vec![Method::Parameters],
            MethodArg::TimeGreedy => vec![Method::TimeGreedy],
            MethodArg::All => Method::ALL.to_vec(),
        }
    }
}

/// Stage placement flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlacementArg {
    /// `rank = stage % P`.
    Looped,
    /// `stage < P -> stage`, else `2P - 1 - stage` (needs `S = 2P`).
    Vshape,
}

impl From<PlacementArg> for Placement {
    fn from(p: PlacementArg) -> Self {
        match p {
            PlacementArg::Looped => Placement::Looped,
            PlacementArg::Vshape => Placement::Vshape,
        }
    }
}

/// Flags of `pipefill partition`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Cost file (per-layer JSON, schema in docs/formats.md).
    #[arg(long, value_name = "FILE")]
    pub costs: PathBuf,
    /// Number of stages S.
    #[arg(long)]
    pub stages: usize,
    /// Number of ranks P (S must be a multiple of P; V = S / P stages per rank). Default: S.
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Stage placement when V > 1.
    #[arg(long, value_enum, default_value = "looped")]
    pub placement: PlacementArg,
    /// Balancer.
    #[arg(long, value_enum, default_value = "optimal")]
    pub method: MethodArg,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Per-rank memory limit in bytes (parameters + activations in flight); needs --schedule and
    /// --microbatches to know how many microbatches each stage holds.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes_u64)]
    pub memory_limit: Option<u64>,
    /// Schedule family whose in-flight activations count against --memory-limit.
    #[arg(long)]
    pub schedule: Option<String>,
    /// Microbatches per step for --schedule.
    #[arg(long)]
    pub microbatches: Option<usize>,
}

/// One method's result, as printed.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Balancer name.
    pub method: &'static str,
    /// P.
    pub ranks: usize,
    /// V.
    pub chunks: usize,
    /// Placement (`looped` or `vshape`).
    pub placement: Placement,
    /// Layers in each stage.
    pub layers_per_stage: Vec<usize>,
    /// `S + 1` layer indices.
    pub boundaries: Vec<usize>,
    /// Seconds per microbatch per stage.
    pub stage_costs: Vec<f64>,
    /// Seconds per microbatch per rank.
    pub rank_loads: Vec<f64>,
    /// Largest rank load, seconds.
    pub bottleneck: f64,
    /// Proven optimal.
    pub exact: bool,
    /// Bottleneck over the optimal bottleneck (when computed).
    pub ratio_to_optimal: Option<f64>,
}

fn secs(ns: u64) -> f64 {
    ns as f64 / NANOS_PER_SECOND
}

impl Report {
    fn new(method: Method, layout: &Layout, p: &Partition, optimum: Option<u64>) -> Self {
        Report {
            method: method.name(),
            ranks: layout.ranks,
            chunks: layout.chunks,
            placement: layout.placement,
            layers_per_stage: p.layers_per_stage(),
            boundaries: p.boundaries.clone(),
            stage_costs: p.stage_costs.iter().map(|&c| secs(c)).collect(),
            rank_loads: p.rank_loads.iter().map(|&c| secs(c)).collect(),
            bottleneck: secs(p.bottleneck),
            exact: p.exact,
            ratio_to_optimal: optimum
                .filter(|&o| o > 0)
                .map(|o| p.bottleneck as f64 / o as f64),
        }
    }
}

/// Maps partition errors to the CLI: input problems are usage errors (exit 2).
pub fn partition_error(e: PartitionError) -> CliError {
    match e {
        PartitionError::SearchBudget { .. } => CliError::Failed(e.to_string()),
        PartitionError::OverMemory { .. } => CliError::Usage(format!("{e} (--method optimal)")),
        other => CliError::Usage(other.to_string()),
    }
}

/// Checks `--stages`, `--ranks`, `--placement` and returns the layout.
pub fn layout_from_flags(
    stages: usize,
    ranks: Option<usize>,
    placement: Placement,
) -> Result<Layout, CliError> {
    if stages == 0 {
        return Err(CliError::Usage(
            "--stages must be at least 1 (the number of pipeline stages)".into(),
        ));
    }
    let ranks = ranks.unwrap_or(stages);
    if ranks == 0 || stages % ranks != 0 {
        return Err(CliError::Usage(format!(
            "--ranks {ranks}: --stages ({stages}) must be a positive multiple of --ranks; use a divisor of {stages}"
        )));
    }
    let chunks = stages / ranks;
    if placement == Placement::Vshape && chunks != 2 {
        return Err(CliError::Usage(format!(
            "--placement vshape needs exactly 2 stages per rank (--stages = 2 x --ranks), got {chunks}"
        )));
    }
    Ok(Layout {
        ranks,
        chunks,
        placement,
    })
}

fn memory_limit(args: &Args, layout: &Layout) -> Result<Option<MemoryLimit>, CliError> {
    let Some(bytes) = args.memory_limit else {
        if args.schedule.is_some() || args.microbatches.is_some() {
            return Err(CliError::Usage(
                "--schedule and --microbatches only matter with --memory-limit; add --memory-limit BYTES or drop them".into(),
            ));
        }
        return Ok(None);
    };
    let (Some(name), Some(m)) = (args.schedule.as_deref(), args.microbatches) else {
        return Err(CliError::Usage(
            "--memory-limit needs --schedule FAMILY and --microbatches M (to count the activations each stage holds)".into(),
        ));
    };
    let fam = families::family(name).map_err(|e| match e {
        ScheduleError::AutoNeedsCosts => CliError::Usage(
            "--schedule auto: partition counts the activations of a fixed family; give one \
             (`pipefill schedule --list`), or let `pipefill plan --families auto` split the layers \
             for auto"
                .into(),
        ),
        e => CliError::Usage(format!("--schedule: {e}")),
    })?;
    if fam.placement != layout.placement {
        return Err(CliError::Usage(format!(
            "--schedule {name} uses {} placement but --placement is {}; pass --placement {}",
            fam.placement, layout.placement, fam.placement
        )));
    }
    let params = Params::new(layout.ranks, m).with_chunks(layout.chunks);
    let schedule = families::generate(name, &params).map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(Some(MemoryLimit::of_schedule(bytes, &schedule)))
}

/// Runs `pipefill partition`.
pub fn run(args: Args) -> Result<(), CliError> {
    let file = CostFile::load(&args.costs).map_err(|e| CliError::Usage(e.to_string()))?;
    let layout = layout_from_flags(args.stages, args.ranks, args.placement.into())?;
    let limit = memory_limit(&args, &layout)?;
    let problem = Problem::from_layers(&file.layers, &file.transfer).map_err(partition_error)?;
    let cells = split_work(file.layers.len(), layout.stages());
    let _progress = super::sizes::work(
        &format!(
            "partition of {} layers into {} stages",
            file.layers.len(),
            layout.stages()
        ),
        cells as f64 / SPLIT_CELLS_PER_SECOND,
        "fewer layers (merge neighbouring layers of the --costs file into one entry) or fewer \
         --stages",
    )?;
    let optimum = Method::Optimal
        .apply(&problem, &layout, limit.as_ref())
        .map_err(partition_error)?;
    let mut reports = Vec::new();
    for m in args.method.methods() {
        let p = if m == Method::Optimal {
            optimum.clone()
        } else {
            m.apply(&problem, &layout, limit.as_ref())
                .map_err(partition_error)?
        };
        reports.push(Report::new(m, &layout, &p, Some(optimum.bottleneck)));
    }
    match args.format {
        Format::Json => {
            let text = if reports.len() == 1 {
                serde_json::to_string_pretty(&reports[0])
            } else {
                serde_json::to_string_pretty(&reports)
            }
            .map_err(|e| CliError::Failed(format!("cannot write JSON: {e}")))?;
            println!("{text}");
        }
        Format::Table => print_table(&reports, &file),
    }
    Ok(())
}

fn print_table(reports: &[Report], file: &CostFile) {
    for r in reports {
        println!(
            "{}: P={} V={} {}  bottleneck {:.6} s/microbatch{}{}",
            r.method,
            r.ranks,
            r.chunks,
            r.placement,
            r.bottleneck,
            r.ratio_to_optimal
                .map(|x| format!("  ({x:.3}x optimal)"))
                .unwrap_or_default(),
            if r.method == "optimal" && !r.exact {
                "  (search budget ran out: best found, not proven optimal)"
            } else {
                ""
            }
        );
        println!("  stage  rank  layers  cost (s)     first..last layer");
        for (s, w) in r.boundaries.windows(2).enumerate() {
            let rank = r.placement.rank_of(s, r.ranks);
            let name = |i: usize| file.layers.get(i).map_or("?", |l| l.name.as_str());
            println!(
                "  {:>5}  {:>4}  {:>6}  {:<11.6}  {}..{}",
                s,
                rank,
                w[1] - w[0],
                r.stage_costs[s],
                name(w[0]),
                name(w[1] - 1)
            );
        }
    }
}
