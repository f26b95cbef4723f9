//! Planning: choose the partition, the schedule family, `V` and `M` together, by simulated step time.
//!
//! The slowest stage is not what a training step costs: the schedule decides how much of the other
//! stages' time is hidden, warm-up and cool-down expose the first and last stages, more microbatches
//! shrink the bubble but make each one smaller, and memory rules some choices out. So [`plan`]
//! searches, for `P` ranks and a global batch of `N` samples:
//!
//! - every schedule family (or the ones asked for) and every `V` it accepts among the candidates;
//! - every `M` dividing `N` (up to a maximum), each microbatch then holding `N / M` samples;
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
//! kept. Times are scaled by [`LayerCost::scaled`]: when the file gives a layer's `fixed` part (what
//! `pipefill profile` fits from two microbatch sizes), by the affine model
//! `time(b) = fixed + (time - fixed) * b / b0`, so small microbatches pay their per-call overhead;
//! without it, linearly by `b / b0`, which is optimistic for small microbatches on devices whose
//! kernels lose efficiency at small sizes (profile with a fitted fixed part, or at the size you will
//! run, to avoid it). A line through two sizes is still off far from them; when the file gives a
//! layer's `samples` (its times measured at other sizes, `pipefill profile --sizes`), times are
//! interpolated between the measured sizes instead (see [`crate::cost::scaling`]).

use serde::Serialize;
use thiserror::Error;

use crate::cost::{CostError, CostFile, CostModel, LayerCost};
use crate::partition::{
    optimal_with_budget, per_stage_optimal, stage_in_flight, Layout, MemoryLimit, Method,
    Partition, PartitionError, Problem,
};
use crate::schedule::families::{Family, FAMILIES};
use crate::schedule::{Params, Schedule};
use crate::sim::{simulate, SimError, Simulation};

/// Node budget of the exact `V > 1` partition search for each candidate: the plan simulates and
/// refines afterwards, so a near-optimal bottleneck split found quickly is worth more than a proof.
pub const PLAN_NODE_BUDGET: u64 = 1_000_000;

/// Why planning failed altogether.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanError {
    /// A request field is unusable (the message names it and the fix).
    #[error("{0}")]
    Request(String),
    /// The costs are unusable.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// The layers are unusable for partitioning.
    #[error(transparent)]
    Partition(#[from] PartitionError),
    /// No candidate fits: every reason is listed, one per line.
    #[error("no plan fits: {0}")]
    NoPlan(String),
}

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
    /// Families to try; empty means all of [`FAMILIES`].
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
        }
    }
}

/// One simulated candidate.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Schedule family.
    pub family: &'static str,
    /// `V`.
    pub chunks: usize,
    /// `M`.
    pub microbatches: usize,
    /// Samples per microbatch, `N / M`.
    pub microbatch_size: usize,
    /// How the partition was found: a [`Method`] name, with `+refined` when boundary moves helped.
    pub partition: String,
    /// Layers in each stage.
    pub layers_per_stage: Vec<usize>,
    /// Predicted step time (makespan), seconds.
    pub step_time: f64,
    /// Predicted bubble fraction.
    pub bubble_fraction: f64,
    /// Predicted peak memory per rank (parameters + activations), bytes.
    pub peak_memory: Vec<f64>,
    /// The simulator's lower bound for this schedule shape and these costs, seconds.
    pub lower_bound: f64,
    /// `step_time / lower_bound`.
    pub ratio_to_bound: f64,
    /// Largest rank load per microbatch (`F + I + W` + transfers), seconds.
    pub bottleneck: f64,
    /// The schedule (not serialised).
    #[serde(skip)]
    pub schedule: Schedule,
}

/// A candidate that was ruled out, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// Family.
    pub family: &'static str,
    /// `V`.
    pub chunks: usize,
    /// `M`.
    pub microbatches: usize,
    /// Why.
    pub reason: String,
}

/// The result of [`plan`]: plans best first, and what was ruled out.
#[derive(Debug, Clone, Serialize)]
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

/// Scales per-layer costs measured at `b0` samples to `b = factor * b0` samples with
/// [`LayerCost::scaled`] (see the module docs).
pub fn scale_layers(layers: &[LayerCost], factor: f64) -> Vec<LayerCost> {
    layers.iter().map(|l| l.scaled(factor)).collect()
}

