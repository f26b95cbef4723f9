//! The gate in front of the executor: only a schedule that validates runs.

use crate::schedule::validate::validate;
use crate::schedule::{Schedule, ScheduleError};

/// Refuses a schedule the executor cannot run: anything [`validate`] rejects (shape, placement,
/// completeness, and the dependency dry run that rules out deadlocks).
pub(super) fn check_schedule(s: &Schedule) -> Result<(), ScheduleError> {
    validate(s).map(|_| ())
}
