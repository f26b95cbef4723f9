//! What can go wrong while partitioning.

use thiserror::Error;

/// What can go wrong while partitioning.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum PartitionError {
    /// Fewer layers than stages: every stage needs at least one layer.
    #[error("cannot split {layers} layers into {stages} stages: every stage needs at least one layer; use at most {layers} stages (ranks x chunks)")]
    TooFewLayers {
        /// `L`.
        layers: usize,
        /// `S`.
        stages: usize,
    },
    /// Zero stages or ranks, or stages not a multiple of ranks.
    #[error("bad layout: {0}")]
    Layout(String),
    /// A layer's cost is negative, NaN or infinite.
    #[error("layer {index} (`{name}`): {field} is {value}; it must be a finite number >= 0")]
    BadCost {
        /// Layer index.
        index: usize,
        /// Layer name.
        name: String,
        /// Field name as in the cost file.
        field: &'static str,
        /// The offending value.
        value: f64,
    },
    /// The layers' times or sizes, summed, do not fit the partitioner's integer arithmetic
    /// ([`super::MAX_TOTAL`] nanoseconds or bytes).
    #[error(
        "the layers' {what} add up to {total:.3e} {unit}, more than the partitioner counts \
         ({max:.2e} {unit}); check the cost file's values (times are seconds per microbatch)"
    )]
    TooLarge {
        /// `times` or `sizes`.
        what: &'static str,
        /// The sum, in seconds or bytes.
        total: f64,
        /// The largest sum, in the same unit.
        max: f64,
        /// `s` or `bytes`.
        unit: &'static str,
    },
    /// The link has a negative or NaN latency or a non-positive bandwidth.
    #[error("transfer: {0}")]
    BadLink(String),
    /// A memory limit whose per-stage in-flight list does not match the number of stages.
    #[error("memory limit: {got} in-flight counts for {stages} stages; give one count per stage")]
    InFlightLength {
        /// Counts given.
        got: usize,
        /// Stages.
        stages: usize,
    },
    /// No split fits the memory limit.
    #[error("no split into {stages} stages fits {limit} bytes per rank; the smallest rank memory any split reaches is {needed} bytes: raise the limit, use more ranks, or a schedule with fewer microbatches in flight")]
    MemoryInfeasible {
        /// Stages.
        stages: usize,
        /// The limit given.
        limit: u64,
        /// The smallest per-rank peak over all splits (a lower bound when `V > 1`).
        needed: u64,
    },
    /// A baseline's split does not fit the memory limit (baselines do not look at memory).
    #[error("the {method} split needs {peak} bytes on its fullest rank, over the limit of {limit} bytes per rank; use the optimal method, which respects the limit")]
    OverMemory {
        /// The baseline's name.
        method: &'static str,
        /// The limit given.
        limit: u64,
        /// The split's largest rank memory.
        peak: u64,
    },
    /// The `V > 1` search ran out of its node budget before finding any split that fits the memory
    /// limit.
    #[error("the search gave up after {nodes} tries without finding a split that fits the memory limit; raise the limit or use fewer stages per rank")]
    SearchBudget {
        /// Nodes visited.
        nodes: u64,
    },
    /// A given split is malformed (not increasing, wrong ends, wrong count).
    #[error("bad split {0:?}: boundaries must start at 0, end at the number of layers and strictly increase, one more than the number of stages")]
    BadBoundaries(Vec<usize>),
}
