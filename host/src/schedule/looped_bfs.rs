//! The `looped-bfs` schedule family (to be written).

use super::{Params, Schedule, ScheduleError};

/// Generates a `looped-bfs` schedule.
pub fn generate(_p: &Params) -> Result<Schedule, ScheduleError> {
    Err(ScheduleError::refused("looped-bfs", "not implemented yet"))
}