/// Everything fixed for one (family, V, M).
struct Shape<'a> {
    family: &'static Family,
    schedule: Schedule,
    layout: Layout,
    layers: Vec<LayerCost>,
    problem: Problem,
    limit: Option<MemoryLimit>,
    request: &'a PlanRequest,
}

impl Shape<'_> {
    fn microbatches(&self) -> usize {
        self.schedule.microbatches
    }

    fn model(&self, counts: &[usize]) -> Result<CostModel, CostError> {
        let mut m = CostModel::from_layers(&self.layers, counts, self.request.costs.transfer)?;
        m.overlap_share = self.request.costs.overlap_share;
        Ok(m)
    }

    /// Simulates a split; `Err(reason)` when it cannot run or does not fit in memory.
    fn evaluate(&self, part: &Partition, name: String) -> Result<Plan, String> {
        let counts = part.layers_per_stage();
        let model = self.model(&counts).map_err(|e| e.to_string())?;
        let sim = simulate(&self.schedule, &model).map_err(|e: SimError| e.to_string())?;
        let peak = peak_memory(&self.schedule, &model, &sim);
        if let Some(limit) = self.request.memory_limit {
            let worst = peak.iter().copied().fold(0.0, f64::max);
            if worst > limit {
                return Err(format!(
                    "{name} partition: predicted peak memory {worst:.0} bytes > limit {limit:.0}"
                ));
            }
        }
        let step = sim.timeline.makespan();
        Ok(Plan {
            family: self.family.name,
            chunks: self.layout.chunks,
            microbatches: self.microbatches(),
            microbatch_size: self.request.global_batch / self.microbatches(),
            partition: name,
            layers_per_stage: counts,
            step_time: step,
            bubble_fraction: sim.timeline.bubble_fraction(),
            peak_memory: peak,
            lower_bound: sim.lower_bound,
            ratio_to_bound: sim.ratio_to_bound(),
            bottleneck: part.bottleneck as f64 / crate::partition::NANOS_PER_SECOND,
            schedule: self.schedule.clone(),
        })
    }

    /// Moves one boundary by one layer at a time while the simulated step time improves.
    fn refine(&self, start: &Plan) -> Plan {
        let mut best = start.clone();
        let mut bounds = Partition::boundaries_from_counts(&best.layers_per_stage);
        for _round in 0..(4 * bounds.len()) {
            let mut improved = false;
            for i in 1..bounds.len() - 1 {
                for up in [false, true] {
                    let mut b = bounds.clone();
                    b[i] = if up { b[i] + 1 } else { b[i] - 1 };
                    if b[i] <= b[i - 1] || b[i] >= b[i + 1] {
                        continue;
                    }
                    let Ok(part) = self.problem.evaluate(&self.layout, &b) else {
                        continue;
                    };
                    let name = refined_name(&start.partition);
                    if let Ok(p) = self.evaluate(&part, name) {
                        if p.step_time < best.step_time * (1.0 - 1e-9) {
                            best = p;
                            bounds = b;
                            improved = true;
                        }
                    }
                }
            }
            if !improved {
                break;
            }
        }
        best
    }
}

fn refined_name(name: &str) -> String {
    if name.ends_with("+refined") {
        name.to_string()
    } else {
        format!("{name}+refined")
    }
}

/// Parameters of each rank's stages plus the simulator's activation peak.
fn peak_memory(schedule: &Schedule, model: &CostModel, sim: &Simulation) -> Vec<f64> {
    let mut mem = sim.peak_activations.clone();
    mem.resize(schedule.ranks, 0.0);
    for (s, st) in model.stages.iter().enumerate() {
        mem[schedule.rank_of(s)] += st.parameter_bytes;
    }
    mem
}

fn families(request: &PlanRequest) -> Result<Vec<&'static Family>, PlanError> {
    if request.families.is_empty() {
        return Ok(FAMILIES.iter().collect());
    }
    request
        .families
        .iter()
        .map(|n| {
            FAMILIES.iter().find(|f| f.name == n).ok_or_else(|| {
                let names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
                PlanError::Request(format!(
                    "unknown schedule family `{n}`; choose from {}",
                    names.join(", ")
                ))
            })
        })
        .collect()
}

