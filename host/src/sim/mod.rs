//! The discrete-event simulator: a schedule and a cost model in, a predicted [`Timeline`] out.
//!
//! ## Model
//!
//! Each rank runs its items in order, one at a time. An item starts when its rank is free **and** its
//! inputs have arrived:
//!
//! - `F(s,k)` needs the output of `F(s-1,k)` (nothing for `s = 0`);
//! - `I(s,k)` / `B(s,k)` need `F(s,k)` and the input gradient from `I(s+1,k)` / `B(s+1,k)` (the last
//!   stage's backward needs only its forward, which computed the loss);
//! - `W(s,k)` needs `I(s,k)`.
//!
//! Data produced on one rank and needed on another arrives `latency + bytes / bandwidth` after the
//! producer ends (the boundary's `output_bytes`, both for activations forward and gradients backward);
//! on the same rank it is available at once. Links have no contention: every transfer runs on its own
//! (a good model for NVLink / InfiniBand point-to-point with a few messages in flight, optimistic when
//! many large transfers share one link). An overlapped pair `(F;B)` starts when both halves can start,
//! takes [`CostModel::pair_time`] and both halves end together.
//!
//! A schedule that carries its transfers (PyTorch's compute+comms form, or
//! [`lower`](crate::schedule::lower)'s output) runs as PyTorch's `_PipelineScheduleRuntime` runs
//! it: a `SEND_*` or `RECV_*` is posted where it sits and never blocks its rank; the data leaves
//! with its send and the `F`/`I`/`B` that consumes it waits for it to arrive; a `WAIT_SEND_*` blocks
//! the sender until the data has arrived and the peer has posted its receive. So a compute+comms
//! file takes what its compute-only order takes unless a send's wait holds its rank. A
//! `REDUCE_GRAD` starts its stage's data-parallel reduction and a `WAIT_REDUCE_GRAD` waits for it
//! ([`data_parallel::simulate_replicated`]; the reductions take no time in [`simulate`]).
//!
//! The simulation is one pass over the items with a stack of ranks that can progress: a rank runs until
//! it meets an item whose input is missing, records which input, and is woken by the item that produces
//! it. Each item is looked at a constant number of times, so the cost is linear in the number of
//! actions (see `host/benches/sim.rs` and docs/measurements.md for the measured rate).
//!
//! ## Lower bound
//!
//! Every simulation reports a makespan no schedule can beat with the same costs, `P`, `V`, `M` and
//! placement ([`lower_bound`], [`bound_for`]); the derivation is in the source of `sim::bound`
//! (`host/src/sim/bound/mod.rs`), in eight sections: (1) the chain of one microbatch; (2) each
//! rank's work after the forward chain that precedes it and before the gradient chain that follows
//! it ([`basic_bound`], the bound before the next section); (3) per rank, Jackson's preemptive
//! schedule, the optimum of the one-machine problem whose jobs are the rank's `F`, `I` and rest of
//! the backward with their heads (the chain before them) and tails (the chain after them);
//! (4) with a per-rank in-flight limit ([`bound_with_limit`]), forward start times held back by
//! the memory they need freed first; (5) the same recurrence, relative to a rank's first action,
//! bounds the longest per-rank span under the limit ([`span_bound`], the span objective of `auto`);
//! (6) every slot a rank holds lasts at least a round trip; (7) staircases: each microbatch's copy
//! of a job gets its own head and tail, the `k`-th waiting for `k + 1` microbatches to pass the
//! busy ranks before it; (8) two ranks' spans at once, for the span objective; (9) with two stages
//! per rank under a limit, a microbatch at its upper stage holds two slots of the rank at once.
//!
//! ## One device for all ranks
//!
//! With [`SimOptions::device`] set to [`DeviceSharing::Shared`] the ranks are streams of one device:
//! items of different ranks that run at the same time slow each other down by the cost model's
//! `overlap_share` (`k` concurrent items each progress at `1 / (1 + share (k - 1))`; module
//! `shared` has the model and its bound).
//!
//! ## Outputs
//!
//! [`simulate`] returns a [`Simulation`]: the [`Timeline`] (start and end of every item and transfer;
//! makespan, busy, idle and bubble fraction are methods there), the peak activation bytes per rank,
//! the critical path, and the [lower bound](lower_bound) that no schedule can beat with these costs.
//! [`simulate_with`] leaves out the transfers and the critical path when they are not needed, and
//! [`summarize`] keeps only the numbers.
//!
//! ## Cost
//!
//! Memory is what is kept: a [`Span`](crate::timeline::Span) is 40 bytes, a
//! [`Transfer`](crate::timeline::Transfer) 56, plus 24 bytes per (stage, microbatch) while running.
//! Time is dominated, on large schedules, by memory traffic: reading the schedule's lists (the
//! validator's checks and the run each read them once) and the kernel's first touch of the
//! timeline's pages. docs/measurements.md has the measured rates.
//!
//! ```
//! use pipefill_host::cost::{CostModel, LinkCost, StageCost};
//! use pipefill_host::schedule::{Placement, Schedule};
//! use pipefill_host::sim::simulate;
//! // Two ranks, one microbatch, written by hand: rank 0 runs 0F0 then 0B0, rank 1 runs 1F0 then 1B0.
//! let s = Schedule {
//!     name: "tiny".into(), ranks: 2, chunks: 1, microbatches: 1, placement: Placement::Looped,
//!     actions: vec![
//!         vec!["0F0".parse().unwrap(), "0B0".parse().unwrap()],
//!         vec!["1F0".parse().unwrap(), "1B0".parse().unwrap()],
//!     ],
//! };
//! let costs = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 2, LinkCost::default());
//! let sim = simulate(&s, &costs).unwrap();
//! assert_eq!(sim.timeline.makespan(), 6.0); // F, F, B(2), B(2)
//! assert_eq!(sim.critical_path.len(), 4);
//! ```

