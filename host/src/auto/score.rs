//! Scoring a candidate with the simulator: its objective, and whether it keeps every rank under
//! its budget by the simulator's own memory accounting.

use crate::schedule::{Action, Item, Schedule};
use crate::sim::{simulate_with, summarize, SimError, SimOptions};

use super::instance::{Instance, MEMORY_EPS};
use super::Objective;

/// A simulated candidate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Scored {
    /// The schedule.
    pub(crate) schedule: Schedule,
    /// Its objective.
    pub(crate) value: f64,
    /// Its makespan.
    pub(crate) makespan: f64,
    /// Per rank, the simulator's peak activation memory (in the instance's unit).
    pub(crate) peak: Vec<f64>,
    /// The rank whose span is the objective (span objective only).
    pub(crate) worst: Option<usize>,
}

/// A schedule of the instance's shape from per-rank action lists.
pub(crate) fn schedule_of(inst: &Instance, name: &str, orders: &[Vec<Action>]) -> Schedule {
    Schedule {
        name: name.to_string(),
        ranks: inst.p,
        chunks: inst.v,
        microbatches: inst.m,
        placement: inst.placement,
        actions: orders
            .iter()
            .map(|l| l.iter().map(|&a| Item::One(a)).collect())
            .collect(),
    }
}

/// Whether each rank's list keeps its activations within the budget (memory depends only on the
/// order within a rank: allocation when an item starts, release when it ends).
pub(crate) fn fits_budget(inst: &Instance, schedule: &Schedule) -> bool {
    schedule.actions.iter().enumerate().all(|(r, list)| {
        let budget = inst.budget[r];
        if budget == f64::INFINITY {
            return true;
        }
        let mut now = 0.0;
        for item in list {
            for a in item.actions() {
                now += inst.foot[a.stage].allocated_by(a.op);
            }
            if now > budget + MEMORY_EPS * now.max(1.0) {
                return false;
            }
            for a in item.actions() {
                now -= inst.foot[a.stage].released_by(a.op);
            }
        }
        true
    })
}

/// Simulates `schedule` under the instance's costs: `Ok(None)` when it exceeds a budget.
pub(crate) fn score(
    inst: &Instance,
    objective: Objective,
    schedule: Schedule,
) -> Result<Option<Scored>, SimError> {
    let (value, makespan, peak, worst) = match objective {
        Objective::Makespan => {
            let s = summarize(&schedule, &inst.scoring)?;
            (s.makespan, s.makespan, s.peak_activations, None)
        }
        Objective::Span => {
            let sim = simulate_with(&schedule, &inst.scoring, SimOptions::SPANS)?;
            let (mut span, mut worst) = (0.0, 0);
            for (r, lane) in sim.timeline.spans.iter().enumerate() {
                if let (Some(a), Some(b)) = (lane.first(), lane.last()) {
                    if b.end - a.start > span {
                        (span, worst) = (b.end - a.start, r);
                    }
                }
            }
            (
                span,
                sim.timeline.makespan(),
                sim.peak_activations,
                Some(worst),
            )
        }
    };
    Ok(within_budget(inst, &peak).then_some(Scored {
        schedule,
        value,
        makespan,
        peak,
        worst,
    }))
}

/// Whether per-rank peaks stay within the instance's budgets.
pub(crate) fn within_budget(inst: &Instance, peak: &[f64]) -> bool {
    peak.iter()
        .zip(&inst.budget)
        .all(|(&p, &b)| p <= b + MEMORY_EPS * p.max(1.0))
}

/// The best of `candidates` (per-rank lists) by `objective` among those the simulator keeps within
/// the instance's budgets; `None` when none does.
pub(crate) fn best_of(
    inst: &Instance,
    objective: Objective,
    candidates: impl IntoIterator<Item = Vec<Vec<Action>>>,
) -> Result<Option<Scored>, SimError> {
    let mut best: Option<Scored> = None;
    for orders in candidates {
        if let Some(s) = score(inst, objective, schedule_of(inst, super::AUTO, &orders))? {
            if best.as_ref().is_none_or(|b| s.value < b.value) {
                best = Some(s);
            }
        }
    }
    Ok(best)
}
