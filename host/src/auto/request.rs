//! What the automatic scheduler is asked: shape, costs, memory limit, objective, budget, seed.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cost::CostModel;
use crate::schedule::Placement;

/// The default time budget of the improvement phase, in seconds (small enough for `train` to call
/// the solver before it starts).
pub const DEFAULT_TIME_BUDGET: f64 = 0.3;

/// What the solver minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The step's simulated makespan (first start to last end over all ranks).
    #[default]
    Makespan,
    /// The longest per-rank span, first action to last action of one rank (the zero-bubble papers'
    /// objective: it assumes the optimizer step overlaps the next step's warm-up).
    Span,
}

crate::named_enum!(Objective {
    Makespan => "makespan",
    Span => "span",
});

/// An objective name that is neither `makespan` nor `span`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown objective `{0}`: use `makespan` or `span`")]
pub struct UnknownObjective(pub String);

impl FromStr for Objective {
    type Err = UnknownObjective;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Objective::from_name(s).ok_or_else(|| UnknownObjective(s.to_string()))
    }
}

/// How much activation memory each rank may hold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryLimit {
    /// Bytes per rank, parameters included (as `plan --memory-limit`): the activations may use what
    /// the rank's parameters leave. Needs activation sizes in the costs.
    Bytes(f64),
    /// Microbatches in flight per rank, in the unit `simulate` reports: one rank's activations for
    /// one microbatch (each of `V` chunks counts `1/V`; a V-shape chunk is 1/2). May be fractional.
    InFlight(f64),
}

impl MemoryLimit {
    /// The number given.
    pub fn value(self) -> f64 {
        match self {
            MemoryLimit::Bytes(v) | MemoryLimit::InFlight(v) => v,
        }
    }
}

/// A request to the automatic scheduler.
///
/// ```
/// use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// use pipefill_host::auto::{AutoRequest, MemoryLimit};
/// let costs = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
/// let r = AutoRequest::new(4, 8, costs).with_limit(MemoryLimit::InFlight(4.0));
/// assert_eq!((r.ranks, r.chunks, r.microbatches), (4, 1, 8));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AutoRequest {
    /// `P`.
    pub ranks: usize,
    /// `V`: stages per rank.
    pub chunks: usize,
    /// Where the stages sit (`vshape` needs `V = 2`).
    pub placement: Placement,
    /// `M`.
    pub microbatches: usize,
    /// One cost per stage (`P * V`), uneven allowed; the link's latency and bandwidth price every
    /// transfer between ranks.
    pub costs: CostModel,
    /// The memory limit per rank; `None`: no limit.
    pub limit: Option<MemoryLimit>,
    /// What to minimise.
    pub objective: Objective,
    /// Seconds of improvement after the constructive phase (counted as a fixed amount of work per
    /// second, so the result depends only on the request and the seed, never on the machine's load),
    /// given to each improvement phase of each of [`solve`](super::solve)'s runs: a request takes a
    /// few times this in wall time (at the default, 0.6-1.2 s on two cores).
    pub time_budget: f64,
    /// Seed of the randomised improvement moves.
    pub seed: u64,
}

impl AutoRequest {
    /// `P` ranks, `M` microbatches, `V = 1` looped, no limit, makespan, the default budget, seed 0.
    pub fn new(ranks: usize, microbatches: usize, costs: CostModel) -> Self {
        AutoRequest {
            ranks,
            chunks: 1,
            placement: Placement::Looped,
            microbatches,
            costs,
            limit: None,
            objective: Objective::Makespan,
            time_budget: DEFAULT_TIME_BUDGET,
            seed: 0,
        }
    }

    /// Sets `V` and the placement.
    pub fn with_chunks(mut self, chunks: usize, placement: Placement) -> Self {
        self.chunks = chunks;
        self.placement = placement;
        self
    }

    /// Sets the memory limit.
    pub fn with_limit(mut self, limit: MemoryLimit) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Sets the objective.
    pub fn with_objective(mut self, objective: Objective) -> Self {
        self.objective = objective;
        self
    }

    /// Sets the time budget (seconds) and the seed.
    pub fn with_budget(mut self, seconds: f64, seed: u64) -> Self {
        self.time_budget = seconds;
        self.seed = seed;
        self
    }
}

/// How to solve `auto` wherever a planner meets it ([`crate::plan`], at every shape it tries):
/// everything of an [`AutoRequest`] but the shape's `P` and `M` and the costs, which the planner
/// supplies.
///
/// ```
/// use pipefill_host::auto::{AutoOptions, Objective};
/// use pipefill_host::schedule::Placement;
/// let o = AutoOptions::default();
/// assert_eq!((o.placement, o.objective, o.chunks()), (Placement::Looped, Objective::Makespan, 1));
/// let v = AutoOptions { placement: Placement::Vshape, ..AutoOptions::default() };
/// assert_eq!(v.chunks(), 2);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AutoOptions {
    /// Where the stages sit.
    pub placement: Placement,
    /// `V`; `None`: the placement's own (1 looped, 2 V-shape).
    pub chunks: Option<usize>,
    /// A limit in microbatches in flight per rank, used when the planner has no limit in bytes.
    pub max_in_flight: Option<f64>,
    /// What to minimise.
    pub objective: Objective,
    /// Seconds of improvement (counted as work).
    pub time_budget: f64,
    /// Seed of the improvement moves.
    pub seed: u64,
}

impl Default for AutoOptions {
    fn default() -> Self {
        AutoOptions {
            placement: Placement::Looped,
            chunks: None,
            max_in_flight: None,
            objective: Objective::Makespan,
            time_budget: DEFAULT_TIME_BUDGET,
            seed: 0,
        }
    }
}

impl AutoOptions {
    /// `V`: the one given, else the placement's own (1 looped, 2 V-shape).
    pub fn chunks(&self) -> usize {
        self.chunks.unwrap_or(match self.placement {
            Placement::Vshape => 2,
            Placement::Looped => 1,
        })
    }

    /// The limit: `bytes` per rank when given, else [`AutoOptions::max_in_flight`].
    pub fn limit(&self, bytes: Option<f64>) -> Option<MemoryLimit> {
        bytes
            .map(MemoryLimit::Bytes)
            .or(self.max_in_flight.map(MemoryLimit::InFlight))
    }

    /// The request for `P = ranks`, `M = microbatches`, `V = chunks` and one cost per stage, under
    /// `limit`.
    pub fn request(
        &self,
        ranks: usize,
        microbatches: usize,
        chunks: usize,
        costs: CostModel,
        limit: Option<MemoryLimit>,
    ) -> AutoRequest {
        let mut req = AutoRequest::new(ranks, microbatches, costs)
            .with_chunks(chunks, self.placement)
            .with_objective(self.objective)
            .with_budget(self.time_budget, self.seed);
        req.limit = limit;
        req
    }
}