mod bound;
pub mod data_parallel;
mod engine;
mod error;
mod memory;
mod path;
mod shared;

pub(crate) use bound::has_pairs;
pub use bound::{
    basic_bound, bound_for, bound_with_limit, bound_with_limit_until_input, lower_bound,
    lower_bound_with_limit, span_bound, span_bound_until_input, BoundError,
};
pub use error::SimError;
pub use memory::{activation_curve, peak_activations};

use crate::cost::CostModel;
use crate::schedule::validate::check_static_lowered;
use crate::schedule::Schedule;
use crate::timeline::Timeline;
use engine::Engine;

/// Why an item on the critical path could not start earlier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Via {
    /// It started at time 0 (the first item of the path).
    Start,
    /// Its rank was busy with the previous item of the path until it started.
    Rank,
    /// It waited for data from the previous item of the path, which took `transfer` to arrive
    /// (0 on the same rank).
    Data {
        /// Transfer time on the edge (0 when producer and consumer share a rank).
        transfer: f64,
    },
}

/// One step of the critical path: the item at `spans[rank][index]` of the timeline, and why it could
/// not start earlier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathStep {
    /// The rank.
    pub rank: usize,
    /// Position in the rank's list (and in `timeline.spans[rank]`).
    pub index: usize,
    /// What it waited for.
    pub via: Via,
}

/// Everything the simulator predicts for one schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// Start and end of every item and transfer (`source` is [`Source::Predicted`](crate::timeline::Source::Predicted)).
    pub timeline: Timeline,
    /// Peak activation bytes held on each rank (parameters not included).
    pub peak_activations: Vec<f64>,
    /// The chain of items that determines the makespan, in time order: shortening any of them (or the
    /// transfers between them) is the only way to finish earlier.
    pub critical_path: Vec<PathStep>,
    /// A makespan no schedule can beat with these costs, ranks, chunks and placement ([`lower_bound`]).
    pub lower_bound: f64,
}

impl Simulation {
    /// `makespan / lower_bound` (1 is optimal); 1 when both are 0.
    pub fn ratio_to_bound(&self) -> f64 {
        let m = self.timeline.makespan();
        if self.lower_bound > 0.0 {
            m / self.lower_bound
        } else {
            1.0
        }
    }

