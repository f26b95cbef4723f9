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
//! - an optional per-rank memory limit ([`MemoryLimit`]): a rank's parameter bytes plus, for each of
//!   its stages, the schedule's peak number of microbatches in flight on that stage times the stage's
//!   activation bytes per microbatch, must fit; splits that do not are infeasible, and when no split
//!   fits, [`PartitionError::MemoryInfeasible`] names the smallest limit that would.
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
use thiserror::Error;

use crate::cost::{LayerCost, LinkCost};
use std::collections::HashSet;

use crate::schedule::{Op, Placement, Schedule};

pub mod baselines;
mod search;

/// Nanoseconds per second: the partitioner works on integer nanoseconds so that ties are exact.
pub const NANOS_PER_SECOND: f64 = 1e9;

/// What can go wrong while partitioning.
#[derive(Debug, Error, Clone, PartialEq)]
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
    #[error("the {method} split needs {peak} bytes on its fullest rank, over the limit of {limit} bytes per rank; use --method optimal, which respects the limit")]
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
    /// For each stage, the schedule's peak number of microbatches whose activations it holds at once
    /// (from F until the end of its W or B).
    pub in_flight: Vec<u64>,
}

/// The partitioner's input: per-layer costs in integer units, and per-boundary transfer times.
///
/// Times are `F + I + W` per microbatch in nanoseconds (rounded from the cost file's seconds).
/// `transfer[i]` is the time to move layer `i`'s output to the next rank (`latency + output_bytes /
/// bandwidth`); a boundary after layer `i` that crosses ranks costs `transfer[i]` to the stage before it
/// (sending the activation) and `transfer[i]` to the stage after it (sending the gradient back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    times: Vec<u64>,
    parameters: Vec<u64>,
    activations: Vec<u64>,
    transfer: Vec<u64>,
    prefix_time: Vec<u64>,
    prefix_param: Vec<u64>,
    prefix_act: Vec<u64>,
}

fn prefix(v: &[u64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(v.len() + 1);
    let mut acc = 0u64;
    out.push(0);
    for &x in v {
        acc = acc.saturating_add(x);
        out.push(acc);
    }
    out
}

fn nanos(
    index: usize,
    name: &str,
    field: &'static str,
    seconds: f64,
) -> Result<u64, PartitionError> {
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(PartitionError::BadCost {
            index,
            name: name.to_string(),
            field,
            value: seconds,
        });
    }
    Ok((seconds * NANOS_PER_SECOND).round() as u64)
}

fn bytes(index: usize, name: &str, field: &'static str, value: f64) -> Result<u64, PartitionError> {
    if !value.is_finite() || value < 0.0 {
        return Err(PartitionError::BadCost {
            index,
            name: name.to_string(),
            field,
            value,
        });
    }
    Ok(value.round() as u64)
}

impl Problem {
    /// Layers with the given times (any integer unit), no memory and free transfers.
    pub fn from_times(times: &[u64]) -> Self {
        let zeros = vec![0; times.len()];
        Self::new(times.to_vec(), zeros.clone(), zeros.clone(), zeros)
    }

    /// Builds a problem from parts of equal length `L`: per-layer times, parameter bytes, activation
    /// bytes per microbatch, and transfer times after each layer (the last entry is unused).
    ///
    /// # Panics
    /// If the lengths differ (a programming error, not an input error).
    pub fn new(
        times: Vec<u64>,
        parameters: Vec<u64>,
        activations: Vec<u64>,
        transfer: Vec<u64>,
    ) -> Self {
        let n = times.len();
        assert!(
            parameters.len() == n && activations.len() == n && transfer.len() == n,
            "Problem::new: all per-layer vectors must have the same length"
        );
        Problem {
            prefix_time: prefix(&times),
            prefix_param: prefix(&parameters),
            prefix_act: prefix(&activations),
            times,
            parameters,
            activations,
            transfer,
        }
    }

    /// Converts cost-file layers (seconds, bytes) and the link into a problem, checking every value.
    pub fn from_layers(layers: &[LayerCost], link: &LinkCost) -> Result<Self, PartitionError> {
        if !(link.latency.is_finite() && link.latency >= 0.0) {
            return Err(PartitionError::BadLink(format!(
                "latency is {}; it must be a finite number of seconds >= 0",
                link.latency
            )));
        }
        if link.bandwidth.is_nan() || link.bandwidth <= 0.0 {
            return Err(PartitionError::BadLink(format!(
                "bandwidth is {}; it must be a number of bytes per second > 0",
                link.bandwidth
            )));
        }
        let mut times = Vec::with_capacity(layers.len());
        let mut parameters = Vec::with_capacity(layers.len());
        let mut activations = Vec::with_capacity(layers.len());
        let mut transfer = Vec::with_capacity(layers.len());
        for (i, l) in layers.iter().enumerate() {
            let f = nanos(i, &l.name, "forward", l.forward)?;
            let b = nanos(i, &l.name, "backward_input", l.backward_input)?;
            let w = nanos(i, &l.name, "backward_weight", l.backward_weight)?;
            times.push(f.saturating_add(b).saturating_add(w));
            parameters.push(bytes(i, &l.name, "parameter_bytes", l.parameter_bytes)?);
            activations.push(bytes(i, &l.name, "activation_bytes", l.activation_bytes)?);
            let out = bytes(i, &l.name, "output_bytes", l.output_bytes)?;
            transfer.push(nanos(i, &l.name, "transfer", link.time(out as f64))?);
        }
        Ok(Self::new(times, parameters, activations, transfer))
    }

