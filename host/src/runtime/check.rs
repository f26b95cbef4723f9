//! The gate in front of every executor: only a schedule that validates runs, over as many stages as
//! it has.

use super::RuntimeError;
use crate::schedule::validate::validate;
use crate::schedule::{Schedule, ScheduleError};

/// Refuses a schedule the executor cannot run: anything [`validate`] rejects (shape, placement,
/// completeness, and the dependency dry run that rules out deadlocks).
fn check_schedule(s: &Schedule) -> Result<(), ScheduleError> {
    validate(s).map(|_| ())
}

/// [`check_schedule`], then refuses `stages` stages for a schedule that has another number.
pub(super) fn check_run(s: &Schedule, stages: usize) -> Result<(), RuntimeError> {
    check_schedule(s)?;
    if stages != s.stages() {
        return Err(RuntimeError::StageCount {
            schedule: s.name.clone(),
            expected: s.stages(),
            ranks: s.ranks,
            chunks: s.chunks,
            got: stages,
        });
    }
    Ok(())
}
