//! Data-parallel replicas in the model: each stage's weight gradients are all-reduced over `D`
//! pipeline replicas, starting as soon as the stage's last `W`/`B` of the step has run (or at the
//! stage's `REDUCE_GRAD`, where the schedule has one). [`reductions`] places them after a run (the
//! simulator's or a measured one): then they only lengthen the step. [`simulate_replicated`]
//! simulates them with the pipeline: a reduction overlaps the compute that follows its
//! `REDUCE_GRAD` until its `WAIT_REDUCE_GRAD`, which holds its rank (and what depends on it) until
//! the reduction has ended, as PyTorch's runtime waits there.
//!
//! The model: a ring all-reduce of `bytes` over `D` replicas takes
//! `latency + 2 (D - 1) / D * bytes / bandwidth` (each replica sends and receives `(D - 1) / D` of
//! the data twice, reduce-scatter then all-gather). Each rank has one reduction channel, separate from
//! its compute and from the pipeline's point-to-point transfers, so reductions overlap the other
//! stages' cool-down; a rank's reductions run one after another, in the order their stages become
//! ready. The step ends when the pipeline's last action and every reduction have ended (the
//! optimizer steps follow). With `D = 1` nothing changes.
//!
//! ```
//! use pipefill_host::cost::{CostModel, LinkCost, StageCost};
//! use pipefill_host::schedule::{families, Params};
//! use pipefill_host::sim::{data_parallel::{reductions, DataParallel}, simulate};
//! let s = families::generate("1f1b", &Params::new(2, 4)).unwrap();
//! let mut stage = StageCost::uniform(1.0, 1.0, 1.0);
//! stage.parameter_bytes = 1000.0;
//! let c = CostModel::uniform(stage, 2, LinkCost::default());
//! let sim = simulate(&s, &c).unwrap();
//! let dp = DataParallel { replicas: 4, link: LinkCost { latency: 0.5, bandwidth: 1000.0 } };
//! assert_eq!(dp.all_reduce_time(1000.0), 0.5 + 1.5); // 2 * 3/4 of 1000 bytes at 1000 B/s
//! let r = reductions(&s, &sim.timeline, &c, &dp);
//! assert_eq!(r.len(), 2);
//! // Stage 0's last backward is the step's last action: its reduction makes the step 2 s longer.
//! assert_eq!(dp.step_time(&sim.timeline, &r), sim.timeline.makespan() + 2.0);
//! ```

use serde::{Deserialize, Serialize};

use super::{check_shape, simulate_per_rank, SimError, SimOptions, Simulation};
use crate::cost::{CostModel, LinkCost};
use crate::runtime::last_gradient_actions;
use crate::schedule::{Item, ParamOp, Schedule};
use crate::timeline::Timeline;

/// `D` replicas and the link their all-reduces use.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DataParallel {
    /// `D`: pipeline replicas (1: no data parallelism).
    pub replicas: usize,
    /// The link between replicas.
    pub link: LinkCost,
}

impl DataParallel {
    /// One replica: nothing to reduce.
    pub const NONE: DataParallel = DataParallel {
        replicas: 1,
        link: LinkCost {
            latency: 0.0,
            bandwidth: f64::INFINITY,
        },
    };

    /// Seconds of a ring all-reduce of `bytes` (0 with one replica).
    pub fn all_reduce_time(&self, bytes: f64) -> f64 {
        if self.replicas <= 1 {
            return 0.0;
        }
        let d = self.replicas as f64;
        let moved = 2.0 * (d - 1.0) / d * bytes;
        self.link.latency
            + if moved > 0.0 {
                moved / self.link.bandwidth
            } else {
                0.0
            }
    }

    /// When the step ends: the pipeline's end or the last reduction's, whichever is later.
    pub fn step_time(&self, timeline: &Timeline, reductions: &[Reduction]) -> f64 {
        reductions
            .iter()
            .map(|r| r.end)
            .fold(timeline.makespan(), f64::max)
    }
}

impl Default for DataParallel {
    fn default() -> Self {
        DataParallel::NONE
    }
}

/// One stage's all-reduce in a step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Reduction {
    /// The global stage.
    pub stage: usize,
    /// Its rank.
    pub rank: usize,
    /// When it starts: its last gradient action's end, or the rank's previous reduction's end.
    pub start: f64,
    /// When it ends.
    pub end: f64,
}

