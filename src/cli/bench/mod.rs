//! `pipefill bench`: commands that produce the evidence behind a claim, as a table or JSON, one file
//! per bench.
//!
//! ```text
//! pipefill bench auto [--quick] [--part all|grid|vshape|paper|recompute] [--json] [--time-budget S] [--seed N]
//! pipefill bench overlap [...]     (needs a CUDA device; says it skipped otherwise)
//! ```

use clap::Subcommand;

use super::CliError;

pub mod auto;
mod grid;
pub mod overlap;
mod paper;
mod recompute;
mod vgrid;

/// Flags of `pipefill bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Which bench.
    #[command(subcommand)]
    pub command: Command,
}

/// The benches.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The automatic scheduler against the handcrafted families and the lower bound (a grid of
    /// shapes, costs and memory limits) and against the zero-bubble paper's published bubble rates.
    Auto(auto::Args),
    /// One stage's F and another's B on two CUDA streams of one GPU, alone and together: the
    /// measured overlap share.
    Overlap(overlap::Args),
}

/// Runs `pipefill bench`.
pub fn run(args: Args) -> Result<(), CliError> {
    match args.command {
        Command::Auto(a) => auto::run(a),
        Command::Overlap(a) => overlap::run(a),
    }
}