    /// Total transfer time on the critical path.
    pub fn critical_transfer_time(&self) -> f64 {
        self.critical_path
            .iter()
            .map(|p| match p.via {
                Via::Data { transfer } => transfer,
                _ => 0.0,
            })
            .sum()
    }
}

/// Simulates `schedule` under `costs`: see the [module docs](self) for the model. Records
/// everything ([`SimOptions::ALL`]); see [`simulate_with`] to leave out what is not needed.
///
/// Errors: the cost model is invalid or has the wrong number of stages ([`SimError::Cost`],
/// [`SimError::Stages`]); the schedule does not validate ([`SimError::Schedule`] with the
/// [validator's](crate::schedule::validate) error: the same checks, so `simulate` accepts exactly
/// the schedules `validate` accepts; a deadlock names every waiting rank, its item and what it waits
/// for).
pub fn simulate(schedule: &Schedule, costs: &CostModel) -> Result<Simulation, SimError> {
    simulate_with(schedule, costs, SimOptions::ALL)
}

/// Where the ranks run, for [`SimOptions::device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSharing {
    /// Each rank on its own device: ranks never slow each other down (the model above).
    #[default]
    PerRank,
    /// All ranks on one device: items of different ranks that run at the same time share it, with
    /// the cost model's `overlap_share` (module `shared`: two concurrent items of lengths `a` and
    /// `b` take about `max(a, b) + share * min(a, b)`). Compute-only schedules; no critical path.
    Shared,
}

/// What [`simulate_with`] records besides the numbers, and where the ranks run. Spans are always
/// recorded (a simulation without them is [`summarize`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOptions {
    /// Record a [`Transfer`](crate::timeline::Transfer) for every input that crosses ranks
    /// (`timeline.transfers`; left empty otherwise). About as much memory as the spans.
    pub transfers: bool,
    /// Trace the critical path (`critical_path`; left empty otherwise, and always in the
    /// shared-device mode).
    pub critical_path: bool,
    /// One device per rank (the default) or one device for all.
    pub device: DeviceSharing,
}

impl SimOptions {
    /// Everything: what [`simulate`] records.
    pub const ALL: SimOptions = SimOptions {
        transfers: true,
        critical_path: true,
        device: DeviceSharing::PerRank,
    };

    /// Spans only.
    pub const SPANS: SimOptions = SimOptions {
        transfers: false,
        critical_path: false,
        device: DeviceSharing::PerRank,
    };

    /// The same options on `device`.
    pub const fn on(self, device: DeviceSharing) -> SimOptions {
        SimOptions { device, ..self }
    }
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions::ALL
    }
}

/// [`simulate`], recording only what `options` asks for (same model, same checks, same times).
///
/// ```
/// # use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// # use pipefill_host::schedule::{families, Params};
/// use pipefill_host::sim::{simulate, simulate_with, SimOptions};
/// let s = families::generate("1f1b", &Params::new(4, 8)).unwrap();
/// let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
/// let lean = simulate_with(&s, &c, SimOptions::SPANS).unwrap();
/// let full = simulate(&s, &c).unwrap();
/// assert_eq!(lean.timeline.spans, full.timeline.spans);
/// assert!(lean.timeline.transfers.is_empty() && !full.timeline.transfers.is_empty());
/// assert!(lean.critical_path.is_empty());
/// ```
pub fn simulate_with(
    schedule: &Schedule,
    costs: &CostModel,
    options: SimOptions,
) -> Result<Simulation, SimError> {
    let lowered = check_shape(schedule, costs)?;
    if options.device == DeviceSharing::Shared {
        return simulate_shared(schedule, costs, lowered, options);
    }
    let mut sim = simulate_per_rank(schedule, costs, lowered, options, Vec::new())?;
    sim.lower_bound = bound::lower_bound(schedule, costs);
    Ok(sim)
}

