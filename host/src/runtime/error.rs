//! [`RuntimeError`]: why a training step did not complete.

use thiserror::Error;

use crate::schedule::{Action, ScheduleError};

/// Why the runtime refused a schedule or a step failed. A failure inside a trainer's layers names
/// the rank and the action (or the optimizer step) where it happened; the other ranks are stopped,
/// none is left waiting.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RuntimeError {
    /// The schedule does not validate (or does not fit the stages given).
    #[error("the schedule cannot run: {0}")]
    Schedule(#[from] ScheduleError),
    /// The stages, inputs or targets do not fit the schedule (the message names which and why).
    #[error("{0}")]
    Setup(String),
    /// A layer returned an error.
    #[error("rank {rank} failed at {action}: {message}")]
    ActionFailed {
        /// The rank that failed.
        rank: usize,
        /// The action it was running.
        action: Action,
        /// The layer's message.
        message: String,
    },
    /// A layer panicked.
    #[error("rank {rank} panicked at {action}: {message}")]
    ActionPanicked {
        /// The rank that panicked.
        rank: usize,
        /// The action it was running.
        action: Action,
        /// The panic's message.
        message: String,
    },
    /// A stage's optimizer step failed or panicked.
    #[error("rank {rank} failed in the optimizer step of stage {stage}: {message}")]
    OptimizerFailed {
        /// The rank that failed.
        rank: usize,
        /// The stage whose optimizer failed.
        stage: usize,
        /// The message.
        message: String,
    },
}
