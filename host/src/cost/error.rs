//! Errors of the cost layer: unreadable or malformed cost files, bad `--cost` flags, bad partitions.

use thiserror::Error;

/// Everything that can go wrong reading or building costs. Every variant names what was wrong
/// (a field path such as `layers[3].forward`, or the flag text) and how to fix it.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum CostError {
    /// The cost file could not be read.
    #[error("cannot read cost file `{path}`: {reason}")]
    Read {
        /// The path given.
        path: String,
        /// The operating system's reason.
        reason: String,
    },
    /// The cost file is not JSON.
    #[error(
        "cost file is not valid JSON (line {line}, column {column}): {reason}. Fix: write a JSON object such as \
         {{\"layers\": [{{\"name\": \"l0\", \"forward\": 0.001, \"backward_input\": 0.001, \"backward_weight\": 0.001, \
         \"activation_bytes\": 0, \"parameter_bytes\": 0}}], \"transfer\": {{\"latency\": 0, \"bandwidth\": 1e10}}}}"
    )]
    Syntax {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// What the JSON reader found.
        reason: String,
    },
    /// One field of a cost file (or of a programmatically built cost model) is missing or wrong.
    #[error("`{field}`: {problem}. Fix: {fix}")]
    Field {
        /// The path of the field, e.g. `layers[3].forward` or `transfer.bandwidth`.
        field: String,
        /// What is wrong with it.
        problem: String,
        /// What would be accepted.
        fix: String,
    },
    /// A compact cost text (`F=1,I=1,W=1`, what the `--cost` flag takes) is malformed. The message
    /// names the text, not the flag: a command line adds its flag.
    #[error("cost text `{text}`: {problem}. Fix: {fix}")]
    Flag {
        /// The flag's text (or the offending part of it).
        text: String,
        /// What is wrong with it.
        problem: String,
        /// What would be accepted.
        fix: String,
    },
    /// The costs do not fit the schedule or partition they are used with.
    #[error("{problem}. Fix: {fix}")]
    Mismatch {
        /// What does not fit.
        problem: String,
        /// What would.
        fix: String,
    },
}

impl CostError {
    /// Shorthand for [`CostError::Field`]; a long `field` path (a key from the file) is excerpted.
    pub fn field(
        field: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        CostError::Field {
            field: crate::input::excerpt(&field.into()),
            problem: crate::input::shorten(&problem.into()),
            fix: fix.into(),
        }
    }

    /// Shorthand for [`CostError::Flag`]; a long `text` is excerpted ([`crate::input::excerpt`]).
    pub fn flag(
        text: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        CostError::Flag {
            text: crate::input::excerpt(&text.into()),
            problem: crate::input::shorten(&problem.into()),
            fix: fix.into(),
        }
    }

    /// Shorthand for [`CostError::Mismatch`].
    pub fn mismatch(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        CostError::Mismatch {
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}