/// How much of the validator a crate-internal run does before it simulates.
///
/// The automatic scheduler simulates thousands of candidates per request, most of them its own
/// moves: a few items of an already simulated schedule put elsewhere in their rank's list. The
/// static checks read the whole schedule each time, about 15 % of a request's time at P = 16,
/// M = 128, V = 2; on such a candidate they can find nothing the run does not (an item put before
/// one it needs on its own rank never becomes ready, and the run reports the deadlock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checks {
    /// Steps 1 to 3 of the validator ([`crate::schedule::validate::check_static`]) and the cost
    /// model's fit: any schedule.
    Full,
    /// Only the cost model's fit, for a schedule of compute items only whose lists reorder, each
    /// within its rank, the items of a schedule that passed [`Checks::Full`]: the same items on the
    /// same ranks, so nothing is missing, repeated or misplaced. Debug builds run the full checks
    /// too and panic where this promise is broken.
    Reordered,
}

impl Checks {
    /// Runs the checks; tells whether the schedule carries transfers (never, for
    /// [`Checks::Reordered`]).
    fn run(self, schedule: &Schedule, costs: &CostModel) -> Result<bool, SimError> {
        match self {
            Checks::Full => check_shape(schedule, costs),
            Checks::Reordered => {
                debug_assert_eq!(
                    check_shape(schedule, costs).ok(),
                    Some(false),
                    "a reordered schedule that does not pass the checks, or carries transfers"
                );
                check_fit(schedule, costs)?;
                Ok(false)
            }
        }
    }
}

/// The spans of `schedule` on one device per rank (no lower bound, no transfers) and the critical
/// path ending at `rank`'s last item, or at the item that ends last when `rank` is `None` (then it
/// is [`Simulation::critical_path`]). The automatic scheduler's critical-path moves read it.
pub(crate) fn simulate_path_to(
    schedule: &Schedule,
    costs: &CostModel,
    rank: Option<usize>,
) -> Result<Simulation, SimError> {
    let lowered = check_shape(schedule, costs)?;
    let record = engine::Record {
        spans: true,
        transfers: false,
    };
    let mut engine = Engine::new(schedule, costs, lowered, record);
    engine.run()?;
    let critical_path = match rank {
        Some(r) => path::path_to_rank(&engine, r),
        None => path::critical_path(&engine),
    };
    Ok(Simulation {
        timeline: engine.timeline,
        peak_activations: engine.memory.into_peak(),
        critical_path,
        lower_bound: 0.0,
    })
}

/// [`simulate_with`] with one device per rank, on a checked schedule (`lowered`: it carries its
/// transfers), each stage's `REDUCE_GRAD` starting a reduction of `reduce_time[stage]` seconds;
/// `lower_bound` is left 0 for the caller.
fn simulate_per_rank(
    schedule: &Schedule,
    costs: &CostModel,
    lowered: bool,
    options: SimOptions,
    reduce_time: Vec<f64>,
) -> Result<Simulation, SimError> {
    let record = engine::Record {
        spans: true,
        transfers: options.transfers,
    };
    let mut engine = Engine::new(schedule, costs, lowered, record).with_reductions(reduce_time);
    engine.run()?;
    let critical_path = if options.critical_path {
        path::critical_path(&engine)
    } else {
        Vec::new()
    };
    Ok(Simulation {
        timeline: engine.timeline,
        peak_activations: engine.memory.into_peak(),
        critical_path,
        lower_bound: 0.0,
    })
}

/// [`simulate_with`] on one shared device (module `shared`).
fn simulate_shared(
    schedule: &Schedule,
    costs: &CostModel,
    lowered: bool,
    options: SimOptions,
) -> Result<Simulation, SimError> {
    if lowered {
        return Err(SimError::Shape {
            schedule: schedule.name.clone(),
            reason: "carries explicit transfers (SEND/RECV items); the shared-device mode \
                     simulates compute-only schedules: simulate the schedule without them"
                .into(),
        });
    }
    let run = shared::run(schedule, costs, options.transfers)?;
    let per_rank = bound::bound_for(
        schedule.ranks,
        schedule.microbatches,
        schedule.placement,
        costs,
        run.overlapped,
    );
    Ok(Simulation {
        timeline: run.timeline,
        peak_activations: run.peak,
        critical_path: Vec::new(),
        lower_bound: shared::bound(per_rank, run.work, schedule.ranks, costs.overlap_share),
    })
}

