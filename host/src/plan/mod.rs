//! Planning: choose the partition, the schedule family, `V` and `M` together, by simulated step time.
//!
//! The slowest stage is not what a training step costs: the schedule decides how much of the other
//! stages' time is hidden, warm-up and cool-down expose the first and last stages, more microbatches
//! shrink the bubble but make each one smaller, and memory rules some choices out. So [`plan`]
//! searches, for `P` ranks and a global batch of `N` samples:
//!
//! - every schedule family (or the ones asked for) and every `V` it accepts among the candidates,
//!   and `auto` when named ([`PlanRequest::auto`]: solved for the costs at each `P`, `D` and `M`
//!   tried, then split and simulated like the families);
//! - every `M` dividing `N` (up to a maximum), each microbatch then holding `N / M` samples;
//! - with [`PlanRequest::recompute`], each stage's recomputation: none, full everywhere, or chosen
//!   per stage under the limit ([`RecomputeChoice::Auto`], module `recompute`, [`fit_recompute`]);
//! - for each, the partitions of [`crate::partition`]: the exact bottleneck optimum (under the memory
//!   limit, with the schedule's in-flight activations per stage), the baselines, and with `V > 1` the
//!   per-stage optimum (which often simulates faster than the rank-load optimum);
//!
//! simulates each candidate with [`crate::sim::simulate`], drops those whose peak memory (parameters
//! plus the simulator's activation peak) exceeds the limit, then **refines** the best few: moving one
//! stage boundary by one layer at a time while the simulated step time improves. Plans come back best
//! first.
//!
//! ## Scaling costs with the microbatch size
//!
//! The cost file was measured at some microbatch size `b0` ([`PlanRequest::cost_batch`]). For a
//! microbatch of `b` samples, activation and output bytes are scaled by `b / b0` and parameter bytes
//! kept. Times are scaled by [`LayerCost::scaled`](crate::cost::LayerCost::scaled): when the file gives a layer's `fixed` part (what
//! `pipefill profile` fits from two microbatch sizes), by the affine model
//! `time(b) = fixed + (time - fixed) * b / b0`, so small microbatches pay their per-call overhead;
//! without it, linearly by `b / b0`, which is optimistic for small microbatches on devices whose
//! kernels lose efficiency at small sizes (profile with a fitted fixed part, or at the size you will
//! run, to avoid it). A line through two sizes is still off far from them; when the file gives a
//! layer's `samples` (its times measured at other sizes, `pipefill profile --sizes`), times are
//! interpolated between the measured sizes instead (see [`crate::cost::scaling`]).
//!
//! ## Choosing among near-equal plans
//!
//! [`choose`](fn@choose) picks the plan to run. The fastest predicted plan wins unless others are predicted
//! within the profile's measured spread of it ([`relative_spread`], recorded in a cost file's
//! `meta.spread`; the window is kept within [`MIN_TIE`] and [`MAX_TIE`] by [`tie_window`]):
//! predictions that close swap from one profile to the next, so the first by step time would change
//! from run to run (and with it the losses' last bits). Such a near-tie is decided by a stated rule
//! that reads the schedules' shapes and the batch, never a measured time ([`NEAR_TIE_RULE`]): a
//! handcrafted family before `auto` (whose schedule itself follows the measured costs), then the
//! fastest on even costs (every stage's `F = I = W`, free transfers: it leans to the fast end of
//! the tie, away from its edge, where a candidate would drop in and out), then the fewest samples
//! in flight per rank (the least activation memory), then the simplest family, then the fewest
//! microbatches, then the fewest chunks. [`on_one_device`] re-scores plans whose ranks share one
//! device (the simulator's shared-device mode).
//!
//! ## Given schedules
//!
//! [`best_partition`], [`plan_schedule`] and [`plan_families`] plan schedules that are given rather
//! than searched (a schedule file, or one schedule per family at fixed `P`, `V`, `M`): any schedule
//! that validates, whatever its name. Every [`Plan`] carries its schedule and the [`CostModel`] it was
//! scored with, so [`Plan::timeline`] redraws its prediction without rebuilding costs, and it
//! serialises with serde.

use serde::{Deserialize, Serialize};

use crate::auto::AutoOptions;
use crate::cost::{CostFile, CostModel, Recompute, RecomputeChoice};
use crate::schedule::{Params, Schedule};
use crate::sim::data_parallel::DataParallel;
use crate::sim::{simulate, SimError};
use crate::timeline::Timeline;

mod choose;
mod error;
mod given;
mod recompute;
mod search;
mod serde_plan;
mod source;