fn check(request: &PlanRequest) -> Result<(), PlanError> {
    let bad = |m: String| Err(PlanError::Request(m));
    if request.ranks == 0 {
        return bad("ranks must be at least 1".into());
    }
    if request.global_batch == 0 {
        return bad("global batch must be at least 1 sample".into());
    }
    if !(request.cost_batch.is_finite() && request.cost_batch > 0.0) {
        return bad(format!(
            "cost batch is {}; give the microbatch size (samples > 0) the costs were measured at",
            request.cost_batch
        ));
    }
    if let Some(l) = request.memory_limit {
        if !(l.is_finite() && l > 0.0) {
            return bad(format!("memory limit is {l}; give bytes per rank > 0"));
        }
    }
    if let Some(m) = request
        .microbatch_counts
        .iter()
        .find(|&&m| m == 0 || request.global_batch % m != 0)
    {
        return bad(format!(
            "{m} microbatches do not split a global batch of {} samples; use a divisor of it",
            request.global_batch
        ));
    }
    if request.chunks.contains(&0) {
        return bad("chunks (V) candidates must be at least 1".into());
    }
    if request.costs.layers.len() < request.ranks {
        return bad(format!(
            "{} layers cannot fill {} ranks: every stage needs a layer; use at most {} ranks",
            request.costs.layers.len(),
            request.ranks,
            request.costs.layers.len()
        ));
    }
    Ok(())
}

