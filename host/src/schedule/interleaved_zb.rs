//! The `interleaved-zb` schedule family (to be written).

use super::{Params, Schedule, ScheduleError};

/// Generates a `interleaved-zb` schedule.
pub fn generate(_p: &Params) -> Result<Schedule, ScheduleError> {
    Err(ScheduleError::refused(
        "interleaved-zb",
        "not implemented yet",
    ))
}
