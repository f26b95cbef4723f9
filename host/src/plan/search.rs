//! One shape (schedule, `V`, `M`, scaled costs) and its candidate partitions: simulated, ruled out by
//! memory, refined by boundary moves, and sorted best first.

use crate::cost::{CostFile, CostModel, LayerCost, Recompute, RecomputeChoice};
use crate::partition::{
    optimal_with_budget, per_stage_optimal, stage_in_flight, Layout, MemoryLimit, Method,
    Partition, Problem, NANOS_PER_SECOND,
};
use crate::schedule::Schedule;
use crate::sim::data_parallel::reductions;
use crate::sim::simulate;

use super::recompute::{fit_recompute, peak_memory, uniform_sets, with_modes};
use super::{Plan, PlanError, PlanRequest, PLAN_NODE_BUDGET};

/// Everything fixed for one schedule (so one family, `V`, `M`): the partitions vary.
pub(super) struct Shape<'a> {
    /// The schedule.
    pub(super) schedule: Schedule,
    /// Its layout.
    pub(super) layout: Layout,
    /// The costs scaled to this shape's microbatch size.
    layers: Vec<LayerCost>,
    /// The partitioner's view of `layers`.
    problem: Problem,
    /// The memory limit with this schedule's in-flight counts.
    limit: Option<MemoryLimit>,
    /// What was asked.
    request: &'a PlanRequest,
}

impl<'a> Shape<'a> {
    /// The shape of `schedule` (any that validates; its name is only a label) under `request`.
    pub(super) fn new(request: &'a PlanRequest, schedule: Schedule) -> Result<Self, PlanError> {
        let (p, v, m) = (schedule.ranks, schedule.chunks, schedule.microbatches);
        if p * v > request.costs.layers.len() {
            return Err(PlanError::TooFewLayers {
                layers: request.costs.layers.len(),
                stages: p * v,
            });
        }
        let layout = Layout {
            ranks: p,
            chunks: v,
            placement: schedule.placement,
        };
        let layers = scaled(request, m).layers;
        let problem = Problem::from_layers(&layers, &request.costs.transfer)?;
        let limit = request.memory_limit.map(|bytes| MemoryLimit {
            bytes_per_rank: bytes.floor() as u64,
            in_flight: stage_in_flight(&schedule),
        });
        Ok(Shape {
            schedule,
            layout,
            layers,
            problem,
            limit,
            request,
        })
    }

    /// `M`.
    pub(super) fn microbatches(&self) -> usize {
        self.schedule.microbatches
    }

    /// The schedule's label.
    pub(super) fn label(&self) -> &str {
        &self.schedule.name
    }

    fn model(&self, counts: &[usize]) -> Result<CostModel, PlanError> {
        let mut m = CostModel::from_layers(&self.layers, counts, self.request.costs.transfer)?;
        m.overlap_share = self.request.costs.overlap_share;
        Ok(m)
    }

    /// Simulates a split with stage `s` in recomputation `modes[s]`; `Err(reason)` when it cannot
    /// run or does not fit in memory.
    pub(super) fn evaluate(
        &self,
        part: &Partition,
        name: String,
        modes: &[Recompute],
    ) -> Result<Plan, String> {
        let counts = part.layers_per_stage();
        let model = self.model(&counts).map_err(|e| e.to_string())?;
        let model = with_modes(model, modes);
        let sim = simulate(&self.schedule, &model).map_err(|e| e.to_string())?;
        let peak = peak_memory(&self.schedule, &model, &sim);
        if let Some(limit) = self.request.memory_limit {
            let worst = peak.iter().copied().fold(0.0, f64::max);
            if worst > limit {
                let with = match super::recompute_summary(modes).as_str() {
                    "-" => String::new(),
                    r => format!(" (recompute {r})"),
                };
                return Err(format!(
                    "{name} partition{with}: predicted peak memory {worst:.0} bytes > limit {limit:.0}"
                ));
            }
        }
        let dp = &self.request.data_parallel;
        let reduced = reductions(&self.schedule, &sim.timeline, &model, dp);
        let step_time = dp.step_time(&sim.timeline, &reduced);
        Ok(Plan {
            family: self.label().to_string(),
            chunks: self.layout.chunks,
            microbatches: self.microbatches(),
            microbatch_size: self.request.replica_batch() / self.microbatches(),
            partition: name,
            layers_per_stage: counts,
            step_time,
            ranks: self.schedule.ranks,
            data_parallel: dp.replicas,
            reduce_tail: step_time - sim.timeline.makespan(),
            bubble_fraction: sim.timeline.bubble_fraction(),
            peak_memory: peak,
            recompute: model.stages.iter().map(|st| st.recompute).collect(),
            lower_bound: sim.lower_bound,
            ratio_to_bound: sim.ratio_to_bound(),
            bottleneck: part.bottleneck as f64 / NANOS_PER_SECOND,
            schedule: self.schedule.clone(),
            cost: model,
        })
    }

