//! Partitioning: split a model's `L` layers into `S` contiguous stages by measured cost.
//!
//! # The objective
//!
//! A pipeline runs at the pace of its slowest rank. Each layer costs `F + I + W` per microbatch (its
//! forward, backward-for-inputs and backward-for-weights times); a stage costs the sum over its layers
//! plus the boundary transfers it pays for (see [`Problem`]); a rank's *load* is the sum of the costs
//! of the stages it holds (`V` stages per rank, placed `looped` or `vshape`, see
//! [`Placement`]). [`optimal`] returns the split with the smallest largest rank load, the
//! *bottleneck*. With `V = 1` that is the classic "minimise the slowest stage" problem, solved exactly
//! by dynamic programming on integer nanoseconds in `O(S L^2)`. With `V > 1` a rank's load couples
//! stages far apart in the model, so [`optimal`] uses an exact branch and bound, seeded with the
//! `V = 1` optimum; it is exact unless its node budget runs out, which [`Partition::exact`] reports.
//!
//! # Rules
//!
//! - every stage holds at least one layer (`L >= S`, else [`PartitionError::TooFewLayers`]);
//! - ties are broken deterministically: among all optimal splits, the one whose list of boundaries is
//!   lexicographically smallest (earlier stages as short as possible) is returned;
//! - an optional per-rank memory limit ([`MemoryLimit`]): a rank's parameter bytes plus the most its
//!   stages' microbatches hold at one moment of the schedule ([`Holds`]), each stage in its
//!   recomputation mode ([`Problem::with_recompute`]: a recomputing stage keeps its input, not its
//!   stash, between `F` and the backward), must fit; this is the simulator's count. Splits that do
//!   not fit are infeasible, and when no split fits, [`PartitionError::MemoryInfeasible`] names
//!   the smallest limit that would.
//!
//! # Baselines
//!
//! [`Method`] also names the balancers other systems use, for comparison ([`baselines`]): `uniform`
//! (equal layer counts), `parameters` (DeepSpeed's default: balance parameter bytes with its
//! max-minus-min dynamic programme) and `time-greedy` (torchgpipe's `balance_by_time`: the block
//! partition heuristic of Bárány et al. on normalised times). None of them is optimal:
//!
//! ```
//! use pipefill_host::partition::{baselines, optimal, Layout, Problem};
//! let p = Problem::from_times(&[81, 99, 98, 67, 67, 96, 57]);
//! let layout = Layout::one_stage_per_rank(4);
//! assert_eq!(optimal(&p, &layout, None)?.bottleneck, 180);
//! assert_eq!(p.evaluate(&layout, &baselines::time_greedy(p.times(), 4))?.bottleneck, 287);
//! # Ok::<(), pipefill_host::partition::PartitionError>(())
//! ```

use serde::Serialize;

use crate::schedule::deps::{Footprint, InFlight};
use crate::schedule::{Placement, Schedule};

pub mod baselines;
mod chain;
mod error;
mod holds;
mod problem;
mod search;

use chain::{chain_optimum, min_peak_memory};
pub use error::PartitionError;
pub use holds::Holds;

/// Cells of the exact split's table for `layers` layers into `stages` stages: each of the
/// `stages x layers` entries looks at up to `layers` ends, so about `stages x layers^2 / 2` (the
/// work of [`optimal`] with `V = 1`, which dominates every method). Saturates.
pub fn split_work(layers: usize, stages: usize) -> u64 {
    let l = layers as u64;
    (stages as u64).saturating_mul(l.saturating_mul(l) / 2)
}

/// Cells of [`split_work`] per second on the development machine (measured: 10,000 layers into
/// 4 and 16 stages, `docs/measurements.md`, "Sizes").
pub const SPLIT_CELLS_PER_SECOND: f64 = 5.0e7;
pub use problem::Problem;

/// Nanoseconds per second: the partitioner works on integer nanoseconds so that ties are exact.
pub const NANOS_PER_SECOND: f64 = 1e9;

/// The largest sum of layer times (in nanoseconds) or of layer sizes (in bytes) the partitioner
/// takes, 2^62 (about 4.6e9 s, or 4.6e18 bytes): every sum it forms then fits a `u64` exactly.
pub const MAX_TOTAL: u64 = 1 << 62;

/// How stages map onto ranks: `S = ranks * chunks` stages placed by `placement`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// `P`.
    pub ranks: usize,
    /// `V`: stages per rank.
    pub chunks: usize,
    /// Where each stage sits.
    pub placement: Placement,
}

