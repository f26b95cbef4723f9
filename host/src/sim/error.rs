//! Errors of the simulator: schedules that do not fit the cost model, malformed items, deadlocks.

use thiserror::Error;

use crate::cost::CostError;

/// Why a schedule could not be simulated. Every variant names the rank, position and action at fault.
#[derive(Debug, Error, Clone, PartialEq)]
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
    /// One item cannot run where it is (stage or microbatch out of range, wrong rank, twice).
    #[error("schedule `{schedule}`: rank {rank}, position {index}, `{item}`: {reason}")]
    BadItem {
        /// Schedule name.
        schedule: String,
        /// The rank.
        rank: usize,
        /// Position in the rank's list.
        index: usize,
        /// The item's text form.
        item: String,
        /// Why it cannot run.
        reason: String,
    },
    /// No rank can make progress: every unfinished rank waits for something that never arrives.
    #[error("schedule `{schedule}` deadlocks: {}", waiting.join("; "))]
    Deadlock {
        /// Schedule name.
        schedule: String,
        /// One line per waiting rank: `rank R at position N runs X, waiting for Y (...)`.
        waiting: Vec<String>,
    },
}
