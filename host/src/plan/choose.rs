//! Choosing the plan to run among the candidates, and scoring them for ranks that share one device
//! (the rule is described in [the planner's docs](crate::plan#choosing-among-near-equal-plans)).

use serde::{Deserialize, Serialize};

use crate::cost::{CostFile, CostModel, LinkCost, StageCost};
use crate::schedule::families::FAMILIES;
use crate::schedule::validate::check_static;
use crate::sim::{simulate, simulate_with, DeviceSharing, SimError, SimOptions};
use crate::timeline::Timeline;

use super::Plan;

/// The narrowest near-tie window: predictions within 2% of each other are a tie even when the
/// profile measured less spread (a quiet machine still moves F:I:W ratios by that much between runs).
pub const MIN_TIE: f64 = 0.02;

/// The widest near-tie window: a plan predicted more than 10% faster than every other always wins,
/// however noisy the profile.
pub const MAX_TIE: f64 = 0.10;

/// The near-tie rule, as outputs state it.
pub const NEAR_TIE_RULE: &str = "a handcrafted family before auto (whose schedule follows the \
                                 measured costs), then the fastest on even costs (every stage's \
                                 F = I = W, free transfers), then the fewest samples in flight per \
                                 rank, then the simplest family, then the fewest microbatches, \
                                 then the fewest chunks";

/// The key under which a cost file's `meta` records the profile's measured spread
/// ([`relative_spread`]).
pub const SPREAD_KEY: &str = "spread";

/// The candidates a run chooses from (best predicted first) and the relative spread of the
/// measurements they were predicted from (0 when unknown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidates {
    /// The plans, best predicted first.
    pub plans: Vec<Plan>,
    /// The profile's measured spread ([`relative_spread`]).
    pub spread: f64,
}

/// A near-tie among the candidates, as [`choose`] decided it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NearTie {
    /// Candidates predicted within the window of the fastest, the chosen one among them.
    pub candidates: usize,
    /// The window: relative to the fastest prediction ([`tie_window`] of `spread`).
    pub window: f64,
    /// The profile's measured spread the window came from.
    pub spread: f64,
    /// The fastest prediction's schedule.
    pub fastest: String,
    /// The rule that decided ([`NEAR_TIE_RULE`]).
    pub rule: String,
}

/// The plan [`choose`] picked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// Its index in the plans.
    pub index: usize,
    /// The near-tie it decided, when more than one plan was within the window.
    pub near_tie: Option<NearTie>,
}

/// The near-tie window for a profile's measured relative `spread`: the spread, kept within
/// [`MIN_TIE`] and [`MAX_TIE`] (the widest for a spread that is not a number).
pub fn tie_window(spread: f64) -> f64 {
    if spread.is_nan() {
        return MAX_TIE;
    }
    spread.clamp(MIN_TIE, MAX_TIE)
}

/// The relative spread of measurements of equal work: `groups` holds, per quantity measured
/// several times (one time field of layers of one shape, say), its measurements. Per group of two
/// or more, `(max - min) / median`; the groups' spreads averaged, weighted by their medians (so the
/// quantities that weigh most in a step count most). 0 when no group has two positive measurements.
///
/// ```
/// use pipefill_host::plan::relative_spread;
/// let s = relative_spread(&[vec![1.0, 1.1, 0.9], vec![3.0, 3.0], vec![7.0]]);
/// assert!((s - 0.2 / 4.0).abs() < 1e-12); // (0.2 x 1 + 0 x 3) / (1 + 3); a lone 7 says nothing
/// ```
pub fn relative_spread(groups: &[Vec<f64>]) -> f64 {
    let (mut sum, mut weight) = (0.0, 0.0);
    for g in groups {
        let mut v: Vec<f64> = g.iter().copied().filter(|t| t.is_finite()).collect();
        if v.len() < 2 {
            continue;
        }
        v.sort_by(f64::total_cmp);
        let median = v[v.len() / 2];
        if median > 0.0 {
            sum += v[v.len() - 1] - v[0];
            weight += median;
        }
    }
    if weight > 0.0 {
        sum / weight
    } else {
        0.0
    }
}

/// The spread recorded in `costs.meta` ([`SPREAD_KEY`]), if any.
pub fn recorded_spread(costs: &CostFile) -> Option<f64> {
    costs.meta.get(SPREAD_KEY).and_then(|v| v.as_f64())
}

/// The most samples `plan`'s schedule holds in flight on a rank: microbatches in flight (each of
/// `V` chunks counts `1/V`) times the microbatch size. Its activation memory in units of one
/// rank's share of a sample, from the schedule and the batch alone (no measured time).
fn in_flight(plan: &Plan) -> f64 {
    let peak = check_static(&plan.schedule)
        .map(|p| p.into_iter().max().unwrap_or(0) as f64)
        .unwrap_or(f64::INFINITY);
    peak / plan.chunks.max(1) as f64 * plan.microbatch_size.max(1) as f64
}