    /// The split of `method`, simulated with each mode set the request allows; the fastest that
    /// fits, else why none did.
    pub(super) fn evaluate_method(&self, method: Method) -> Result<Plan, String> {
        let part = method
            .apply(&self.problem, &self.layout, None)
            .map_err(|e| format!("{} partition: {e}", method.name()))?;
        let (mut found, why) = self.evaluate_modes(&part, method.name());
        sort(&mut found);
        found.into_iter().next().ok_or_else(|| why.join("; "))
    }

    /// Every mode set the request's [`RecomputeChoice`] allows for a split, simulated: the plans
    /// that fit, and why the others did not (module `recompute`).
    fn evaluate_modes(&self, part: &Partition, name: &str) -> (Vec<Plan>, Vec<String>) {
        let (mut found, mut why) = (Vec::new(), Vec::new());
        let model = match self.model(&part.layers_per_stage()) {
            Ok(m) => m,
            Err(e) => return (found, vec![format!("{name} partition: {e}")]),
        };
        let sets = uniform_sets(self.request.recompute, &model);
        let mut fits = Vec::new();
        for modes in &sets {
            match self.evaluate(part, name.to_string(), modes) {
                // Auto: where this split and schedule fit without recomputation, recomputing
                // would only make them slower (so it never wins a near-tie either).
                Ok(p) if self.request.recompute == RecomputeChoice::Auto && fits.is_empty() => {
                    return (vec![p], why);
                }
                Ok(p) => {
                    found.push(p);
                    fits.push(true);
                }
                Err(e) => {
                    why.push(e);
                    fits.push(false);
                }
            }
        }
        // Auto: where none fits but recomputing everywhere does, the fewest and cheapest steps
        // that make it fit.
        if let (RecomputeChoice::Auto, Some(limit), [false, rest @ ..]) = (
            self.request.recompute,
            self.request.memory_limit,
            fits.as_slice(),
        ) {
            let greedy = rest
                .contains(&true)
                .then(|| fit_recompute(&self.schedule, &model, limit).ok().flatten())
                .flatten();
            if let Some(modes) = greedy.filter(|m| !sets.contains(m)) {
                match self.evaluate(part, name.to_string(), &modes) {
                    Ok(p) => found.push(p),
                    Err(e) => why.push(e),
                }
            }
        }
        (found, why)
    }

    /// Simulates every partition method on this shape: the plans, and why the others were ruled
    /// out.
    pub(super) fn candidates(&self) -> (Vec<Plan>, Vec<String>) {
        let mut found = Vec::new();
        let mut why = Vec::new();
        let mut tried: Vec<Vec<usize>> = Vec::new();
        let mut try_split = |result: Result<Partition, String>, name: &str| match result {
            Ok(part) if tried.contains(&part.boundaries) => {}
            Ok(part) => {
                tried.push(part.boundaries.clone());
                let (plans, reasons) = self.evaluate_modes(&part, name);
                found.extend(plans);
                why.extend(reasons);
            }
            Err(e) => why.push(format!("{name} partition: {e}")),
        };
        for method in Method::ALL {
            // Baselines do not know the limit; the simulator's memory check rules them out.
            let result = if method == Method::Optimal {
                optimal_with_budget(
                    &self.problem,
                    &self.layout,
                    self.limit.as_ref(),
                    PLAN_NODE_BUDGET,
                )
            } else {
                method.apply(&self.problem, &self.layout, None)
            };
            try_split(result.map_err(|e| e.to_string()), method.name());
        }
        if self.request.recompute != RecomputeChoice::None && self.limit.is_some() {
            // The limit the partitioner knows counts whole stashes: with recomputation the
            // unlimited optimum may fit too.
            let result = optimal_with_budget(&self.problem, &self.layout, None, PLAN_NODE_BUDGET);
            try_split(result.map_err(|e| e.to_string()), Method::Optimal.name());
        }
        if self.layout.chunks > 1 {
            if let Ok(part) = per_stage_optimal(&self.problem, &self.layout) {
                try_split(Ok(part), "per-stage-optimal");
            }
        }
        (found, why)
    }

