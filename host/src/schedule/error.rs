//! Errors of the schedule layer: refusals by generators, parse errors, validation failures.

use thiserror::Error;

/// Everything that can go wrong building, reading or checking a schedule.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ScheduleError {
    /// A generator refused its parameters; `reason` names the constraint and values that would work.
    #[error("{family}: {reason}")]
    Refused {
        /// The family that refused.
        family: String,
        /// Which constraint failed and what would work.
        reason: String,
    },
    /// No family of that name.
    #[error("unknown schedule family `{0}`; run `pipefill schedule --list` to see the families")]
    UnknownFamily(String),
    /// An action's text form is malformed.
    #[error("cannot read action `{text}`: {reason}")]
    ParseAction {
        /// The text that failed.
        text: String,
        /// Why.
        reason: String,
    },
    /// Unknown placement name.
    #[error("unknown placement `{0}`: use `looped` or `vshape`")]
    ParsePlacement(String),
    /// A schedule file is malformed (field named in the message).
    #[error("{0}")]
    Format(String),
    /// The schedule cannot run (the message names rank, position and action).
    #[error("{0}")]
    Invalid(String),
}

impl ScheduleError {
    /// Shorthand for [`ScheduleError::Refused`].
    pub fn refused(family: &str, reason: impl Into<String>) -> Self {
        ScheduleError::Refused {
            family: family.to_string(),
            reason: reason.into(),
        }
    }
}
