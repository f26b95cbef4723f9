//! The `zbv` schedule family (to be written).

use super::{Params, Schedule, ScheduleError};

/// Generates a `zbv` schedule.
pub fn generate(_p: &Params) -> Result<Schedule, ScheduleError> {
    Err(ScheduleError::refused("zbv", "not implemented yet"))
}