    /// Moves one boundary by one layer at a time while the simulated step time improves.
    pub(super) fn refine(&self, start: &Plan) -> Plan {
        let mut best = start.clone();
        let mut bounds = Partition::boundaries_from_counts(&best.layers_per_stage);
        let name = refined_name(&start.partition);
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
                    if let Ok(p) = self.evaluate(&part, name.clone(), &start.recompute) {
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

    /// The best of this shape's candidates, refined; `NoPlan` (with the reasons) when none fits.
    pub(super) fn best(&self) -> Result<Plan, PlanError> {
        let (mut found, why) = self.candidates();
        sort(&mut found);
        let Some(first) = found.first() else {
            return Err(PlanError::NoPlan {
                skipped: why
                    .into_iter()
                    .map(|reason| super::Skipped::of(&self.schedule, reason))
                    .collect(),
            });
        };
        let refined = self.refine(first);
        Ok(if refined.step_time < first.step_time {
            refined
        } else {
            first.clone()
        })
    }
}

/// The request's costs scaled to the microbatch size of `m` microbatches per replica.
pub(super) fn scaled(request: &PlanRequest, m: usize) -> CostFile {
    let factor = (request.replica_batch() / m.max(1)) as f64 / request.cost_batch;
    CostFile {
        layers: request
            .costs
            .layers
            .iter()
            .map(|l| l.scaled(factor))
            .collect(),
        ..request.costs.clone()
    }
}

fn refined_name(name: &str) -> String {
    if name.ends_with("+refined") {
        name.to_string()
    } else {
        format!("{name}+refined")
    }
}

/// Best first: step time (equal within a relative 1e-9), then fewer recomputing stages, then fewer
/// microbatches (larger ones run more efficiently than the linear cost scaling predicts), then the
/// largest peak memory, then the schedule's name, V and partition name.
pub(super) fn sort(plans: &mut [Plan]) {
    plans.sort_by(|a, b| {
        let mem = |p: &Plan| p.peak_memory.iter().copied().fold(0.0, f64::max);
        let tie = (a.step_time - b.step_time).abs() <= 1e-9 * a.step_time.max(b.step_time);
        let by_time = if tie {
            std::cmp::Ordering::Equal
        } else {
            a.step_time.total_cmp(&b.step_time)
        };
        let recomputing = |p: &Plan| {
            p.recompute
                .iter()
                .filter(|&&m| m != Recompute::None)
                .count()
        };
        by_time
            .then(recomputing(a).cmp(&recomputing(b)))
            .then(a.microbatches.cmp(&b.microbatches))
            .then(mem(a).total_cmp(&mem(b)))
            .then(a.family.cmp(&b.family))
            .then(a.chunks.cmp(&b.chunks))
            .then(a.partition.cmp(&b.partition))
    });
}

/// At one rank every family runs the same actions (all of a microbatch's stages on one rank, one
/// after another), so listing them all says nothing: of the plans of each batch shape (replicas,
/// microbatch count and size) only the first of `plans` (sorted best first) is kept.
pub(super) fn one_per_shape_at_one_rank(plans: &mut Vec<Plan>) {
    let mut seen = std::collections::HashSet::new();
    plans.retain(|p| {
        p.ranks != 1 || seen.insert((p.data_parallel, p.microbatches, p.microbatch_size))
    });
}