/// Searches partition x family x V x M (see the [module docs](self)); plans best first.
pub fn plan(request: &PlanRequest) -> Result<PlanReport, PlanError> {
    check(request)?;
    let fams = families(request)?;
    let ms: Vec<usize> = if request.microbatch_counts.is_empty() {
        (1..=request.global_batch.min(request.max_microbatches.max(1)))
            .filter(|m| request.global_batch % m == 0)
            .collect()
    } else {
        request.microbatch_counts.clone()
    };
    let mut plans = Vec::new();
    let mut skipped = Vec::new();
    let mut shapes = Vec::new();
    for family in fams {
        let mut vs: Vec<usize> = request.chunks.clone();
        if !vs.contains(&family.default_chunks) {
            vs.push(family.default_chunks);
        }
        vs.sort_unstable();
        vs.dedup();
        for &v in &vs {
            for &m in &ms {
                let skip = |reason: String| Skipped {
                    family: family.name,
                    chunks: v,
                    microbatches: m,
                    reason,
                };
                match shape(request, family, v, m) {
                    Ok(None) => {}
                    Ok(Some(sh)) => {
                        let (found, why) = candidates(&sh);
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
    sort(&mut plans);
    // Refine the best few distinct shapes.
    let mut refined = Vec::new();
    let mut seen = Vec::new();
    for p in &plans {
        if refined.len() >= request.refine {
            break;
        }
        let key = (p.family, p.chunks, p.microbatches);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        if let Some(sh) = shapes
            .iter()
            .find(|s| (s.family.name, s.layout.chunks, s.microbatches()) == key)
        {
            let r = sh.refine(p);
            if r.step_time < p.step_time {
                refined.push(r);
            }
        }
    }
    plans.extend(refined);
    sort(&mut plans);
    if plans.is_empty() {
        return Err(PlanError::NoPlan(summarize(&skipped)));
    }
    Ok(PlanReport { plans, skipped })
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

/// Best first: step time (equal within a relative 1e-9), then fewer microbatches (larger ones run
/// more efficiently than the linear cost scaling predicts), then the largest peak memory, then
/// family, V and partition name.
fn sort(plans: &mut [Plan]) {
    plans.sort_by(|a, b| {
        let mem = |p: &Plan| p.peak_memory.iter().copied().fold(0.0, f64::max);
        let tie = (a.step_time - b.step_time).abs() <= 1e-9 * a.step_time.max(b.step_time);
        let by_time = if tie {
            std::cmp::Ordering::Equal
        } else {
            a.step_time.total_cmp(&b.step_time)
        };
        by_time
            .then(a.microbatches.cmp(&b.microbatches))
            .then(mem(a).total_cmp(&mem(b)))
            .then(a.family.cmp(b.family))
            .then(a.chunks.cmp(&b.chunks))
            .then(a.partition.cmp(&b.partition))
    });
}

/// Builds the schedule, scaled costs and memory limit of one (family, V, M); `Ok(None)` when the
/// family does not do this V (not worth reporting), `Err` for other refusals.
fn shape<'a>(
    request: &'a PlanRequest,
    family: &'static Family,
    v: usize,
    m: usize,
) -> Result<Option<Shape<'a>>, String> {
    let p = request.ranks;
    let params = Params::new(p, m).with_chunks(v);
    let schedule = match (family.generate)(&params) {
        Ok(s) => s,
        Err(e) => {
            return if v != family.default_chunks {
                Ok(None)
            } else {
                Err(e.to_string())
            }
        }
    };
    shape_of(request, family, schedule).map(Some)
}

/// The shape of an already generated schedule.
fn shape_of<'a>(
    request: &'a PlanRequest,
    family: &'static Family,
    schedule: Schedule,
) -> Result<Shape<'a>, String> {
    let (p, v, m) = (schedule.ranks, schedule.chunks, schedule.microbatches);
    if p * v > request.costs.layers.len() {
        return Err(format!(
            "{} stages need at least as many layers, the model has {}",
            p * v,
            request.costs.layers.len()
        ));
    }
    let layout = Layout {
        ranks: p,
        chunks: v,
        placement: schedule.placement,
    };
    let factor = (request.global_batch / m) as f64 / request.cost_batch;
    let layers = scale_layers(&request.costs.layers, factor);
    let problem =
        Problem::from_layers(&layers, &request.costs.transfer).map_err(|e| e.to_string())?;
    let limit = request.memory_limit.map(|bytes| MemoryLimit {
        bytes_per_rank: bytes.floor() as u64,
        in_flight: stage_in_flight(&schedule),
    });
    Ok(Shape {
        family,
        schedule,
        layout,
        layers,
        problem,
        limit,
        request,
    })
}

/// The best partition for a given schedule of a known family, with costs measured at the schedule's
/// microbatch size: the partition methods simulated, the best refined by boundary moves (what
/// `pipefill train --plan auto` uses for each family it considers). The plan's `microbatch_size` is 1
/// (costs are not rescaled).
pub fn best_partition(
    costs: &CostFile,
    schedule: &Schedule,
    memory_limit: Option<f64>,
) -> Result<Plan, PlanError> {
    let family = FAMILIES
        .iter()
        .find(|f| f.name == schedule.name)
        .ok_or_else(|| {
            PlanError::Request(format!(
                "schedule `{}` is not one of the known families; plan a family by name",
                schedule.name
            ))
        })?;
    let mut request = PlanRequest::new(costs.clone(), 1.0, schedule.ranks, schedule.microbatches);
    request.memory_limit = memory_limit;
    check(&request)?;
    let sh = shape_of(&request, family, schedule.clone()).map_err(PlanError::Request)?;
    let (mut found, why) = candidates(&sh);
    sort(&mut found);
    let first = found
        .first()
        .ok_or_else(|| PlanError::NoPlan(why.join("; ")))?;
    let refined = sh.refine(first);
    Ok(if refined.step_time < first.step_time {
        refined
    } else {
        first.clone()
    })
}

/// Simulates every partition method on one shape.
fn candidates(sh: &Shape) -> (Vec<Plan>, Vec<String>) {
    let mut found = Vec::new();
    let mut why = Vec::new();
    let mut tried: Vec<Vec<usize>> = Vec::new();
    for method in Method::ALL {
        // Baselines do not know the limit; the simulator's memory check below rules them out.
        let limit = if method == Method::Optimal {
            sh.limit.as_ref()
        } else {
            None
        };
        let result = if method == Method::Optimal {
            optimal_with_budget(&sh.problem, &sh.layout, limit, PLAN_NODE_BUDGET)
        } else {
            method.apply(&sh.problem, &sh.layout, limit)
        };
        match result {
            Ok(part) => {
                if tried.contains(&part.boundaries) {
                    continue;
                }
                tried.push(part.boundaries.clone());
                match sh.evaluate(&part, method.name().to_string()) {
                    Ok(p) => found.push(p),
                    Err(e) => why.push(e),
                }
            }
            Err(e) => why.push(format!("{} partition: {e}", method.name())),
        }
    }
    if sh.layout.chunks > 1 {
        if let Ok(part) = per_stage_optimal(&sh.problem, &sh.layout) {
            if !tried.contains(&part.boundaries) {
                match sh.evaluate(&part, "per-stage-optimal".to_string()) {
                    Ok(p) => found.push(p),
                    Err(e) => why.push(e),
                }
            }
        }
    }
    (found, why)
}
