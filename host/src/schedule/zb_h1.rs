//! The `zb-h1` schedule family (to be written).

use super::{Params, Schedule, ScheduleError};

/// Generates a `zb-h1` schedule.
pub fn generate(_p: &Params) -> Result<Schedule, ScheduleError> {
    Err(ScheduleError::refused("zb-h1", "not implemented yet"))
}
