//! `pipefill train` (to be written).

use super::CliError;

/// Flags of `pipefill train`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `pipefill train`.
pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed(
        "`pipefill train` is not implemented yet".into(),
    ))
}
