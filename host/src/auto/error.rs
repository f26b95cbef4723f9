//! Why the automatic scheduler refused a request.

use thiserror::Error;

use crate::cost::CostError;
use crate::schedule::ScheduleError;
use crate::sim::SimError;

/// An error of [`solve`](super::solve). The variants a caller may act on carry the numbers; none
/// names a command-line flag (the CLI adds those).
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum AutoError {
    /// `P`, `V`, `M` or the placement cannot make a schedule (e.g. `P = 0`, `vshape` with `V != 2`).
    #[error("{0}")]
    Shape(String),
    /// The cost model is unusable or has the wrong number of stages.
    #[error("costs: {0}")]
    Cost(#[from] CostError),
    /// The cost model has `costs` stages where the request has `stages`.
    #[error("the costs give {costs} stages but P x V = {stages}; give one cost per stage")]
    Stages {
        /// Stages in the cost model.
        costs: usize,
        /// `P * V`.
        stages: usize,
    },
    /// The memory limit is not a positive finite number.
    #[error("the memory limit {value} is not a positive finite number")]
    BadLimit {
        /// The value given.
        value: f64,
    },
    /// A limit in bytes was given but the costs say nothing about activation sizes.
    #[error(
        "a memory limit in bytes needs activation sizes in the costs (activation_bytes, the key A), \
         but every stage has 0; give them, or give the limit in microbatches in flight"
    )]
    NoActivationSizes,
    /// No schedule can run under the limit: rank `rank` needs `needed` to hold one microbatch (all
    /// its chunks at once, plus its parameters for a limit in bytes) and may hold `limit`.
    #[error(
        "the memory limit is below what any schedule needs: rank {rank} must hold {needed} \
         ({unit}) to run one microbatch, the limit allows {limit}"
    )]
    LimitTooLow {
        /// The rank that cannot hold one microbatch.
        rank: usize,
        /// What it needs.
        needed: f64,
        /// What the limit allows it.
        limit: f64,
        /// `bytes` or `microbatches in flight`.
        unit: &'static str,
    },
    /// The time budget is negative or not finite.
    #[error("the time budget {value} s is not a finite number >= 0")]
    BadBudget {
        /// The value given.
        value: f64,
    },
    /// No family fits and one list construction of this size would take longer than the budget
    /// allows (`seconds`, estimated): nothing could be built within it.
    #[error(
        "no handcrafted family fits, and one list construction of this size takes an estimated \
         {seconds:.1} s, more than the time budget of {budget} s allows"
    )]
    OverBudget {
        /// The estimated seconds of one construction.
        seconds: f64,
        /// The budget, seconds.
        budget: f64,
    },
    /// A schedule the solver built did not simulate: a bug, reported with the simulator's error.
    #[error("internal error, please report: {0}")]
    Internal(String),
}

impl From<SimError> for AutoError {
    fn from(e: SimError) -> Self {
        AutoError::Internal(e.to_string())
    }
}

impl From<ScheduleError> for AutoError {
    fn from(e: ScheduleError) -> Self {
        AutoError::Shape(e.to_string())
    }
}
