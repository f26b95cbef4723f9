//! The flags of the automatic scheduler (`--schedule auto` in `schedule` and `simulate`,
//! `--families auto` in `plan`, `--schedule auto` in `train`), and the cost flags `schedule` takes
//! for it. Checked at the edge: every refusal names the flag and the fix, exit code 2.

use std::path::PathBuf;

use pipefill_host::auto::{
    solve, AutoError, AutoOptions, AutoSchedule, MemoryLimit, Objective, DEFAULT_TIME_BUDGET,
};
use pipefill_host::cost::flag::{parse_bandwidth, parse_bytes, parse_time};
use pipefill_host::cost::{CostModel, CostSpec};
use pipefill_host::schedule::Placement;

use super::simulate::{cost_spec_of, CostFlags};
use super::CliError;

/// The flags that steer `auto`, the same in every subcommand that can run it (`train` takes these
/// alone: its own `--seed` seeds `auto` too, and its costs are the run's profile).
#[derive(Debug, Clone, clap::Args)]
pub struct AutoSteer {
    /// auto: at most this many microbatches in flight per rank (fractional allowed; one unit is one
    /// rank's activations for one microbatch, a V-shape chunk counts 1/2).
    #[arg(long = "max-in-flight", value_name = "N", value_parser = parse_in_flight, allow_hyphen_values = true)]
    pub max_in_flight: Option<f64>,
    /// auto: what to minimise, `makespan` (the step) or `span` (the longest per-rank span, the
    /// zero-bubble papers' objective).
    #[arg(long, value_name = "OBJECTIVE", default_value = "makespan", value_parser = parse_objective)]
    pub objective: Objective,
    /// auto: seconds of improvement after the constructive phase, given to each improvement phase
    /// of each run (2 runs for the makespan, 4 for the span, side by side), so a request's wall time
    /// is a few times it (0.3 s: 0.6-1.2 s on two cores; 1 s: 2.5-4.5 s); counted as work, so the
    /// result depends only on the inputs and --seed; more than the default is never worse than the
    /// default.
    #[arg(long = "time-budget", value_name = "SECONDS", default_value_t = DEFAULT_TIME_BUDGET, value_parser = parse_time_budget, allow_hyphen_values = true)]
    pub time_budget: f64,
    /// auto: stage placement, `looped` or `vshape` (V = 2).
    #[arg(long, value_name = "PLACEMENT", default_value = "looped", value_parser = parse_placement)]
    pub placement: Placement,
}

impl AutoSteer {
    /// The first of these flags given away from its default (they only steer `auto`).
    pub fn given(&self) -> Option<&'static str> {
        if self.max_in_flight.is_some() {
            Some("--max-in-flight")
        } else if self.objective != Objective::Makespan {
            Some("--objective")
        } else if self.time_budget != DEFAULT_TIME_BUDGET {
            Some("--time-budget")
        } else if self.placement != Placement::Looped {
            Some("--placement")
        } else {
            None
        }
    }

    /// These flags as `auto`'s, seeded with `seed`.
    pub fn with_seed(&self, seed: u64) -> AutoArgs {
        AutoArgs {
            steer: self.clone(),
            seed,
        }
    }
}

/// The `auto` flags of `schedule`, `simulate` and `plan`: the steering flags and the seed.
#[derive(Debug, Clone, clap::Args)]
pub struct AutoArgs {
    /// The steering flags.
    #[command(flatten)]
    pub steer: AutoSteer,
    /// auto: seed of the improvement phase.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl AutoArgs {
    /// The first of these flags given away from its default (they only steer `auto`).
    pub fn given(&self) -> Option<&'static str> {
        self.steer.given().or((self.seed != 0).then_some("--seed"))
    }

    /// These flags as the library's options for `auto` (`V` from the placement, or `chunks`).
    pub fn options(&self, chunks: Option<usize>) -> AutoOptions {
        let s = &self.steer;
        AutoOptions {
            placement: s.placement,
            chunks,
            max_in_flight: s.max_in_flight,
            objective: s.objective,
            time_budget: s.time_budget,
            seed: self.seed,
        }
    }
}

