//! Errors of the simulator: schedules that do not fit the cost model, malformed items, deadlocks.

use thiserror::Error;

use crate::cost::CostError;
use crate::schedule::ScheduleError;

/// Why a schedule could not be simulated.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum SimError {
    /// The cost model is unusable (a field is NaN, negative, ...).
    #[error("cost model: {0}")]
    Cost(#[from] CostError),
    /// The cost model has a different number of stages than the schedule.
    #[error(
        "the cost model has {costs} stages but schedule `{schedule}` has {stages} ({ranks} ranks x {chunks} chunks). \
         Fix: build the cost model for {stages} stages"
    )]
    Stages {
        /// Schedule name.
        schedule: String,
        /// Stages in the cost model.
        costs: usize,
        /// Stages of the schedule.
        stages: usize,
        /// `P`.
        ranks: usize,
        /// `V`.
        chunks: usize,
    },
    /// The schedule's shape is inconsistent (e.g. a list per rank is missing).
    #[error("schedule `{schedule}`: {reason}")]
    Shape {
        /// Schedule name.
        schedule: String,
        /// What is wrong.
        reason: String,
    },
    /// The schedule does not validate: the validator's error (a bad item, a missing action, a
    /// deadlock naming every waiting rank and what it waits for).
    #[error("schedule: {0}")]
    Schedule(#[from] ScheduleError),
}
