//! `pipefill schedule` (to be written).

use super::CliError;

/// Flags of `pipefill schedule`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `pipefill schedule`.
pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed(
        "`pipefill schedule` is not implemented yet".into(),
    ))
}