impl Layout {
    /// `V = 1`, looped: stage `s` on rank `s`.
    pub fn one_stage_per_rank(ranks: usize) -> Self {
        Layout {
            ranks,
            chunks: 1,
            placement: Placement::Looped,
        }
    }

    /// `S = P * V`.
    pub fn stages(&self) -> usize {
        self.ranks * self.chunks
    }

    /// The rank holding `stage`.
    pub fn rank_of(&self, stage: usize) -> usize {
        self.placement.rank_of(stage, self.ranks)
    }

    /// Whether the boundary between `stage` and `stage + 1` crosses ranks (and so costs a transfer).
    pub fn crosses(&self, stage: usize) -> bool {
        self.rank_of(stage) != self.rank_of(stage + 1)
    }

    fn check(&self) -> Result<(), PartitionError> {
        if self.ranks == 0 || self.chunks == 0 {
            return Err(PartitionError::Layout(format!(
                "ranks ({}) and chunks ({}) must both be at least 1",
                self.ranks, self.chunks
            )));
        }
        if self.placement == Placement::Vshape && self.chunks != 2 {
            return Err(PartitionError::Layout(format!(
                "vshape placement needs exactly 2 chunks per rank, got {}",
                self.chunks
            )));
        }
        Ok(())
    }
}

/// A per-rank memory limit and what the schedule keeps in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes each rank may use for parameters and held activations.
    pub bytes_per_rank: u64,
    /// What the schedule's microbatches hold on each rank, moment by moment.
    pub holds: Holds,
}

impl MemoryLimit {
    /// `bytes_per_rank` under `schedule`: the simulator's count ([`Holds::of_schedule`]).
    pub fn of_schedule(bytes_per_rank: u64, schedule: &Schedule) -> Self {
        MemoryLimit {
            bytes_per_rank,
            holds: Holds::of_schedule(schedule),
        }
    }

    /// `bytes_per_rank` with stage `s` holding `in_flight[s]` whole stashes, all of a rank's stages
    /// at once ([`Holds::whole`]).
    pub fn whole(bytes_per_rank: u64, layout: &Layout, in_flight: &[u64]) -> Self {
        MemoryLimit {
            bytes_per_rank,
            holds: Holds::whole(layout, in_flight),
        }
    }
}

/// A split of the layers into stages and what it costs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// `S + 1` layer indices: stage `s` holds layers `boundaries[s]..boundaries[s + 1]`.
    pub boundaries: Vec<usize>,
    /// Per stage: compute plus boundary transfers (integer nanoseconds, or the unit of the times).
    pub stage_costs: Vec<u64>,
    /// Per rank: the sum of its stages' costs.
    pub rank_loads: Vec<u64>,
    /// The largest rank load: the time per microbatch of the slowest rank.
    pub bottleneck: u64,
    /// Whether this split is proven optimal (always for `V = 1`; for `V > 1` unless the search budget
    /// ran out). `false` for the baselines.
    pub exact: bool,
}

impl Partition {
    /// Number of layers in each stage.
    pub fn layers_per_stage(&self) -> Vec<usize> {
        self.boundaries.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// Stage boundaries from layer counts.
    pub fn boundaries_from_counts(counts: &[usize]) -> Vec<usize> {
        let mut b = Vec::with_capacity(counts.len() + 1);
        let mut acc = 0;
        b.push(0);
        for c in counts {
            acc += c;
            b.push(acc);
        }
        b
    }
}

/// The balancers pipefill knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Minimise the largest rank load exactly ([`optimal`]).
    Optimal,
    /// Equal layer counts ([`baselines::uniform`]).
    Uniform,
    /// Balance parameter bytes like DeepSpeed's default ([`baselines::deepspeed_balanced`]).
    Parameters,
    /// torchgpipe's `balance_by_time` ([`baselines::time_greedy`]).
    TimeGreedy,
}

impl Method {
    /// Every method, optimal first.
    pub const ALL: [Method; 4] = [
        Method::Optimal,
        Method::Uniform,
        Method::Parameters,
        Method::TimeGreedy,
    ];

