//! The `gpipe` schedule family (to be written).

use super::{Params, Schedule, ScheduleError};

/// Generates a `gpipe` schedule.
pub fn generate(_p: &Params) -> Result<Schedule, ScheduleError> {
    Err(ScheduleError::refused("gpipe", "not implemented yet"))
}