/// The numbers of a simulation without its timeline: what a search over many candidate plans needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Predicted step time.
    pub makespan: f64,
    /// Per rank, time spent computing.
    pub busy: Vec<f64>,
    /// Per rank, peak activation bytes.
    pub peak_activations: Vec<f64>,
    /// The [`lower_bound`].
    pub lower_bound: f64,
}

impl Summary {
    /// `1 - sum(busy) / (P * makespan)`; 0 for an empty schedule.
    pub fn bubble_fraction(&self) -> f64 {
        let p = self.busy.len() as f64;
        if self.makespan <= 0.0 || p == 0.0 {
            0.0
        } else {
            1.0 - self.busy.iter().sum::<f64>() / (p * self.makespan)
        }
    }

    /// `makespan / lower_bound`; 1 when both are 0.
    pub fn ratio_to_bound(&self) -> f64 {
        if self.lower_bound > 0.0 {
            self.makespan / self.lower_bound
        } else {
            1.0
        }
    }
}

/// Like [`simulate`] (same model, same checks, same numbers) but records no timeline: no memory per
/// action, for searches that simulate many candidates and keep only the numbers.
///
/// ```
/// # use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// # use pipefill_host::schedule::{families, Params};
/// use pipefill_host::sim::{simulate, summarize};
/// let s = families::generate("1f1b", &Params::new(4, 8)).unwrap();
/// let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
/// let sum = summarize(&s, &c).unwrap();
/// assert_eq!(sum.makespan, 33.0); // (M + P - 1)(F + B)
/// assert_eq!(sum.makespan, simulate(&s, &c).unwrap().timeline.makespan());
/// ```
pub fn summarize(schedule: &Schedule, costs: &CostModel) -> Result<Summary, SimError> {
    let mut summary = summarize_unbounded(schedule, costs, Checks::Full)?;
    summary.lower_bound = bound::lower_bound(schedule, costs);
    Ok(summary)
}

/// [`summarize`] without the lower bound (`lower_bound` is 0): for searches that score many
/// candidates of one instance and never read it (its staircases, section 7 of the bound, cost more
/// than simulating a small schedule), after the `checks` asked for.
pub(crate) fn summarize_unbounded(
    schedule: &Schedule,
    costs: &CostModel,
    checks: Checks,
) -> Result<Summary, SimError> {
    summarize_with_spans(schedule, costs, checks).map(|(summary, _)| summary)
}

/// [`summarize_unbounded`] with each rank's span, from its first item's start to its last item's
/// end (0 for a rank without items): what the span objective reads, without recording a timeline.
pub(crate) fn summarize_with_spans(
    schedule: &Schedule,
    costs: &CostModel,
    checks: Checks,
) -> Result<(Summary, Vec<f64>), SimError> {
    let lowered = checks.run(schedule, costs)?;
    let record = engine::Record {
        spans: false,
        transfers: false,
    };
    let mut engine = Engine::new(schedule, costs, lowered, record);
    engine.run()?;
    let spans = (engine.free_at.iter().zip(&engine.first_start))
        .zip(&schedule.actions)
        .map(|((&end, &start), list)| if list.is_empty() { 0.0 } else { end - start })
        .collect();
    let summary = Summary {
        makespan: engine.free_at.iter().copied().fold(0.0, f64::max),
        lower_bound: 0.0,
        busy: engine.busy,
        peak_activations: engine.memory.into_peak(),
    };
    Ok((summary, spans))
}

/// Refuses schedules that do not validate (steps 1 to 3 of the validator; the run finds deadlocks)
/// and cost models that do not fit them; tells whether the schedule carries transfers.
fn check_shape(schedule: &Schedule, costs: &CostModel) -> Result<bool, SimError> {
    let (_, lowered) = check_static_lowered(schedule)?;
    check_fit(schedule, costs)?;
    Ok(lowered)
}