/// The reductions of a step whose pipeline ran as `timeline` (the simulator's, or a measured one),
/// for the stages' `parameter_bytes` in `costs`; none with one replica.
pub fn reductions(
    schedule: &Schedule,
    timeline: &Timeline,
    costs: &CostModel,
    dp: &DataParallel,
) -> Vec<Reduction> {
    if dp.replicas <= 1 {
        return Vec::new();
    }
    let last = last_gradient_actions(schedule);
    // (ready time, stage) per rank.
    let mut ready: Vec<Vec<(f64, usize)>> = vec![Vec::new(); schedule.ranks];
    for (rank, spans) in timeline.spans.iter().enumerate() {
        for span in spans {
            let item = span.item();
            if let Item::Param(p) = item {
                // The schedule's own REDUCE_GRAD starts the reduction (after the last W/B).
                let started = ready
                    .get_mut(rank)
                    .and_then(|r| r.iter_mut().find(|x| x.1 == p.stage));
                if let (ParamOp::ReduceGrad, Some(x)) = (p.op, started) {
                    x.0 = x.0.max(span.end);
                }
                continue;
            }
            if !item.is_compute() {
                continue;
            }
            for a in item.actions() {
                if last.get(a.stage) == Some(&Some(a)) {
                    if let Some(r) = ready.get_mut(rank) {
                        r.push((span.end, a.stage));
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    for (rank, mut stages) in ready.into_iter().enumerate() {
        stages.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut free = f64::NEG_INFINITY;
        for (at, stage) in stages {
            let bytes = costs.stages.get(stage).map_or(0.0, |c| c.parameter_bytes);
            let start = at.max(free);
            let end = start + dp.all_reduce_time(bytes);
            free = end;
            out.push(Reduction {
                stage,
                rank,
                start,
                end,
            });
        }
    }
    out
}

/// A step simulated with its data-parallel reductions ([`simulate_replicated`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Replicated {
    /// The pipeline's run, its `WAIT_REDUCE_GRAD`s held until their reductions ended.
    pub simulation: Simulation,
    /// Each stage's reduction ([`reductions`] of that run).
    pub reductions: Vec<Reduction>,
    /// When the step ends ([`DataParallel::step_time`]).
    pub step_time: f64,
}

/// Simulates `schedule` (as [`simulate`](super::simulate)) with `dp`'s reductions in the run: each
/// `REDUCE_GRAD` starts its stage's all-reduce of `parameter_bytes`, and its `WAIT_REDUCE_GRAD`
/// holds the rank until the all-reduce has ended, so a wait placed before more compute delays it
/// by the reduction's un-overlapped time. A schedule without `REDUCE_GRAD`s runs as in
/// [`simulate`](super::simulate), its reductions after each stage's last `W`/`B`.
///
/// ```
/// use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// use pipefill_host::schedule::format::from_csv;
/// use pipefill_host::sim::data_parallel::{simulate_replicated, DataParallel};
/// // One rank, two stages; stage 1's reduction overlaps 0B0 (2 s) until its wait.
/// let late = from_csv("0F0,1F0,1B0,1REDUCE_GRAD,0B0,1WAIT_REDUCE_GRAD,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n", "late").unwrap();
/// let mut stage = StageCost::uniform(1.0, 1.0, 1.0);
/// stage.parameter_bytes = 1000.0;
/// let c = CostModel::uniform(stage, 2, LinkCost::default());
/// let dp = DataParallel { replicas: 2, link: LinkCost { latency: 0.0, bandwidth: 1000.0 } };
/// let run = simulate_replicated(&late, &c, &dp).unwrap(); // each reduction takes 1 s
/// assert_eq!(run.step_time, 6.0 + 1.0); // F, F, B(2), B(2), then stage 0's reduction
/// ```
pub fn simulate_replicated(
    schedule: &Schedule,
    costs: &CostModel,
    dp: &DataParallel,
) -> Result<Replicated, SimError> {
    let lowered = check_shape(schedule, costs)?;
    let time = costs
        .stages
        .iter()
        .map(|c| dp.all_reduce_time(c.parameter_bytes))
        .collect();
    let mut simulation = simulate_per_rank(schedule, costs, lowered, SimOptions::ALL, time)?;
    simulation.lower_bound = super::bound::lower_bound(schedule, costs);
    let reductions = reductions(schedule, &simulation.timeline, costs, dp);
    let step_time = dp.step_time(&simulation.timeline, &reductions);
    Ok(Replicated {
        simulation,
        reductions,
        step_time,
    })
}
