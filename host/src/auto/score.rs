//! Scoring a candidate with the simulator: its objective, and whether it keeps every rank under
//! its budget by the simulator's own memory accounting.

use crate::schedule::{Action, Item, Schedule};
pub(crate) use crate::sim::Checks;
use crate::sim::{summarize_unbounded, summarize_with_spans, SimError};

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

/// Per rank, the most activation memory its list holds by the instance's own accounting, the one
/// the constructive phases keep (in the instance's unit): an item allocates when it starts (`F`
/// what its stage keeps, `I` what it rebuilds), and after it the rank holds [`Instance::delta_of`]
/// more. Memory depends only on the order within a rank, so this is the simulator's peak without
/// simulating.
pub(crate) fn held_peaks(inst: &Instance, schedule: &Schedule) -> Vec<f64> {
    schedule
        .actions
        .iter()
        .map(|list| {
            let (mut now, mut peak) = (0.0_f64, 0.0_f64);
            for item in list {
                let start: f64 = item
                    .actions()
                    .map(|a| inst.foot[a.stage].allocated_by(a.op))
                    .sum();
                peak = peak.max(now + start);
                now += item
                    .actions()
                    .map(|a| inst.delta_of(a.op, a.stage))
                    .sum::<f64>();
            }
            peak
        })
        .collect()
}

/// Whether each rank's list keeps its activations within the budget ([`held_peaks`]).
pub(crate) fn fits_budget(inst: &Instance, schedule: &Schedule) -> bool {
    within_budget(inst, &held_peaks(inst, schedule))
}

/// Simulates `schedule` under the instance's costs: `Ok(None)` when it exceeds a budget.
pub(crate) fn score(
    inst: &Instance,
    objective: Objective,
    schedule: Schedule,
) -> Result<Option<Scored>, SimError> {
    score_with(inst, objective, schedule, Checks::Full)
}

/// [`score`] after the `checks` asked for: [`Checks::Reordered`] for a move's result, whose lists
/// reorder, each within its rank, those of a scored schedule (the simulator skips the static
/// checks, which could find nothing the run does not).
pub(crate) fn score_with(
    inst: &Instance,
    objective: Objective,
    schedule: Schedule,
    checks: Checks,
) -> Result<Option<Scored>, SimError> {
    let (value, makespan, peak, worst) = match objective {
        Objective::Makespan => {
            let s = summarize_unbounded(&schedule, &inst.scoring, checks)?;
            (s.makespan, s.makespan, s.peak_activations, None)
        }
        Objective::Span => {
            let (s, spans) = summarize_with_spans(&schedule, &inst.scoring, checks)?;
            let (mut span, mut worst) = (0.0, 0);
            for (r, &rank_span) in spans.iter().enumerate() {
                if rank_span > span {
                    (span, worst) = (rank_span, r);
                }
            }
            (span, s.makespan, s.peak_activations, Some(worst))
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

/// The best candidate by the objective (`None` until one is offered), with a tag (its origin,
/// where the caller keeps one).
#[derive(Debug, Clone)]
pub(crate) struct Best<T = ()> {
    /// The least objective.
    pub(crate) value: Option<(Scored, T)>,
}

impl<T> Default for Best<T> {
    fn default() -> Self {
        Best { value: None }
    }
}

impl<T> Best<T> {
    /// Keeps `s` (tagged `tag`) where it beats what is kept.
    pub(crate) fn offer(&mut self, s: Scored, tag: T) {
        if self.value.as_ref().is_none_or(|(b, _)| s.value < b.value) {
            self.value = Some((s, tag));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::{AutoRequest, MemoryLimit, Objective};
    use crate::cost::{CostModel, LinkCost, Recompute, StageCost};
    use crate::schedule::{Op, Params};

    /// Four stages of uneven cost; each keeps 10 bytes (4 past `I`), its input 1 byte.
    fn costs(mode: Recompute) -> CostModel {
        let mut c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
        for (x, st) in c.stages.iter_mut().enumerate() {
            st.forward = 1.0 + 0.25 * x as f64;
            st.activation_bytes = 10.0;
            st.released_at_input = 6.0;
            st.input_bytes = 1.0;
            st.recompute = mode;
        }
        c
    }

    fn solved(mode: Recompute, limit: f64) -> (Instance, Scored) {
        let req = AutoRequest::new(4, 8, costs(mode))
            .with_limit(MemoryLimit::Bytes(limit))
            .with_budget(0.05, 1);
        let inst = Instance::new(&req).unwrap();
        let out = crate::auto::solve(&req).unwrap();
        let scored = score(&inst, Objective::Makespan, out.schedule)
            .unwrap()
            .unwrap();
        (inst, scored)
    }

    #[test]
    fn own_accounting_is_the_simulators_peak_with_recomputation() {
        for mode in [Recompute::None, Recompute::Full] {
            let (inst, s) = solved(mode, 25.0);
            assert_eq!(held_peaks(&inst, &s.schedule), s.peak, "{mode}");
            assert!(s.peak.iter().all(|&p| p <= 25.0), "{mode}: {:?}", s.peak);
            // The families too (fused B, deferred W), under the same costs.
            for name in ["1f1b", "zb-h1", "zb-h2", "gpipe"] {
                let f = crate::schedule::families::generate(name, &Params::new(4, 8)).unwrap();
                let sim = crate::sim::summarize(&f, &inst.scoring).unwrap();
                assert_eq!(held_peaks(&inst, &f), sim.peak_activations, "{mode} {name}");
            }
        }
    }

    /// The most forwards on one rank whose `I` has not run yet.
    fn awaiting_backward(s: &Schedule) -> i64 {
        let mut most = 0;
        for list in &s.actions {
            let mut open = 0i64;
            for a in list.iter().flat_map(|i| i.actions()) {
                open += match a.op {
                    Op::F => 1,
                    Op::I | Op::B => -1,
                    Op::W => 0,
                };
                most = most.max(open);
            }
        }
        most
    }

    #[test]
    fn recomputation_keeps_more_microbatches_in_flight_under_the_same_limit() {
        // 25 bytes hold two whole stashes; inputs of one byte leave room for more.
        assert!(awaiting_backward(&solved(Recompute::None, 25.0).1.schedule) <= 2);
        assert!(awaiting_backward(&solved(Recompute::Full, 25.0).1.schedule) > 2);
    }

    #[test]
    fn the_constructive_phases_use_the_freed_memory_and_keep_the_limit() {
        let (inst, _) = solved(Recompute::Full, 25.0);
        let lists: Vec<_> = crate::auto::list::Rule::standard(&inst)
            .iter()
            .filter_map(|r| crate::auto::list::build(&inst, r))
            .chain(
                crate::auto::greedy::Flags::all()
                    .into_iter()
                    .filter_map(|f| crate::auto::greedy::build(&inst, f)),
            )
            .collect();
        assert!(!lists.is_empty());
        let mut most = 0;
        for orders in &lists {
            let s = schedule_of(&inst, "built", orders);
            assert!(fits_budget(&inst, &s), "{:?}", held_peaks(&inst, &s));
            most = most.max(awaiting_backward(&s));
        }
        assert!(most > 2, "{most}");
    }
}
