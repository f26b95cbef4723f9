//! `pipefill profile` (to be written).

use super::CliError;

/// Flags of `pipefill profile`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `pipefill profile`.
pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed(
        "`pipefill profile` is not implemented yet".into(),
    ))
}
