//! The `pipefill` command line: one file per subcommand, errors mapped to exit codes here.

use clap::{Parser, Subcommand};

pub mod auto_flags;
pub mod bench;
pub mod device;
pub mod model_flags;
pub mod output;
pub mod partition;
pub mod plan;
pub mod profile;
pub mod schedule;
pub mod simulate;
pub mod sizes;
pub mod train;

/// An error the CLI prints before exiting.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad input from the user (flag, file): exit code 2.
    #[error("{0}")]
    Usage(String),
    /// Something failed while doing valid work: exit code 1.
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}

/// pipefill: remove pipeline bubbles. Generate, validate, simulate and run pipeline-parallel schedules.
#[derive(Debug, Parser)]
#[command(name = "pipefill", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate, list or validate schedules.
    Schedule(schedule::Args),
    /// Predict makespan and bubble of schedules with the discrete-event simulator.
    Simulate(simulate::Args),
    /// Train the built-in model with a pipeline schedule (the main job).
    Train(train::Args),
    /// Measure per-layer F/I/W cost and memory, write a cost file.
    Profile(profile::Args),
    /// Split layers into stages by measured cost.
    Partition(partition::Args),
    /// Search partition x schedule x V x M for the best plan.
    Plan(plan::Args),
    /// Measurements and evidence as commands that print tables (`bench auto`: the automatic
    /// scheduler against the handcrafted families and the zero-bubble paper; `bench overlap`: two
    /// streams of one GPU, alone and together).
    Bench(bench::Args),
    /// What the CUDA backend finds here: driver, devices, NCCL, the CUDA libraries loaded, and a
    /// load of the kernels with the JIT's log (exit 2 without a driver or GPU).
    Device(device::Args),
}

/// Parses the arguments, runs the subcommand and returns the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Schedule(a) => schedule::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Train(a) => train::run(a),
        Command::Profile(a) => profile::run(a),
        Command::Partition(a) => partition::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Device(a) => device::run(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}
