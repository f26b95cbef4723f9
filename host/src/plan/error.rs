//! Why planning failed: typed, with the values a caller would match on.

use thiserror::Error;

use super::Skipped;
use crate::auto::AutoError;
use crate::cost::CostError;
use crate::partition::PartitionError;
use crate::schedule::ScheduleError;
use crate::sim::SimError;

/// Why planning failed altogether. Messages name the quantity and the fix in the library's words
/// (ranks, global batch, ...); a command line adds its own flag names.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum PlanError {
    /// Zero ranks asked for.
    #[error("ranks must be at least 1")]
    NoRanks,
    /// A global batch of zero samples.
    #[error("the global batch must be at least 1 sample")]
    NoSamples,
    /// The microbatch size the costs were measured at is not a positive number.
    #[error(
        "the costs' microbatch size is {value}; give the microbatch size (samples > 0) the costs were measured at"
    )]
    CostBatch {
        /// The value given.
        value: f64,
    },
    /// The memory limit is not a positive number of bytes.
    #[error("the memory limit is {value}; give bytes per rank > 0")]
    MemoryLimit {
        /// The value given.
        value: f64,
    },
    /// A microbatch count that does not divide the global batch (or is 0).
    #[error(
        "{microbatches} microbatches do not split a global batch of {global_batch} samples; use a divisor of it"
    )]
    Microbatches {
        /// The count given.
        microbatches: usize,
        /// `N`.
        global_batch: usize,
    },
    /// The replica count is 0 or does not divide the global batch.
    #[error(
        "{replicas} data-parallel replicas do not split a global batch of {global_batch} samples; \
         use a divisor of it (at least 1)"
    )]
    Replicas {
        /// `D`.
        replicas: usize,
        /// `N`.
        global_batch: usize,
    },
    /// A `V` candidate of 0.
    #[error("chunks (V) candidates must be at least 1")]
    NoChunks,
    /// Fewer layers than the stages that must each hold one.
    #[error(
        "{layers} layers cannot fill {stages} stages: every stage needs a layer; use at most {layers} stages (ranks x chunks)"
    )]
    TooFewLayers {
        /// Layers in the cost file.
        layers: usize,
        /// Stages asked for.
        stages: usize,
    },
    /// A name that is neither one of [`crate::schedule::families::FAMILIES`] nor `auto`.
    #[error("unknown schedule family `{name}`; choose from {}", known.join(", "))]
    UnknownFamily {
        /// The name given.
        name: String,
        /// The known families.
        known: Vec<&'static str>,
    },
    /// A given schedule does not validate (it could not run).
    #[error("schedule `{name}` cannot run: {source}")]
    Schedule {
        /// The schedule's name (a label).
        name: String,
        /// Why.
        source: ScheduleError,
    },
    /// The simulator refused a schedule with these costs.
    #[error(transparent)]
    Simulation(#[from] SimError),
    /// The costs are unusable.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// The automatic scheduler found no schedule (a limit below what one microbatch needs, ...).
    #[error(transparent)]
    Auto(#[from] AutoError),
    /// The layers are unusable for partitioning.
    #[error(transparent)]
    Partition(#[from] PartitionError),
    /// No candidate fits: every candidate and why it was ruled out.
    #[error("no plan fits: {}", super::summarize(skipped))]
    NoPlan {
        /// Every candidate ruled out, and why.
        skipped: Vec<Skipped>,
    },
}
