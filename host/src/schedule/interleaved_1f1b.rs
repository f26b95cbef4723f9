//! The `interleaved-1f1b` schedule family (to be written).

use super::{Params, Schedule, ScheduleError};

/// Generates a `interleaved-1f1b` schedule.
pub fn generate(_p: &Params) -> Result<Schedule, ScheduleError> {
    Err(ScheduleError::refused(
        "interleaved-1f1b",
        "not implemented yet",
    ))
}
