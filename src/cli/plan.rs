//! `pipefill plan` (to be written).

use super::CliError;

/// Flags of `pipefill plan`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `pipefill plan`.
pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed(
        "`pipefill plan` is not implemented yet".into(),
    ))
}
