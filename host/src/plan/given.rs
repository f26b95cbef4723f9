//! Plans for schedules that are given rather than searched: a schedule file, or one schedule per
//! family for fixed `P`, `V` and `M` (what `pipefill train` scores).
//!
//! Any schedule that validates can be planned: its name is a label, never a key that decides what is
//! allowed. The costs are taken as measured at the schedule's own microbatch size (they are not
//! rescaled; the plans' `microbatch_size` is 1, that size).

use serde::{Deserialize, Serialize};

use crate::auto::AutoOptions;
use crate::cost::{CostFile, RecomputeChoice};
use crate::partition::Method;
use crate::schedule::validate::validate;
use crate::schedule::{Params, Schedule};
use crate::sim::data_parallel::DataParallel;

use super::search::{sort, Shape};
use super::{check, Plan, PlanError, PlanReport, PlanRequest, Skipped};

/// How a given schedule's stages get their layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// The partition with the lowest simulated step time ([`best_partition`]).
    #[default]
    Best,
    /// Equal layer counts (the `uniform` partition method).
    Uniform,
}

/// The request that scores `schedule` under `costs` as measured at its own microbatch size.
fn request_for(
    costs: &CostFile,
    schedule: &Schedule,
    memory_limit: Option<f64>,
    data_parallel: DataParallel,
    recompute: RecomputeChoice,
) -> Result<PlanRequest, PlanError> {
    // One sample a microbatch on each of the D replicas: the costs stay as measured.
    let replicas = data_parallel.replicas.max(1);
    let mut request = PlanRequest::new(
        costs.clone(),
        1.0,
        schedule.ranks,
        schedule.microbatches.saturating_mul(replicas),
    );
    request.memory_limit = memory_limit;
    request.data_parallel = data_parallel;
    request.recompute = recompute;
    check(&request)?;
    Ok(request)
}

/// The best partition for `schedule` (any schedule: its name is only a label), with costs measured
/// at the schedule's microbatch size: every partition method simulated, the best refined by boundary
/// moves. The schedule is simulated as it is; [`plan_schedule`] validates it first.
///
/// ```
/// use pipefill_host::cost::{CostFile, LayerCost, LinkCost};
/// use pipefill_host::plan::best_partition;
/// use pipefill_host::schedule::{families, Params};
/// let layers = (0..6).map(|i| LayerCost::new(format!("l{i}"), 1.0 + i as f64, 1.0, 1.0)).collect();
/// let costs = CostFile { layers, transfer: LinkCost::default(), overlap_share: 0.0,
///                        meta: serde_json::Value::Null };
/// let mut s = families::generate("1f1b", &Params::new(2, 4))?;
/// s.name = "mine".into(); // a renamed schedule plans as well
/// let plan = best_partition(&costs, &s, None)?;
/// assert_eq!(plan.family, "mine");
/// assert_eq!(plan.layers_per_stage.iter().sum::<usize>(), 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn best_partition(
    costs: &CostFile,
    schedule: &Schedule,
    memory_limit: Option<f64>,
) -> Result<Plan, PlanError> {
    best_partition_replicated(costs, schedule, memory_limit, DataParallel::NONE)
}

/// [`best_partition`] for a pipeline run as `data_parallel.replicas` replicas: each candidate split
/// is scored with its stages' all-reduces over `data_parallel.link`, as the planner scores the
/// families (so a schedule from another source, `auto` among them, ranks against them alike).
pub fn best_partition_replicated(
    costs: &CostFile,
    schedule: &Schedule,
    memory_limit: Option<f64>,
    data_parallel: DataParallel,
) -> Result<Plan, PlanError> {
    let request = request_for(
        costs,
        schedule,
        memory_limit,
        data_parallel,
        RecomputeChoice::None,
    )?;
    Shape::new(&request, schedule.clone())?.best()
}

/// Scores one given schedule: validates it, splits its layers (`split`) and simulates it under
/// `costs` (measured at the schedule's microbatch size).
pub fn plan_schedule(
    costs: &CostFile,
    schedule: &Schedule,
    split: Split,
    memory_limit: Option<f64>,
) -> Result<Plan, PlanError> {
    plan_schedule_with(costs, schedule, split, memory_limit, RecomputeChoice::None)
}

/// [`plan_schedule`] with the stages' recomputation chosen as `recompute` says (with
/// [`RecomputeChoice::Auto`], per stage under `memory_limit`: module `recompute`).
pub fn plan_schedule_with(
    costs: &CostFile,
    schedule: &Schedule,
    split: Split,
    memory_limit: Option<f64>,
    recompute: RecomputeChoice,
) -> Result<Plan, PlanError> {
    validate(schedule).map_err(|source| PlanError::Schedule {
        name: schedule.name.clone(),
        source,
    })?;
    let request = request_for(costs, schedule, memory_limit, DataParallel::NONE, recompute)?;
    let shape = Shape::new(&request, schedule.clone())?;
    match split {
        Split::Best => shape.best(),
        Split::Uniform => {
            shape
                .evaluate_method(Method::Uniform)
                .map_err(|reason| PlanError::NoPlan {
                    skipped: vec![Skipped::of(schedule, reason)],
                })
        }
    }
}