/// The checks of [`check_shape`] that do not read the lists' items: the schedule's size and the
/// cost model's fit to it.
fn check_fit(schedule: &Schedule, costs: &CostModel) -> Result<(), SimError> {
    let shape = |reason: String| SimError::Shape {
        schedule: schedule.name.clone(),
        reason,
    };
    if schedule.ranks >= u32::MAX as usize
        || schedule
            .actions
            .iter()
            .any(|a| a.len() >= u32::MAX as usize)
    {
        return Err(shape(
            "is too large to simulate (over 2^32 items on a rank)".into(),
        ));
    }
    if costs.stages.len() != schedule.stages() {
        return Err(SimError::Stages {
            schedule: schedule.name.clone(),
            costs: costs.stages.len(),
            stages: schedule.stages(),
            ranks: schedule.ranks,
            chunks: schedule.chunks,
        });
    }
    costs.check()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{LinkCost, StageCost};
    use crate::schedule::{families, Action, Item, Op, Params, ScheduleError};

    /// P = 4, M = 8 with uneven costs and transfers.
    fn costs() -> CostModel {
        let link = LinkCost {
            latency: 0.1,
            bandwidth: f64::INFINITY,
        };
        CostModel::uniform(StageCost::uniform(1.0, 1.2, 0.8), 4, link)
    }

    #[test]
    fn reordered_runs_give_what_checked_runs_give() {
        for name in ["1f1b", "zb-h1", "zb-h2"] {
            let s = families::generate(name, &Params::new(4, 8)).unwrap();
            let full = summarize_unbounded(&s, &costs(), Checks::Full).unwrap();
            let reordered = summarize_unbounded(&s, &costs(), Checks::Reordered).unwrap();
            assert_eq!(full.makespan, reordered.makespan, "{name}");
            assert_eq!(full.busy, reordered.busy, "{name}");
            assert_eq!(full.peak_activations, reordered.peak_activations, "{name}");
            let (_, full) = summarize_with_spans(&s, &costs(), Checks::Full).unwrap();
            let (_, reordered) = summarize_with_spans(&s, &costs(), Checks::Reordered).unwrap();
            assert_eq!(full, reordered, "{name}");
            // Each rank's span is its recorded lane's, first start to last end.
            let sim = simulate_with(&s, &costs(), SimOptions::SPANS).unwrap();
            let lanes: Vec<f64> = (sim.timeline.spans.iter())
                .map(|lane| match (lane.first(), lane.last()) {
                    (Some(a), Some(b)) => b.end - a.start,
                    _ => 0.0,
                })
                .collect();
            assert_eq!(full, lanes, "{name}");
            assert!(full.iter().all(|&x| x > 0.0), "{name}");
        }
    }

    /// A reordering that puts rank 1's first input gradient before the forward it needs: the full
    /// checks refuse it, and without them the run never finds that item ready (a deadlock). Debug
    /// builds run the full checks on a reordered schedule too, and panic.
    #[test]
    #[cfg_attr(
        debug_assertions,
        should_panic(expected = "a reordered schedule that does not pass the checks")
    )]
    fn a_reordering_that_breaks_an_order_deadlocks_without_the_checks() {
        let mut s = families::generate("zb-h1", &Params::new(4, 8)).unwrap();
        let list = &mut s.actions[1];
        let is = |op: Op| move |it: &Item| *it == Item::One(Action::new(op, 1, 0));
        let f = list.iter().position(is(Op::F)).unwrap();
        let i = list.iter().position(is(Op::I)).unwrap();
        list.swap(f, i);
        assert!(summarize_unbounded(&s, &costs(), Checks::Full).is_err());
        let err = summarize_unbounded(&s, &costs(), Checks::Reordered).unwrap_err();
        assert!(
            matches!(err, SimError::Schedule(ScheduleError::Deadlock { .. })),
            "{err}"
        );
    }
}