/// The cost flags of `pipefill schedule` (the same as `simulate`'s, read by the same code).
#[derive(Debug, Clone, clap::Args)]
pub struct CostArgs {
    /// auto: uniform costs of one rank's work at V = 1, e.g. `F=1,I=1,W=1` or `F=2ms,B=4ms,A=64MiB`
    /// (keys F I W B times, A R P O bytes). Default `F=1,I=1,W=1`.
    #[arg(long, conflicts_with = "costs")]
    pub cost: Option<String>,
    /// auto: cost file (per-layer `"layers"` or per-stage `"stages"`, schema in docs/formats.md).
    #[arg(long, value_name = "FILE")]
    pub costs: Option<PathBuf>,
    /// auto: with a per-layer cost file, layers per stage, comma-separated.
    #[arg(long = "layers-per-stage", value_delimiter = ',')]
    pub layers_per_stage: Option<Vec<usize>>,
    /// auto: latency of every transfer between ranks (seconds, or 20us, 1ms).
    #[arg(long = "comm-latency", value_parser = parse_time)]
    pub comm_latency: Option<f64>,
    /// auto: bandwidth between ranks in bytes per second (e.g. 2.5e10, 25GB).
    #[arg(long = "comm-bandwidth", value_parser = parse_bandwidth)]
    pub comm_bandwidth: Option<f64>,
    /// auto: memory limit per rank in bytes, parameters included (needs activation sizes, A=).
    #[arg(long = "memory-limit", value_name = "BYTES", value_parser = parse_bytes, conflicts_with = "max_in_flight")]
    pub memory_limit: Option<f64>,
}

impl CostArgs {
    /// The first of these flags given (they only serve `auto` in `pipefill schedule`).
    pub fn given(&self) -> Option<&'static str> {
        [
            (self.cost.is_some(), "--cost"),
            (self.costs.is_some(), "--costs"),
            (self.layers_per_stage.is_some(), "--layers-per-stage"),
            (self.comm_latency.is_some(), "--comm-latency"),
            (self.comm_bandwidth.is_some(), "--comm-bandwidth"),
            (self.memory_limit.is_some(), "--memory-limit"),
        ]
        .into_iter()
        .find_map(|(given, name)| given.then_some(name))
    }

    /// The cost source the flags name.
    pub fn spec(&self) -> Result<CostSpec, CliError> {
        cost_spec_of(CostFlags {
            cost: self.cost.as_deref(),
            costs: self.costs.as_deref(),
            layers_per_stage: self.layers_per_stage.as_deref(),
            comm_latency: self.comm_latency,
            comm_bandwidth: self.comm_bandwidth,
            overlap_share: None,
        })
    }
}

/// Refuses `flag` when no `auto` schedule is asked for (it would do nothing).
pub fn only_for_auto(flag: Option<&str>) -> Result<(), CliError> {
    match flag {
        Some(f) => Err(CliError::Usage(format!(
            "{f} steers the automatic scheduler only: add auto to --schedule, or drop {f}"
        ))),
        None => Ok(()),
    }
}

/// The limit from `--memory-limit` or `--max-in-flight` (clap refuses both at once).
pub fn limit(memory_limit: Option<f64>, max_in_flight: Option<f64>) -> Option<MemoryLimit> {
    memory_limit
        .map(MemoryLimit::Bytes)
        .or(max_in_flight.map(MemoryLimit::InFlight))
}

/// The shape of one `auto` solve, and of the size estimates (`super::sizes`).
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// `P`.
    pub ranks: usize,
    /// `M`.
    pub microbatches: usize,
    /// `V`.
    pub chunks: usize,
}

