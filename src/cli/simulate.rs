//! `pipefill simulate` (to be written).

use super::CliError;

/// Flags of `pipefill simulate`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `pipefill simulate`.
pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed(
        "`pipefill simulate` is not implemented yet".into(),
    ))
}