    /// `L`: the number of layers.
    pub fn layers(&self) -> usize {
        self.times.len()
    }

    /// Per-layer times (`F + I + W`).
    pub fn times(&self) -> &[u64] {
        &self.times
    }

    /// Per-layer parameter bytes.
    pub fn parameters(&self) -> &[u64] {
        &self.parameters
    }

    /// Compute time of layers `a..b`.
    pub fn compute(&self, a: usize, b: usize) -> u64 {
        self.prefix_time[b] - self.prefix_time[a]
    }

    /// Cost of stage `stage` holding layers `a..b` under `layout`: compute plus the transfers across
    /// its two boundaries when the neighbouring stage sits on another rank.
    pub fn stage_cost(&self, layout: &Layout, stage: usize, a: usize, b: usize) -> u64 {
        let mut c = self.compute(a, b);
        if stage > 0 && a > 0 && layout.crosses(stage - 1) {
            c = c.saturating_add(self.transfer[a - 1]);
        }
        if stage + 1 < layout.stages() && b < self.layers() && layout.crosses(stage) {
            c = c.saturating_add(self.transfer[b - 1]);
        }
        c
    }

    /// Memory of stage `stage` holding layers `a..b`: parameters + `in_flight` x activations.
    pub fn stage_memory(&self, a: usize, b: usize, in_flight: u64) -> u64 {
        let act = self.prefix_act[b] - self.prefix_act[a];
        (self.prefix_param[b] - self.prefix_param[a]).saturating_add(act.saturating_mul(in_flight))
    }

    /// Stage costs, rank loads, bottleneck and per-rank memory of a given split (`boundaries`: `S + 1`
    /// increasing layer indices from `0` to `L`).
    pub fn evaluate(
        &self,
        layout: &Layout,
        boundaries: &[usize],
    ) -> Result<Partition, PartitionError> {
        layout.check()?;
        let s = layout.stages();
        let ok = boundaries.len() == s + 1
            && boundaries.first() == Some(&0)
            && boundaries.last() == Some(&self.layers())
            && boundaries.windows(2).all(|w| w[0] < w[1]);
        if !ok {
            return Err(PartitionError::BadBoundaries(boundaries.to_vec()));
        }
        let stage_costs: Vec<u64> = (0..s)
            .map(|i| self.stage_cost(layout, i, boundaries[i], boundaries[i + 1]))
            .collect();
        let mut rank_loads = vec![0u64; layout.ranks];
        for (i, c) in stage_costs.iter().enumerate() {
            let r = layout.rank_of(i);
            rank_loads[r] = rank_loads[r].saturating_add(*c);
        }
        let bottleneck = rank_loads.iter().copied().max().unwrap_or(0);
        Ok(Partition {
            boundaries: boundaries.to_vec(),
            stage_costs,
            rank_loads,
            bottleneck,
            exact: false,
        })
    }