/// Scores one schedule per family (`families`, or all of [`FAMILIES`](crate::schedule::families::FAMILIES) when
/// empty) generated with `params` (`P`, `M`, and `V` or each family's own), best first; `auto` among
/// the names is solved with the default [`AutoOptions`] ([`plan_given`] takes others). A family
/// that cannot generate, validate or fit these parameters is listed in `skipped`;
/// [`PlanError::NoPlan`] when none can.
pub fn plan_families(
    costs: &CostFile,
    params: &Params,
    families: &[String],
    split: Split,
    memory_limit: Option<f64>,
) -> Result<PlanReport, PlanError> {
    let auto = AutoOptions::default();
    plan_given(
        costs,
        params,
        families,
        split,
        memory_limit,
        &auto,
        RecomputeChoice::None,
    )
}

/// [`plan_families`] with `auto` solved as `auto` says (its `V` when `params` gives none, its
/// placement, objective, budget, seed, and its limit in microbatches when `memory_limit` is
/// `None`): one schedule per name at `P` and `M`, on `costs` as measured at that microbatch size
/// (`auto`'s cut evenly into stages to solve it), each split by `split`, best first. The stages'
/// recomputation is chosen as `recompute` says: the one argument a trainer sets for `--recompute
/// auto --memory-limit` (`auto` among the names is then solved with and without full
/// recomputation, as [`super::plan`] does).
pub fn plan_given(
    costs: &CostFile,
    params: &Params,
    names: &[String],
    split: Split,
    memory_limit: Option<f64>,
    auto: &AutoOptions,
    recompute: RecomputeChoice,
) -> Result<PlanReport, PlanError> {
    let mut plans = Vec::new();
    let mut skipped = Vec::new();
    for source in super::sources(names)? {
        let chunks = params.chunks.unwrap_or(source.default_chunks(auto));
        for mode in super::solve_modes(source, recompute, memory_limit) {
            let attempt = source
                .schedule_with(params, costs, memory_limit, auto, mode)
                .and_then(|s| plan_schedule_with(costs, &s, split, memory_limit, recompute));
            match attempt {
                Ok(p) => plans.push(p),
                Err(e) => skipped.push(Skipped {
                    family: source.name().to_string(),
                    chunks,
                    microbatches: params.microbatches,
                    reason: e.to_string(),
                }),
            }
        }
    }
    if plans.is_empty() {
        return Err(PlanError::NoPlan { skipped });
    }
    sort(&mut plans);
    Ok(PlanReport { plans, skipped })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{LayerCost, LinkCost};
    use crate::schedule::families;

    fn costs() -> CostFile {
        let layers = (0..8)
            .map(|i| LayerCost::new(format!("l{i}"), if i == 0 { 7.0 } else { 1.0 }, 1.0, 1.0))
            .collect();
        CostFile {
            layers,
            transfer: LinkCost::default(),
            overlap_share: 1.0,
            meta: serde_json::Value::Null,
        }
    }

    #[test]
    fn a_renamed_schedule_plans_like_its_family() {
        let s = families::generate("zb-h1", &Params::new(2, 4)).unwrap();
        let mut renamed = s.clone();
        renamed.name = "mine".into();
        let a = plan_schedule(&costs(), &s, Split::Best, None).unwrap();
        let b = plan_schedule(&costs(), &renamed, Split::Best, None).unwrap();
        assert_eq!(b.family, "mine");
        assert_eq!(a.layers_per_stage, b.layers_per_stage);
        assert_eq!(a.step_time, b.step_time);
        // The heavy first layer gets a stage with fewer layers than the uniform split's.
        let u = plan_schedule(&costs(), &renamed, Split::Uniform, None).unwrap();
        assert_eq!(u.layers_per_stage, vec![4, 4]);
        assert!(
            b.step_time < u.step_time,
            "{} vs {}",
            b.step_time,
            u.step_time
        );
        // The plan carries the costs it was scored with (the file's overlap share included).
        assert_eq!(b.cost.overlap_share, 1.0);
        assert_eq!(b.timeline().unwrap().makespan(), b.step_time);
    }

    #[test]
    fn a_schedule_that_cannot_run_is_refused() {
        let mut s = families::generate("1f1b", &Params::new(2, 2)).unwrap();
        s.actions[1].reverse();
        let e = plan_schedule(&costs(), &s, Split::Best, None).unwrap_err();
        assert!(
            matches!(&e, PlanError::Schedule { name, .. } if name == "1f1b"),
            "{e}"
        );
    }

    #[test]
    fn families_that_do_not_fit_are_skipped_not_fatal() {
        // V = 3 suits the looped interleaved families only (vshape needs V = 2, others V = 1).
        let params = Params::new(2, 4).with_chunks(3);
        let r = plan_families(&costs(), &params, &[], Split::Best, None).unwrap();
        assert!(!r.plans.is_empty() && !r.skipped.is_empty());
        assert!(r.plans.iter().all(|p| p.chunks == 3));
        let e = plan_families(&costs(), &params, &["nope".into()], Split::Best, None);
        assert!(matches!(e, Err(PlanError::UnknownFamily { name, .. }) if name == "nope"));
    }
}
