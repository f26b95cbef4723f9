//! `pipefill bench auto`: the automatic scheduler's evidence.
//!
//! - **grid** (module `grid`): `P` in 4, 8, 16; `M` in `P`, `2P`, `4P`; `F:I:W` 1:1:1, 2:2:1,
//!   1:1.2:0.8; transfers 0 and 10 % of `F`; even stages and first and last stage 1.5x; limits of
//!   1F1B's in-flight count (`P`), 1.5x and 2x on looped placement, 1F1B's and half of it on
//!   V-shape. Per instance: makespan / lower bound of `auto` and of every handcrafted family that
//!   fits, whether `auto` is proven optimal, and the solve time; then the aims checked over the grid.
//! - **vshape** (module `vgrid`): `V = 2` V-shape only, even stages, at V-Half's (`P/2`), 1F1B's
//!   (`P`) and twice 1F1B's (`2P`) in-flight count, both objectives: `auto` and every V-shape family
//!   that fits against the bound, with solve times.
//! - **paper** (module `paper`): the zero-bubble paper's profiled times (its Table 9) with its
//!   memory limits (`p M_B`, `2p M_B`), `auto`'s bubble rate (span objective, the paper's definition)
//!   next to the paper's published ZB-1p and ZB-2p rates (its Table 5).
//! - **recompute** (module `recompute`): the planner on the paper's `p = 8` inputs under `2p`, `p`
//!   and `p/2` `M_B` per rank, without recomputation, with it everywhere and choosing per stage.
//!
//! `--quick` runs a few instances of each with a small budget (for tests).

use clap::ValueEnum;
use pipefill_host::auto::DEFAULT_TIME_BUDGET;
use pipefill_host::cost::flag::parse_time;
use serde::Serialize;

use super::grid::{self, GridReport};
use super::paper::{self, PaperReport};
use super::recompute::{self, RecomputeRow};
use super::vgrid::{self, VReport};
use crate::cli::CliError;

/// Which parts to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// The grid, the V-shape grid and the paper's table.
    All,
    /// The grid only.
    Grid,
    /// The paper's table only.
    Paper,
    /// The V-shape grid only (both objectives).
    Vshape,
    /// The planner with and without recomputation on the paper's inputs.
    Recompute,
}

/// Flags of `pipefill bench auto`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A few instances of each part with a small budget (seconds, for tests).
    #[arg(long)]
    pub quick: bool,
    /// Which parts to run.
    #[arg(long, value_enum, default_value_t = Part::All)]
    pub part: Part,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// The solver's time budget per instance (seconds, or with a suffix: 200ms).
    #[arg(long = "time-budget", default_value_t = DEFAULT_TIME_BUDGET, value_parser = parse_time)]
    pub time_budget: f64,
    /// The solver's seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct Report {
    time_budget: f64,
    seed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    grid: Option<GridReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vshape: Option<VReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    paper: Option<PaperReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    recompute: Option<Vec<RecomputeRow>>,
}

/// Runs `pipefill bench auto`.
pub fn run(args: Args) -> Result<(), CliError> {
    let budget = if args.quick {
        args.time_budget.min(0.02)
    } else {
        args.time_budget
    };
    let grid = matches!(args.part, Part::All | Part::Grid)
        .then(|| grid::run(args.quick, budget, args.seed))
        .transpose()?;
    let vshape = matches!(args.part, Part::All | Part::Vshape)
        .then(|| vgrid::run(args.quick, budget, args.seed))
        .transpose()?;
    let paper = matches!(args.part, Part::All | Part::Paper)
        .then(|| paper::run(args.quick, budget, args.seed))
        .transpose()?;
    let recompute = matches!(args.part, Part::All | Part::Recompute)
        .then(|| recompute::run(args.quick, budget, args.seed))
        .transpose()?;
    if args.json {
        let report = Report {
            time_budget: budget,
            seed: args.seed,
            grid,
            vshape,
            paper,
            recompute,
        };
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::Failed(format!("cannot write JSON: {e}")))?;
        println!("{text}");
        return Ok(());
    }
    println!(
        "pipefill bench auto: time budget {budget} s per instance, seed {}",
        args.seed
    );
    if let Some(g) = &grid {
        println!();
        print!("{}", grid::table(g));
    }
    if let Some(v) = &vshape {
        println!();
        print!("{}", vgrid::table(v));
    }
    if let Some(p) = &paper {
        println!();
        print!("{}", paper::table(p));
    }
    if let Some(r) = &recompute {
        println!();
        print!("{}", recompute::table(r));
    }
    Ok(())
}
