//! `pipefill bench`: commands that produce the evidence behind a claim, as a table or JSON.
//!
//! ```text
//! pipefill bench auto [--quick] [--part all|grid|paper] [--json] [--time-budget S] [--seed N]
//! ```

use clap::Subcommand;

use super::CliError;

pub mod auto;
mod grid;
mod paper;

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
}

/// Runs `pipefill bench`.
pub fn run(args: Args) -> Result<(), CliError> {
    match args.command {
        Command::Auto(a) => auto::run(a),
    }
}