/// Solves `auto` for `shape` under `costs` (one per stage) and the flags; errors name the flag.
pub fn solve_auto(
    shape: Shape,
    costs: CostModel,
    limit: Option<MemoryLimit>,
    args: &AutoArgs,
) -> Result<AutoSchedule, CliError> {
    let req =
        args.options(None)
            .request(shape.ranks, shape.microbatches, shape.chunks, costs, limit);
    solve(&req).map_err(|e| auto_error(e, limit))
}

/// An [`AutoError`] on the command line: which flag to change.
fn auto_error(e: AutoError, limit: Option<MemoryLimit>) -> CliError {
    let limit_flag = match limit {
        Some(MemoryLimit::Bytes(_)) => "--memory-limit",
        _ => "--max-in-flight",
    };
    let usage = |flag: &str, fix: &str| CliError::Usage(format!("{flag}: {e}; {fix}"));
    match &e {
        AutoError::LimitTooLow { needed, .. } => usage(
            limit_flag,
            &format!("raise it to at least {needed}, or use fewer chunks or smaller microbatches"),
        ),
        AutoError::BadLimit { .. } => usage(limit_flag, "give a positive number"),
        AutoError::NoActivationSizes => usage(
            "--memory-limit",
            "add A=BYTES to --cost (or activation_bytes to the --costs file), or use --max-in-flight N",
        ),
        AutoError::BadBudget { .. } => usage("--time-budget", "give seconds >= 0, e.g. 0.5"),
        AutoError::OverBudget { seconds, .. } => usage(
            "--time-budget",
            &format!(
                "raise it to at least {:.0} s, or use fewer --chunks or --microbatches",
                seconds.ceil()
            ),
        ),
        AutoError::Shape(_) => usage(
            "--ranks, --microbatches, --chunks, --placement",
            "vshape needs --chunks 2",
        ),
        AutoError::Cost(_) | AutoError::Stages { .. } => {
            usage("--cost/--costs", "give one cost per stage (P x V stages)")
        }
        AutoError::Internal(_) => CliError::Failed(e.to_string()),
        // A variant added later: the message names its cause.
        _ => CliError::Failed(e.to_string()),
    }
}

/// `--objective` (clap value parser).
fn parse_objective(text: &str) -> Result<Objective, String> {
    text.parse().map_err(|e| format!("{e}"))
}

/// `--placement` (clap value parser).
fn parse_placement(text: &str) -> Result<Placement, String> {
    text.parse()
        .map_err(|e: pipefill_host::schedule::ScheduleError| e.to_string())
}

/// `--max-in-flight`: a positive finite number (clap value parser).
fn parse_in_flight(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "`{text}` is not a positive number of microbatches in flight, e.g. 4 or 2.5"
        )),
    }
}

/// A one-line summary of what the solver found, for people.
pub fn summary(out: &AutoSchedule) -> String {
    let s = &out.solver;
    format!(
        "auto: {} {:.6}, lower bound {:.6}, gap {:.2}%{}, from {}, peak {:.3} {} ({} candidates simulated)",
        s.objective,
        s.value,
        s.lower_bound,
        100.0 * s.gap,
        if s.proven_optimal { " (proven optimal)" } else { "" },
        s.origin,
        s.peak.iter().copied().fold(0.0, f64::max),
        s.peak_unit,
        s.evaluations
    )
}

/// The longest `--time-budget` accepted, in seconds.
pub const MAX_TIME_BUDGET: f64 = 3600.0;

/// `--time-budget`: a time (as every time flag takes it) of at most [`MAX_TIME_BUDGET`].
fn parse_time_budget(text: &str) -> Result<f64, String> {
    let v = parse_time(text)?;
    if v > MAX_TIME_BUDGET {
        return Err(format!(
            "`{text}` is more than {MAX_TIME_BUDGET} s; the scheduler's improvement phase gains \
             little after a few seconds (the default is {DEFAULT_TIME_BUDGET} s)"
        ));
    }
    Ok(v)
}