    /// Per-rank memory of a split under a memory limit's in-flight counts.
    pub fn rank_memory(
        &self,
        layout: &Layout,
        boundaries: &[usize],
        in_flight: &[u64],
    ) -> Result<Vec<u64>, PartitionError> {
        if in_flight.len() != layout.stages() {
            return Err(PartitionError::InFlightLength {
                got: in_flight.len(),
                stages: layout.stages(),
            });
        }
        self.evaluate(layout, boundaries)?;
        let mut mem = vec![0u64; layout.ranks];
        for (s, k) in in_flight.iter().enumerate() {
            let r = layout.rank_of(s);
            mem[r] = mem[r].saturating_add(self.stage_memory(boundaries[s], boundaries[s + 1], *k));
        }
        Ok(mem)
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
            let mem = problem.rank_memory(layout, &boundaries, &limit.in_flight)?;
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
    check_sizes(problem, layout)?;
    if let Some(l) = limit {
        if l.in_flight.len() != layout.stages() {
            return Err(PartitionError::InFlightLength {
                got: l.in_flight.len(),
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
        search::branch_and_bound(problem, layout, limit, search::DEFAULT_NODE_BUDGET)
    }
}

/// Exact minimum over splits of the largest stage cost, for layouts where every rank holds one
/// stage; returns the lexicographically smallest optimal boundaries.
///
/// `best[s][a]`: the smallest bottleneck of layers `a..L` in stages `s..S`. Reconstruction walks
/// forward taking the first end that keeps the optimum, which gives the lexicographically smallest
/// boundary list among optimal ones.
fn chain_optimum(
    problem: &Problem,
    layout: &Layout,
    limit: Option<&MemoryLimit>,
) -> Result<Vec<usize>, PartitionError> {
    let n = problem.layers();
    let s_count = layout.stages();
    // Cost of stage s on layers a..b, or None when it breaks the memory limit.
    let cost = |s: usize, a: usize, b: usize| -> Option<u64> {
        if let Some(l) = limit {
            if problem.stage_memory(a, b, l.in_flight[s]) > l.bytes_per_rank {
                return None;
            }
        }
        Some(problem.stage_cost(layout, s, a, b))
    };
    let best = chain_table(n, s_count, cost);
    let opt = best[0][0];
    if opt == UNREACHABLE {
        let limit_bytes = limit.map(|l| l.bytes_per_rank).unwrap_or(0);
        return Err(PartitionError::MemoryInfeasible {
            stages: s_count,
            limit: limit_bytes,
            needed: limit.map(|l| min_peak_memory(problem, l)).unwrap_or(0),
        });
    }
    let mut boundaries = vec![0usize];
    let mut a = 0;
    for s in 0..s_count {
        let remaining = s_count - s;
        let b = ((a + 1)..=(n - (remaining - 1)))
            .find(|&b| cost(s, a, b).is_some_and(|c| c.max(best[s + 1][b]) <= opt))
            .unwrap_or(n);
        boundaries.push(b);
        a = b;
    }
    Ok(boundaries)
}

/// Per-stage peak microbatches in flight under a schedule: a (stage, microbatch) holds its
/// activations from its `F` until its `B`, or its `W` with a split backward, counted in each rank's
/// list order.
pub fn stage_in_flight(schedule: &Schedule) -> Vec<u64> {
    let mut now = vec![0i64; schedule.stages()];
    let mut peak = vec![0u64; schedule.stages()];
    let splits: HashSet<(usize, usize)> = schedule
        .actions
        .iter()
        .flatten()
        .flat_map(|it| it.actions())
        .filter(|a| a.op == Op::W)
        .map(|a| (a.stage, a.microbatch))
        .collect();
    for rank in &schedule.actions {
        for item in rank {
            for a in item.actions() {
                if a.stage >= now.len() {
                    continue;
                }
                let frees = match a.op {
                    Op::F => {
                        now[a.stage] += 1;
                        peak[a.stage] = peak[a.stage].max(now[a.stage].max(0) as u64);
                        false
                    }
                    Op::B | Op::W => true,
                    Op::I => !splits.contains(&(a.stage, a.microbatch)),
                };
                if frees {
                    now[a.stage] -= 1;
                }
            }
        }
    }
    peak
}

/// Marks a state of [`chain_table`] that no split reaches.
const UNREACHABLE: u64 = u64::MAX;

/// `table[s][a]`: the smallest possible largest `cost(s', a', b')` over splits of layers `a..n` into
/// stages `s..stages` (every stage at least one layer), where `cost` returns `None` for a stage that is
/// not allowed; [`UNREACHABLE`] when no split exists.
fn chain_table(
    n: usize,
    stages: usize,
    cost: impl Fn(usize, usize, usize) -> Option<u64>,
) -> Vec<Vec<u64>> {
    let mut table = vec![vec![UNREACHABLE; n + 1]; stages + 1];
    table[stages][n] = 0;
    for s in (0..stages).rev() {
        let remaining = stages - s; // stages s..stages, each needs a layer
        if n < remaining {
            continue;
        }
        let (head, tail) = table.split_at_mut(s + 1);
        let next = &tail[0];
        for (a, slot) in head[s]
            .iter_mut()
            .enumerate()
            .take(n - remaining + 1)
            .skip(s)
        {
            *slot = next
                .iter()
                .enumerate()
                .take(n - remaining + 2)
                .skip(a + 1)
                .filter(|(_, rest)| **rest != UNREACHABLE)
                .filter_map(|(b, &rest)| cost(s, a, b).map(|c| c.max(rest)))
                .min()
                .unwrap_or(UNREACHABLE);
        }
    }
    table
}

/// The smallest largest per-stage memory over all splits with one stage per rank (exact; used to tell
/// the user which limit would work).
fn min_peak_memory(problem: &Problem, limit: &MemoryLimit) -> u64 {
    let table = chain_table(problem.layers(), limit.in_flight.len(), |s, a, b| {
        Some(problem.stage_memory(a, b, limit.in_flight[s]))
    });
    table[0][0]
}
