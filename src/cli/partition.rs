//! `pipefill partition` (to be written).

use super::CliError;

/// Flags of `pipefill partition`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `pipefill partition`.
pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed(
        "`pipefill partition` is not implemented yet".into(),
    ))
}