pub use choose::{
    choose, on_one_device, recorded_spread, relative_spread, tie_window, Candidates, Choice,
    NearTie, MAX_TIE, MIN_TIE, NEAR_TIE_RULE, SPREAD_KEY,
};
pub use error::PlanError;
pub use given::{
    best_partition, best_partition_replicated, plan_families, plan_given, plan_schedule,
    plan_schedule_with, Split,
};

pub use recompute::{fit_recompute, peak_memory, summary as recompute_summary, with_modes};
use search::{sort, Shape};
pub use source::generate;
use source::{sources, Source};

/// Node budget of the exact `V > 1` partition search for each candidate: the plan simulates and
/// refines afterwards, so a near-optimal bottleneck split found quickly is worth more than a proof.
pub const PLAN_NODE_BUDGET: u64 = 1_000_000;

/// What to plan for.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// Per-layer costs, link and overlap share.
    pub costs: CostFile,
    /// Samples per microbatch at which the costs were measured (`b0`).
    pub cost_batch: f64,
    /// `P`.
    pub ranks: usize,
    /// `N`: samples per training step.
    pub global_batch: usize,
    /// Bytes each rank may hold (parameters + activations); `None` for no limit.
    pub memory_limit: Option<f64>,
    /// Schedules to try: family names, and `auto` for the automatic scheduler (solved at every
    /// `P`, `V` and `M` tried, for the costs at that microbatch size, split evenly); empty means
    /// every handcrafted family of [`FAMILIES`](crate::schedule::families::FAMILIES).
    pub families: Vec<String>,
    /// `V` values to try for families that accept several (each family refuses what it cannot do).
    pub chunks: Vec<usize>,
    /// Largest `M` to try.
    pub max_microbatches: usize,
    /// Exactly these `M` values (each must divide the global batch); empty means every divisor of the
    /// global batch up to `max_microbatches`.
    pub microbatch_counts: Vec<usize>,
    /// How many of the best candidates to refine by moving boundaries (0: none).
    pub refine: usize,
    /// Data-parallel replicas of the pipeline and their link ([`DataParallel::NONE`] by default).
    /// The global batch stays global: each replica trains on `global_batch / D` samples, and every
    /// plan's step time includes its stages' all-reduces ([`crate::sim::data_parallel`]).
    pub data_parallel: DataParallel,
    /// How `auto` is solved when [`PlanRequest::families`] names it (its `V`, placement, objective,
    /// budget, seed, and its limit in microbatches when [`PlanRequest::memory_limit`] is `None`).
    pub auto: AutoOptions,
    /// Which recomputation modes the stages may take ([`RecomputeChoice`]; module `recompute`):
    /// `Auto` chooses per stage with the partition and schedule under [`PlanRequest::memory_limit`].
    pub recompute: RecomputeChoice,
}

impl PlanRequest {
    /// A request with all families, `V` in `{1, 2, 4}`, `M` up to 64 and the best 4 refined.
    pub fn new(costs: CostFile, cost_batch: f64, ranks: usize, global_batch: usize) -> Self {
        PlanRequest {
            costs,
            cost_batch,
            ranks,
            global_batch,
            memory_limit: None,
            families: Vec::new(),
            chunks: vec![1, 2, 4],
            max_microbatches: 64,
            microbatch_counts: Vec::new(),
            refine: 4,
            data_parallel: DataParallel::NONE,
            auto: AutoOptions::default(),
            recompute: RecomputeChoice::None,
        }
    }

    /// Samples per replica per step: `global_batch / D`.
    pub fn replica_batch(&self) -> usize {
        self.global_batch / self.data_parallel.replicas.max(1)
    }
}