/// `plan`'s step on even costs: every stage's `F = I = W` (one unit of work per sample spread over
/// the `P x V` stages, times the microbatch size), free transfers, the plan's overlap share. A
/// property of the schedule and the batch alone (no measured time); infinite when it does not
/// simulate.
fn even_step(plan: &Plan) -> f64 {
    let stages = plan.schedule.stages().max(1);
    let t = plan.microbatch_size.max(1) as f64 / stages as f64;
    let mut costs = CostModel::uniform(StageCost::uniform(t, t, t), stages, LinkCost::default());
    costs.overlap_share = plan.cost.overlap_share;
    simulate(&plan.schedule, &costs).map_or(f64::INFINITY, |s| s.timeline.makespan())
}

/// `a` and `b` ordered, equal within a relative `1e-9` (rounding in the simulation).
fn close_cmp(a: f64, b: f64) -> std::cmp::Ordering {
    if (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) {
        std::cmp::Ordering::Equal
    } else {
        a.total_cmp(&b)
    }
}

/// The plan to run among `plans` predicted from a profile of measured relative `spread`: the
/// fastest, unless others are predicted within [`tie_window`]`(spread)` of it; then the near-tie is
/// decided by [`NEAR_TIE_RULE`], which reads the schedules' shapes and the batch only, never a
/// measured time (see [the planner's docs](crate::plan#choosing-among-near-equal-plans)). `None`
/// when there is no plan.
pub fn choose(plans: &[Plan], spread: f64) -> Option<Choice> {
    let fastest = (0..plans.len()).min_by(|&a, &b| {
        plans[a]
            .step_time
            .total_cmp(&plans[b].step_time)
            .then(a.cmp(&b))
    })?;
    let window = tie_window(spread);
    let best = plans[fastest].step_time;
    let tied: Vec<usize> = (0..plans.len())
        .filter(|&i| plans[i].step_time <= best * (1.0 + window))
        .collect();
    if tied.len() < 2 {
        return Some(Choice {
            index: fastest,
            near_tie: None,
        });
    }
    let order = |family: &str| {
        FAMILIES
            .iter()
            .position(|f| f.name == family)
            .unwrap_or(FAMILIES.len())
    };
    let index = tied.iter().copied().min_by(|&a, &b| {
        let (x, y) = (&plans[a], &plans[b]);
        let solved = |p: &Plan| order(&p.family) == FAMILIES.len();
        solved(x)
            .cmp(&solved(y))
            .then(close_cmp(even_step(x), even_step(y)))
            .then(in_flight(x).total_cmp(&in_flight(y)))
            .then(order(&x.family).cmp(&order(&y.family)))
            .then(x.family.cmp(&y.family))
            .then(x.microbatches.cmp(&y.microbatches))
            .then(x.chunks.cmp(&y.chunks))
            .then(x.step_time.total_cmp(&y.step_time))
    })?;
    Some(Choice {
        index,
        near_tie: Some(NearTie {
            candidates: tied.len(),
            window,
            spread,
            fastest: plans[fastest].family.clone(),
            rule: NEAR_TIE_RULE.to_string(),
        }),
    })
}

impl Plan {
    /// The plan's schedule simulated with every rank on one device (concurrent actions share it by
    /// the costs' overlap share: [`DeviceSharing::Shared`]).
    pub fn shared_timeline(&self) -> Result<Timeline, SimError> {
        let options = SimOptions::ALL.on(DeviceSharing::Shared);
        simulate_with(&self.schedule, &self.cost, options).map(|s| s.timeline)
    }

    /// The timeline the plan's `step_time` predicts: the shared-device one for a plan re-scored by
    /// [`on_one_device`], else [`Plan::timeline`].
    pub fn predicted(&self) -> Result<Timeline, SimError> {
        match self.shared_timeline() {
            Ok(t) if self.step_time == t.makespan() => Ok(t),
            _ => self.timeline(),
        }
    }
}

/// Re-scores `plans` for ranks that all sit on one device: step time and bubble from the
/// shared-device simulation ([`Plan::shared_timeline`]), best first (a plan that mode does not take
/// keeps its per-rank numbers and goes last).
pub fn on_one_device(plans: Vec<Plan>) -> Vec<Plan> {
    let mut scored: Vec<(bool, Plan)> = plans
        .into_iter()
        .map(|mut p| match p.shared_timeline() {
            Ok(t) => {
                p.step_time = t.makespan();
                p.bubble_fraction = t.bubble_fraction();
                (true, p)
            }
            Err(_) => (false, p),
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.step_time.total_cmp(&b.1.step_time)));
    scored.into_iter().map(|(_, p)| p).collect()
}
