//! The `zb-h2` schedule family (to be written).

use super::{Params, Schedule, ScheduleError};

/// Generates a `zb-h2` schedule.
pub fn generate(_p: &Params) -> Result<Schedule, ScheduleError> {
    Err(ScheduleError::refused("zb-h2", "not implemented yet"))
}