/// One simulated candidate: a schedule, its split, the costs it was scored with and the prediction.
///
/// Serialises with serde, schedule and costs included (the schedule in its JSON file form); reading
/// one back validates the schedule and checks the costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The schedule's name: a family name for a generated schedule, any label for a given one.
    pub family: String,
    /// `V`.
    pub chunks: usize,
    /// `M`.
    pub microbatches: usize,
    /// Samples per microbatch, `N / M` (1 for a given schedule: the costs' own size).
    pub microbatch_size: usize,
    /// How the partition was found: a partition method's name, with `+refined` when boundary moves
    /// helped.
    pub partition: String,
    /// Layers in each stage.
    pub layers_per_stage: Vec<usize>,
    /// Predicted step time, seconds: the pipeline's makespan, or later when a data-parallel
    /// all-reduce ends after it (see `reduce_tail`).
    pub step_time: f64,
    /// `P`: ranks of one pipeline (also `schedule.ranks`).
    #[serde(default)]
    pub ranks: usize,
    /// Data-parallel replicas `D` the plan was scored for (1: none).
    #[serde(default = "one")]
    pub data_parallel: usize,
    /// Seconds the step's all-reduces add after the pipeline's last action (0 without data
    /// parallelism, or when they all end under the cool-down).
    #[serde(default)]
    pub reduce_tail: f64,
    /// Predicted bubble fraction.
    pub bubble_fraction: f64,
    /// Predicted peak memory per rank (parameters + activations), bytes.
    pub peak_memory: Vec<f64>,
    /// Per stage, its recomputation mode (also in `cost`, which the prediction used); empty in
    /// plans written before recomputation, which recompute nothing.
    #[serde(default)]
    pub recompute: Vec<Recompute>,
    /// The simulator's lower bound for this schedule shape and these costs, seconds.
    pub lower_bound: f64,
    /// `step_time / lower_bound`.
    pub ratio_to_bound: f64,
    /// Largest rank load per microbatch (`F + I + W` + transfers), seconds.
    pub bottleneck: f64,
    /// The schedule.
    #[serde(with = "serde_plan::schedule")]
    pub schedule: Schedule,
    /// The per-stage costs the plan was scored with (scaled to its microbatch size, its split, the
    /// cost file's link and overlap share).
    #[serde(deserialize_with = "serde_plan::checked_cost")]
    pub cost: CostModel,
}

fn one() -> usize {
    1
}

impl Plan {
    /// The predicted timeline: the schedule simulated under the plan's own costs (its makespan is
    /// `step_time`).
    pub fn timeline(&self) -> Result<Timeline, SimError> {
        simulate(&self.schedule, &self.cost).map(|s| s.timeline)
    }
}

/// A candidate that was ruled out, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    /// The schedule's name (family or label).
    pub family: String,
    /// `V`.
    pub chunks: usize,
    /// `M`.
    pub microbatches: usize,
    /// Why.
    pub reason: String,
}

impl Skipped {
    /// `schedule` ruled out for `reason`.
    fn of(schedule: &Schedule, reason: String) -> Self {
        Skipped {
            family: schedule.name.clone(),
            chunks: schedule.chunks,
            microbatches: schedule.microbatches,
            reason,
        }
    }
}

/// The result of [`plan`] and [`plan_families`]: plans best first, and what was ruled out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    /// Every feasible candidate, best (shortest predicted step) first.
    pub plans: Vec<Plan>,
    /// Candidates ruled out (refused by the family, memory, ...).
    pub skipped: Vec<Skipped>,
}

impl PlanReport {
    /// The best plan.
    pub fn best(&self) -> Option<&Plan> {
        self.plans.first()
    }
}

/// Checks a request's numbers.
fn check(request: &PlanRequest) -> Result<(), PlanError> {
    if request.ranks == 0 {
        return Err(PlanError::NoRanks);
    }
    if request.global_batch == 0 {
        return Err(PlanError::NoSamples);
    }
    let d = request.data_parallel.replicas;
    if d == 0 || request.global_batch % d != 0 {
        return Err(PlanError::Replicas {
            replicas: d,
            global_batch: request.global_batch,
        });
    }
    if !(request.cost_batch.is_finite() && request.cost_batch > 0.0) {
        return Err(PlanError::CostBatch {
            value: request.cost_batch,
        });
    }
    if let Some(value) = request.memory_limit {
        if !(value.is_finite() && value > 0.0) {
            return Err(PlanError::MemoryLimit { value });
        }
    }
    if let Some(&m) = request
        .microbatch_counts
        .iter()
        .find(|&&m| m == 0 || request.replica_batch() % m != 0)
    {
        return Err(PlanError::Microbatches {
            microbatches: m,
            global_batch: request.replica_batch(),
        });
    }
    if request.chunks.contains(&0) {
        return Err(PlanError::NoChunks);
    }
    if request.costs.layers.len() < request.ranks {
        return Err(PlanError::TooFewLayers {
            layers: request.costs.layers.len(),
            stages: request.ranks,
        });
    }
    Ok(())
}

