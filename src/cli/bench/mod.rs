//! `pipefill bench`: measurements as commands, one file per bench.

use super::CliError;

pub mod overlap;

/// Flags of `pipefill bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Which bench.
    #[command(subcommand)]
    pub command: Command,
}

/// The benches.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// One stage's F and another's B on two CUDA streams of one GPU, alone and together: the
    /// measured overlap share.
    Overlap(overlap::Args),
}

/// Runs `pipefill bench`.
pub fn run(args: Args) -> Result<(), CliError> {
    match args.command {
        Command::Overlap(a) => overlap::run(a),
    }
}