    /// Name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Method::Optimal => "optimal",
            Method::Uniform => "uniform",
            Method::Parameters => "parameters",
            Method::TimeGreedy => "time-greedy",
        }
    }

    /// Looks a method up by name.
    pub fn from_name(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Splits `problem` under `layout` with this method. Baselines ignore the memory limit (they do
    /// not know about it), but the split is still checked against it when one is given.
    pub fn apply(
        self,
        problem: &Problem,
        layout: &Layout,
        limit: Option<&MemoryLimit>,
    ) -> Result<Partition, PartitionError> {
        let s = layout.stages();
        let boundaries = match self {
            Method::Optimal => return optimal(problem, layout, limit),
            Method::Uniform => baselines::uniform(problem.layers(), s),
            Method::Parameters => baselines::deepspeed_balanced(problem.parameters(), s),
            Method::TimeGreedy => baselines::time_greedy(problem.times(), s),
        };
        check_sizes(problem, layout)?;
        let part = problem.evaluate(layout, &boundaries)?;
        if let Some(limit) = limit {
            let mem = problem.rank_memory(layout, &boundaries, &limit.holds)?;
            let peak = mem.iter().copied().max().unwrap_or(0);
            if peak > limit.bytes_per_rank {
                return Err(PartitionError::OverMemory {
                    method: self.name(),
                    limit: limit.bytes_per_rank,
                    peak,
                });
            }
        }
        Ok(part)
    }
}

fn check_sizes(problem: &Problem, layout: &Layout) -> Result<(), PartitionError> {
    layout.check()?;
    let s = layout.stages();
    if problem.layers() < s {
        return Err(PartitionError::TooFewLayers {
            layers: problem.layers(),
            stages: s,
        });
    }
    Ok(())
}

/// Splits `problem` into `stages` stages, one per rank, minimising the slowest stage exactly.
///
/// Shorthand for [`optimal`] with [`Layout::one_stage_per_rank`] and no memory limit.
pub fn partition(problem: &Problem, stages: usize) -> Result<Partition, PartitionError> {
    optimal(problem, &Layout::one_stage_per_rank(stages), None)
}

/// The split minimising the largest rank load under `layout`, subject to `limit` if given.
///
/// `V = 1`: exact dynamic programme. `V > 1`: exact branch and bound with a node budget
/// ([`Partition::exact`] says whether it finished).
pub fn optimal(
    problem: &Problem,
    layout: &Layout,
    limit: Option<&MemoryLimit>,
) -> Result<Partition, PartitionError> {
    optimal_with_budget(problem, layout, limit, search::DEFAULT_NODE_BUDGET)
}

/// [`optimal`] with an explicit node budget for the `V > 1` search (the number of stage ends it may
/// try; `V = 1` ignores it). A smaller budget returns sooner, possibly with `exact: false`.
pub fn optimal_with_budget(
    problem: &Problem,
    layout: &Layout,
    limit: Option<&MemoryLimit>,
    budget: u64,
) -> Result<Partition, PartitionError> {
    check_sizes(problem, layout)?;
    if let Some(l) = limit {
        if l.holds.stages() != layout.stages() {
            return Err(PartitionError::InFlightLength {
                got: l.holds.stages(),
                stages: layout.stages(),
            });
        }
    }
    if layout.chunks == 1 {
        let boundaries = chain_optimum(problem, layout, limit)?;
        let mut p = problem.evaluate(layout, &boundaries)?;
        p.exact = true;
        Ok(p)
    } else {
        search::branch_and_bound(problem, layout, limit, budget)
    }
}

/// The split minimising the largest *stage* cost (not rank load), exactly, ignoring which rank holds
/// which stage and any memory limit. With `V > 1` this is a different split from [`optimal`]'s, and
/// can simulate faster: a rank's total load is not all that matters when each microbatch waits on
/// every stage in turn. [`crate::plan`] tries both.
pub fn per_stage_optimal(problem: &Problem, layout: &Layout) -> Result<Partition, PartitionError> {
    check_sizes(problem, layout)?;
    let boundaries = chain_optimum(problem, layout, None)?;
    problem.evaluate(layout, &boundaries)
}

/// Per-stage peak microbatches in flight under a schedule: a (stage, microbatch) holds its
/// activations from its `F` until its `B`, or its `W` with a split backward, counted in each rank's
/// list order.
pub fn stage_in_flight(schedule: &Schedule) -> Vec<u64> {
    // The one in-flight count, keyed by stage instead of rank.
    let mut count = InFlight::new(schedule.stages());
    for item in schedule.actions.iter().flatten() {
        let actions = || item.actions().filter(|a| a.stage < schedule.stages());
        for a in actions() {
            count.start(a.stage, a, &Footprint::UNIT);
        }
        for a in actions() {
            count.end(a.stage, a, &Footprint::UNIT);
        }
    }
    count.peak().iter().map(|&p| p as u64).collect()
}