/// Searches how to split `workers` into `P` ranks times `D` data-parallel replicas, along with
/// everything [`plan`] searches for each split (family, `V`, `M`, partition): every `P` that divides
/// `workers` (and that the model has layers for) with `D = workers / P`, the request's
/// `data_parallel.link` for the replicas' all-reduces. Splits that cannot run are reported in
/// `skipped` (family `P=.. D=..`); the plans of every split come best first.
///
/// ```
/// use pipefill_host::cost::{CostFile, LayerCost, LinkCost};
/// use pipefill_host::plan::{plan_workers, PlanRequest};
/// let mut layers: Vec<LayerCost> = (0..8).map(|i| LayerCost::new(format!("l{i}"), 1.0, 1.0, 1.0)).collect();
/// for l in &mut layers { l.parameter_bytes = 1e6; }
/// let costs = CostFile { layers, transfer: LinkCost::default(), overlap_share: 1.0, meta: serde_json::Value::Null };
/// let mut req = PlanRequest::new(costs, 1.0, 1, 16);
/// req.families = vec!["1f1b".into()];
/// req.data_parallel.link = LinkCost { latency: 0.0, bandwidth: 1e9 };
/// let report = plan_workers(&req, 4).unwrap();
/// let splits: std::collections::BTreeSet<(usize, usize)> =
///     report.plans.iter().map(|p| (p.ranks, p.data_parallel)).collect();
/// assert_eq!(splits.into_iter().collect::<Vec<_>>(), vec![(1, 4), (2, 2), (4, 1)]);
/// ```
pub fn plan_workers(request: &PlanRequest, workers: usize) -> Result<PlanReport, PlanError> {
    if workers == 0 {
        return Err(PlanError::NoRanks);
    }
    let mut plans = Vec::new();
    let mut skipped = Vec::new();
    // A stage needs a layer, so no split has more ranks than the model has layers: the search
    // stops there (it used to walk every number up to `workers`, for ever on a huge one).
    let layers = request.costs.layers.len();
    if workers > layers {
        skipped.push(Skipped {
            family: format!("P>{layers}"),
            chunks: 0,
            microbatches: 0,
            reason: format!("more ranks than the model's {layers} layers: every stage needs one"),
        });
    }
    for (p, d, r) in worker_splits(request, workers) {
        let split = |reason: String| Skipped {
            family: format!("P={p} D={d}"),
            chunks: 0,
            microbatches: 0,
            reason,
        };
        match plan(&r) {
            Ok(report) => {
                plans.extend(report.plans);
                skipped.extend(report.skipped);
            }
            Err(PlanError::NoPlan { skipped: s }) => skipped.extend(s),
            Err(e @ (PlanError::TooFewLayers { .. } | PlanError::Replicas { .. })) => {
                skipped.push(split(e.to_string()))
            }
            Err(PlanError::Microbatches { .. }) => {
                skipped.push(split(format!("the batch does not split over {d} replicas")))
            }
            Err(e) => return Err(e),
        }
    }
    sort(&mut plans);
    if plans.is_empty() {
        return Err(PlanError::NoPlan { skipped });
    }
    Ok(PlanReport { plans, skipped })
}

/// The `(P, D, request)` splits of `workers` that [`plan_workers`] searches: every `P` dividing
/// it, up to the model's layer count.
fn worker_splits(
    request: &PlanRequest,
    workers: usize,
) -> impl Iterator<Item = (usize, usize, PlanRequest)> + '_ {
    let layers = request.costs.layers.len();
    (1..=workers.min(layers))
        .filter(move |p| workers % p == 0)
        .map(move |p| {
            let d = workers / p;
            let mut r = request.clone();
            r.ranks = p;
            r.data_parallel.replicas = d;
            (p, d, r)
        })
}

/// The work of [`plan_workers`] on `request` and `workers`: [`estimated_work`] of every split.
pub fn estimated_workers_work(request: &PlanRequest, workers: usize) -> u64 {
    worker_splits(request, workers)
        .map(|(_, _, r)| estimated_work(&r))
        .fold(0, u64::saturating_add)
}

/// The `M` values to try.
fn microbatch_counts(request: &PlanRequest) -> Vec<usize> {
    if request.microbatch_counts.is_empty() {
        (1..=request.replica_batch().min(request.max_microbatches.max(1)))
            .filter(|m| request.replica_batch() % m == 0)
            .collect()
    } else {
        request.microbatch_counts.clone()
    }
}

/// The work of [`plan`] on `request`, in cells of the exact split
/// ([`crate::partition::split_work`]): one split per family, `V` and `M` it tries, each at
/// `P x V` stages. Counted before any work; 0 when the request does not check.
pub fn estimated_work(request: &PlanRequest) -> u64 {
    let Ok(sources) = sources(&request.families) else {
        return 0;
    };
    let layers = request.costs.layers.len();
    let ms = microbatch_counts(request).len() as u64;
    sources
        .iter()
        .flat_map(|s| s.chunk_counts(&request.chunks, &request.auto))
        .filter_map(|v| request.ranks.checked_mul(v))
        .filter(|&s| s <= layers)
        .map(|s| crate::partition::split_work(layers, s).saturating_mul(ms))
        .fold(0, u64::saturating_add)
}

