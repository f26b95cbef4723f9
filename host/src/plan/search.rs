//! One shape (schedule, `V`, `M`, scaled costs) and its candidate partitions: simulated, ruled out by
//! memory, refined by boundary moves, and sorted best first.

use crate::cost::{CostFile, CostModel, LayerCost, Recompute, RecomputeChoice};
use crate::partition::{
    optimal_with_budget, per_stage_optimal, Layout, MemoryLimit, Method, Partition, Problem,
    NANOS_PER_SECOND,
};
use crate::schedule::Schedule;
use crate::sim::data_parallel::reductions;
use crate::sim::simulate;

use super::recompute::{
    fit_recompute, peak_memory, uniform_sets, uniform_sets_before_split, with_modes,
};
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
        let limit = request
            .memory_limit
            .map(|bytes| MemoryLimit::of_schedule(bytes.floor() as u64, &schedule));
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
        let (mut found, why) = self.evaluate_modes(&part, method.name(), None);
        sort(&mut found);
        found.into_iter().next().ok_or_else(|| why.join("; "))
    }

    /// Every mode set the request's [`RecomputeChoice`] allows for a split (and `also`, the set the
    /// split was partitioned for), simulated: the plans that fit, and why the others did not
    /// (module `recompute`).
    fn evaluate_modes(
        &self,
        part: &Partition,
        name: &str,
        also: Option<&[Recompute]>,
    ) -> (Vec<Plan>, Vec<String>) {
        let (mut found, mut why) = (Vec::new(), Vec::new());
        let model = match self.model(&part.layers_per_stage()) {
            Ok(m) => m,
            Err(e) => return (found, vec![format!("{name} partition: {e}")]),
        };
        let sets = uniform_sets(self.request.recompute, &model);
        if let Some(modes) = also.filter(|m| !sets.iter().any(|u| u == m)) {
            match self.evaluate(part, name.to_string(), modes) {
                Ok(p) => found.push(p),
                Err(e) => why.push(e),
            }
        }
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
            let new = |m: &Vec<Recompute>| !sets.contains(m) && Some(m.as_slice()) != also;
            if let Some(modes) = greedy.filter(new) {
                match self.evaluate(part, name.to_string(), &modes) {
                    Ok(p) => found.push(p),
                    Err(e) => why.push(e),
                }
            }
        }
        (found, why)
    }

    /// The optimal split with stage `s` in mode `modes[s]`: its times and its memory under the
    /// limit count what that mode runs and keeps (the simulator's count).
    fn optimal_for(&self, modes: &[Recompute]) -> Result<Partition, String> {
        let problem = self.problem.clone().with_recompute(modes);
        optimal_with_budget(
            &problem,
            &self.layout,
            self.limit.as_ref(),
            PLAN_NODE_BUDGET,
        )
        .map_err(|e| e.to_string())
    }

    /// Simulates every partition method on this shape: the plans, and why the others were ruled
    /// out. The optimal split is asked for each mode set the request allows; with
    /// [`RecomputeChoice::Auto`] also for each per-stage set [`fit_recompute`] chose on a split
    /// (so a split that fits only because its heavy stages recompute is found directly), until
    /// no new split appears.
    pub(super) fn candidates(&self) -> (Vec<Plan>, Vec<String>) {
        let mut c = Candidates::default();
        // Before a split, "selective where declared" is selective everywhere: the partitioner's
        // stages without a selective part run without recomputation.
        let stages = self.schedule.stages();
        let whole = (self.request.costs.layers.iter()).any(|l| l.selective_bytes > 0.0);
        for modes in uniform_sets_before_split(self.request.recompute, stages, whole) {
            c.add(self, self.optimal_for(&modes), Method::Optimal.name(), None);
        }
        for method in Method::ALL.into_iter().filter(|&m| m != Method::Optimal) {
            // Baselines do not know the limit; the simulator's memory check rules them out.
            let result = method.apply(&self.problem, &self.layout, None);
            c.add(self, result.map_err(|e| e.to_string()), method.name(), None);
        }
        if self.layout.chunks > 1 {
            if let Ok(part) = per_stage_optimal(&self.problem, &self.layout) {
                c.add(self, Ok(part), "per-stage-optimal", None);
            }
        }
        let mut asked: Vec<Vec<Recompute>> = Vec::new();
        while self.limit.is_some() {
            let mixed = |m: &&Vec<Recompute>| {
                m.contains(&Recompute::None) && m.iter().any(|&x| x != Recompute::None)
            };
            let next = (c.plans.iter().map(|p| &p.recompute))
                .filter(mixed)
                .find(|m| !asked.contains(m))
                .cloned();
            let Some(modes) = next else {
                break;
            };
            c.add(
                self,
                self.optimal_for(&modes),
                Method::Optimal.name(),
                Some(&modes),
            );
            asked.push(modes);
        }
        (c.plans, c.why)
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

/// The plans of a shape's splits so far, why others were ruled out, and the splits tried.
#[derive(Default)]
struct Candidates {
    plans: Vec<Plan>,
    why: Vec<String>,
    tried: Vec<Vec<usize>>,
}

impl Candidates {
    /// Simulates `result`'s split (once per split) with the mode sets the request allows and `also`.
    fn add(
        &mut self,
        shape: &Shape,
        result: Result<Partition, String>,
        name: &str,
        also: Option<&[Recompute]>,
    ) {
        match result {
            Ok(part) if self.tried.contains(&part.boundaries) => {
                // Tried with the request's sets, not necessarily with `also`.
                let counts = part.layers_per_stage();
                let done = |m: &[Recompute]| {
                    (self.plans.iter()).any(|p| p.layers_per_stage == counts && p.recompute == m)
                };
                if let Some(modes) = also.filter(|m| !done(m)) {
                    match shape.evaluate(&part, name.to_string(), modes) {
                        Ok(p) => self.plans.push(p),
                        Err(e) => self.why.push(e),
                    }
                }
            }
            Ok(part) => {
                self.tried.push(part.boundaries.clone());
                let (plans, reasons) = shape.evaluate_modes(&part, name, also);
                self.plans.extend(plans);
                self.why.extend(reasons);
            }
            Err(e) => self.why.push(format!("{name} partition: {e}")),
        }
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

/// Best first: step time, then, among plans whose times are equal within a relative 1e-9 of the
/// shortest of their run, fewer recomputing stages, then fewer microbatches (larger ones run more
/// efficiently than the linear cost scaling predicts), then the largest peak memory, then the
/// schedule's name, V and partition name.
///
/// The near-ties are runs of the plans sorted by time, each run starting at its first plan, not a
/// pairwise "within 1e-9" test: that relation is not transitive (a ~ b and b ~ c with a < c), so a
/// comparator built on it is no total order, and the standard sort may panic on one.
pub(super) fn sort(plans: &mut [Plan]) {
    plans.sort_by(|a, b| a.step_time.total_cmp(&b.step_time));
    let mem = |p: &Plan| p.peak_memory.iter().copied().fold(0.0, f64::max);
    let recomputing = |p: &Plan| {
        p.recompute
            .iter()
            .filter(|&&m| m != Recompute::None)
            .count()
    };
    let mut start = 0;
    while start < plans.len() {
        let first = plans[start].step_time;
        let run = plans[start..]
            .iter()
            .take_while(|p| (p.step_time - first).abs() <= 1e-9 * p.step_time.max(first))
            .count()
            .max(1);
        plans[start..start + run].sort_by(|a, b| {
            recomputing(a)
                .cmp(&recomputing(b))
                .then(a.microbatches.cmp(&b.microbatches))
                .then(mem(a).total_cmp(&mem(b)))
                .then(a.family.cmp(&b.family))
                .then(a.chunks.cmp(&b.chunks))
                .then(a.partition.cmp(&b.partition))
        });
        start += run;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{LinkCost, StageCost};
    use crate::schedule::{families, Params};

    fn plan(family: &str, step_time: f64) -> Plan {
        let link = LinkCost {
            latency: 0.0,
            bandwidth: f64::INFINITY,
        };
        Plan {
            family: family.to_string(),
            chunks: 1,
            microbatches: 1,
            microbatch_size: 1,
            partition: "even".to_string(),
            layers_per_stage: vec![1],
            step_time,
            ranks: 1,
            data_parallel: 1,
            reduce_tail: 0.0,
            bubble_fraction: 0.0,
            peak_memory: vec![0.0],
            recompute: Vec::new(),
            lower_bound: step_time,
            ratio_to_bound: 1.0,
            bottleneck: step_time,
            schedule: families::generate("1f1b", &Params::new(1, 1)).unwrap(),
            cost: CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 1, link),
        }
    }

    /// Times 0.6e-9 apart: `a ~ b` and `b ~ c` within 1e-9 but not `a ~ c`. The ties are runs from
    /// the shortest time, so the order is total: `b` (1), `c` (1 + 0.6e-9) tie and go by name, `a`
    /// (1 + 1.2e-9) comes after both, whichever order they came in; a long list of such chains
    /// sorts to one order from any input order (no order-violation panic of the standard sort).
    #[test]
    fn near_ties_are_runs_from_the_shortest_time() {
        let t = [1.0 + 1.2e-9, 1.0, 1.0 + 0.6e-9];
        for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2], [2, 0, 1]] {
            let mut plans: Vec<Plan> = order
                .iter()
                .map(|&i| plan(["a", "b", "c"][i], t[i]))
                .collect();
            sort(&mut plans);
            let names: Vec<&str> = plans.iter().map(|p| p.family.as_str()).collect();
            assert_eq!(names, ["b", "c", "a"], "from {order:?}");
        }
        // Distinct names: a total order gives one result whatever the input order.
        let many: Vec<Plan> = (0..200)
            .map(|i| {
                plan(
                    &format!("{:03}", (i * 7919) % 200),
                    1.0 + (i % 50) as f64 * 0.6e-9,
                )
            })
            .collect();
        let names = |mut v: Vec<Plan>| {
            sort(&mut v);
            v.into_iter().map(|p| p.family).collect::<Vec<_>>()
        };
        let reversed = many.iter().rev().cloned().collect();
        assert_eq!(names(many), names(reversed));
    }
}
