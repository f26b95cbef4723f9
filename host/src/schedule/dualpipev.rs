//! The `dualpipev` schedule family (to be written).

use super::{Params, Schedule, ScheduleError};

/// Generates a `dualpipev` schedule.
pub fn generate(_p: &Params) -> Result<Schedule, ScheduleError> {
    Err(ScheduleError::refused("dualpipev", "not implemented yet"))
}