/// Searches partition x family x V x M (see the [module docs](self)); plans best first.
pub fn plan(request: &PlanRequest) -> Result<PlanReport, PlanError> {
    check(request)?;
    let sources = sources(&request.families)?;
    let ms = microbatch_counts(request);
    let mut plans = Vec::new();
    let mut skipped = Vec::new();
    let mut shapes = Vec::new();
    for source in sources {
        for v in source.chunk_counts(&request.chunks, &request.auto) {
            for &m in &ms {
                let skip = |reason: String| Skipped {
                    family: source.name().to_string(),
                    chunks: v,
                    microbatches: m,
                    reason,
                };
                for mode in solve_modes(source, request.recompute, request.memory_limit) {
                    match shape(request, source, v, m, mode) {
                        Ok(None) => {}
                        Ok(Some(sh)) => {
                            let (found, why) = sh.candidates();
                            skipped.extend(why.into_iter().map(skip));
                            if !found.is_empty() {
                                plans.extend(found);
                                shapes.push(sh);
                            }
                        }
                        Err(reason) => skipped.push(skip(reason)),
                    }
                }
            }
        }
    }
    sort(&mut plans);
    let refined = refine_best(request.refine, &plans, &shapes);
    plans.extend(refined);
    sort(&mut plans);
    search::one_per_shape_at_one_rank(&mut plans);
    if plans.is_empty() {
        return Err(PlanError::NoPlan { skipped });
    }
    Ok(PlanReport { plans, skipped })
}

/// Refines the best plan of each of the best `count` distinct shapes; the refinements that helped.
fn refine_best(count: usize, plans: &[Plan], shapes: &[Shape]) -> Vec<Plan> {
    let mut refined = Vec::new();
    let mut seen: Vec<(&str, usize, usize)> = Vec::new();
    for p in plans {
        if seen.len() >= count {
            break;
        }
        let key = (p.family.as_str(), p.chunks, p.microbatches);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        if let Some(sh) = shapes.iter().find(|s| s.schedule == p.schedule) {
            let r = sh.refine(p);
            if r.step_time < p.step_time {
                refined.push(r);
            }
        }
    }
    refined
}

/// The first few reasons candidates were ruled out, and how many there were.
fn summarize(skipped: &[Skipped]) -> String {
    const SHOWN: usize = 8;
    let mut lines: Vec<String> = skipped
        .iter()
        .take(SHOWN)
        .map(|s| {
            format!(
                "{} V={} M={}: {}",
                s.family, s.chunks, s.microbatches, s.reason
            )
        })
        .collect();
    if skipped.len() > SHOWN {
        lines.push(format!("... and {} more", skipped.len() - SHOWN));
    }
    format!(
        "{} candidates ruled out, for example:\n  {}",
        skipped.len(),
        lines.join("\n  ")
    )
}

/// The shape of one (source, V, M); `Ok(None)` when a family does not do this V (not worth
/// reporting), `Err` for other refusals (`auto` is solved for the costs at this microbatch size).
fn shape<'a>(
    request: &'a PlanRequest,
    source: Source,
    v: usize,
    m: usize,
    mode: Recompute,
) -> Result<Option<Shape<'a>>, String> {
    let params = Params::new(request.ranks, m).with_chunks(v);
    let costs = search::scaled(request, m);
    match source.schedule_with(&params, &costs, request.memory_limit, &request.auto, mode) {
        Ok(s) => Shape::new(request, s).map(Some).map_err(|e| e.to_string()),
        Err(_) if v != source.default_chunks(&request.auto) => Ok(None),
        Err(PlanError::Schedule { source, .. }) => Err(source.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// The recomputation modes `auto` is solved for (its memory model counts what each keeps): the
/// request's, both with [`RecomputeChoice::Auto`] under a limit; one schedule for a family.
fn solve_modes(source: Source, choice: RecomputeChoice, limit: Option<f64>) -> Vec<Recompute> {
    match (source, choice, limit) {
        (Source::Auto, RecomputeChoice::Full, _) => vec![Recompute::Full],
        (Source::Auto, RecomputeChoice::Selective, _) => vec![Recompute::Selective],
        (Source::Auto, RecomputeChoice::Auto, Some(_)) => vec![Recompute::None, Recompute::Full],
        _ => vec![Recompute::None],
    }
}
