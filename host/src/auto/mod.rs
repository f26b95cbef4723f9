//! The automatic scheduler (family name `auto`): a schedule for measured, uneven per-stage costs,
//! transfer times and a memory limit per rank, that minimises the step's makespan (or the longest
//! per-rank span) as the simulator predicts it.
//!
//! [`solve`] runs, in order:
//!
//! 1. **seeds**: every handcrafted family of the same `V` and placement that fits the limit
//!    ([`FamilyResult`]); `auto` never returns anything worse than the best of them;
//! 2. **constructive**: on `V = 1`, the zero-bubble authors' one-pass greedy heuristic in its eight
//!    variants (module `greedy`, origin `zb-greedy`); list scheduling under several priority rules
//!    (backward or forward first, deepest chunk / oldest microbatch / shallowest chunk first, three
//!    `W` policies, 1F1B- and ZB-H2-shaped warm-up caps), memory-safe by construction (module
//!    `list`), skipping a construction whose estimated work is past the phase's own budget (the
//!    time budget, at least [`MIN_CONSTRUCT_SECONDS`]) but building one list schedule wherever it
//!    affords any construction (the greedy's waves serialise where the limit is far below what the
//!    pipeline needs); on V-shape (`V = 2`), the zero-bubble
//!    authors' V-shape scheduler re-derived (module `vgreedy`, origin `zbv-greedy`): every
//!    warm-up-fill and approved-bubble setting, built under the limit and under each smaller one of
//!    the ladder `P/2`, `P`, `2P` microbatches in flight, so that more memory never gives a worse
//!    seed; the authors' ZB-V greedy step for step (module `vbubble`, origin `zbv-bubble`: its four
//!    fill settings and approved-bubble reruns, over the same ladder); their V-Half and V-Min
//!    (module `vpattern`, origin `v-pattern`: stable pattern, squeeze, `W`s in the free slots),
//!    wherever their peak fits. The best of these is taken after the phases below (which run as
//!    without it) and, when it beats every other seed, improved with a budget of its own;
//! 3. **improvement**, bounded by [`AutoRequest::time_budget`] and deterministic for a seed:
//!    randomised restarts, then local moves scored by the simulator (module `improve`);
//! 4. **exact**, for small instances (at most [`EXACT_MAX_ACTIONS`] actions, makespan objective):
//!    a branch and bound over every per-rank order that proves the optimum or reports the gap to
//!    its bound (module `exact`);
//! 5. **reshaping**, when nothing proved the result optimal: a `W` moved anywhere after its `I`, a
//!    forward moved over the backwards to the previous or next forward (warm-up depth), kept when
//!    no worse, with half the time budget of its own (`improve::Moves::Reshape`).
//! 6. **critical path**, when nothing proved the result optimal: moves on the chain of actions
//!    that sets the makespan (or the worst rank's span), read off the simulator's timeline (module
//!    `critical`: a block of back-to-back chain actions on one rank has its first or last two
//!    swapped, or one of its actions moved to its start or end), three in four, the rest as in 3,
//!    kept when no worse, with half the time budget of its own.
//! 7. **justification**, when nothing proved the result optimal: every action pushed as late as
//!    it can go, then back as early as it can go, each into a gap of its rank (module `justify`,
//!    the forward-backward improvement of project scheduling), the order of both passes perturbed
//!    by noise, both passes keeping each rank within its budget, kept when no worse, with half
//!    the time budget of its own (skipped where that does not afford ten tries). It moves whole
//!    waves of work across every rank at once, which no move of one item does.
//! 8. **late list rules**, when nothing proved the result optimal (module `list`): on V-shape
//!    under a limit, list scheduling under a banker's check on memory (origin `safe-list`: a
//!    forward is admitted when the microbatches in flight can still finish one after another in
//!    the order they entered; each rank takes in `3n/4`, `7n/8` or `n - 1` of its `n` slots
//!    before its first backward, or the first rank `n - 1` and the later ranks fewer, linearly
//!    down to `n/4` or `3n/8` fewer at the last); wherever a rank holds two or more stages, the waiting
//!    rules (origin `wait-list`: a rank about to start an action waits instead for the deeper
//!    chunk's forward of one of the first 1, 2, 4 or `2P` microbatches when it arrives before that
//!    action would end, so the way back that the first rank's span waits on is not held up at
//!    every rank). Their best (in the runs with the second seed, below, their second best), when
//!    it beats the constructive phase's best (the second best: comes within 3 % of it),
//!    gets phases 3, 5, 6 and 7 with budgets of its own and replaces the result only when it ends
//!    shorter. Then the same for the best safe-admission rule with its caps tuned rank by rank
//!    (origin `safe-list-tuned`: steepest descent by makespan, one rank's cap one higher or lower
//!    per step, where the time budget affords a round of `2P` list builds).
//! 9. **overtaking**, last, when nothing proved the result optimal: two microbatches swap labels
//!    on every action of a stage and the stages after it, so the later one passes the earlier
//!    between two stages while every rank's order keeps its shape (`improve::Moves::Overtake`,
//!    half of the moves; the rest as in 3), then justification (7), each with half the time budget,
//!    kept when no worse. Every construction keeps each stage's microbatches in order; CP-SAT's
//!    best schedules often do not.
//! 10. **pairing**, where overlap saves time (`overlap_share` below 1, module `pairing`): the
//!     result's neighbouring forward and backward joined into overlapped pairs where both were
//!     ready when the first started, passes kept while no worse (origin `+paired`); then the best
//!     of the families that fit, the constructive phase's best and the V-shape seeds (all of them
//!     up to 2048 actions, else the two best),
//!     each paired the same way, runs phase 3 on half the budget, is paired again, and is kept
//!     when shorter (origin `...+paired+improved`). The bound then counts what pairs save whether
//!     or not the result has pairs.
//!
//! Phases 1-9 run more than once, side by side on threads of their own, from the same constructions
//! (step 2 builds once; each run scores by its own objective; the bound, the exact method's result,
//! the V-shape seeds and the late list rules are computed once and shared): the request's own run;
//! a makespan run with a second seed (the request's seed mixed with a constant: the moves are
//! random, and two streams find more than one; phase 8 also starts elsewhere, from the late rules'
//! second best schedule, since the best start is not always the best end); for the span objective
//! also the makespan run with the request's seed and a span run with the second seed. The result
//! is the request's own run's unless another's schedule is strictly better by the request's
//! objective (origin then prefixed [`SECOND_SEED`], [`MAKESPAN_RUN`] or both): a schedule's span is
//! at most its makespan, so a span result is never longer than the makespan result of the same
//! request (the makespan's landscape is less flat: a move that shortens one rank's span is often
//! refused by the span, which the makespan takes and builds on). When the request's own run proves
//! its schedule optimal the others stop (`improve::StopWhen`); a proof by another run does not stop
//! the own run, so the schedule returned never depends on timing. On one core the runs take turns
//! (two to four times the time).
//!
//! A budget above the default ([`DEFAULT_TIME_BUDGET`]) is spent in two searches: all of this with
//! the default budget, then again with the rest of the budget; the better is kept (the first's
//! origin prefixed [`DEFAULT_RUN`] when it is strictly better). The phases scale with the budget
//! and the moves are random, so a longer search ends shorter on average but not on every request;
//! this way more time never gives a worse schedule than the default budget.
//!
//! A limit at or above what a rank holds with every microbatch through all its chunks cannot bind
//! and is read as that amount, so all such limits are the same request and give the same schedule
//! (without a limit the request stays unlimited: its bound has no memory terms).
//!
//! Every candidate is scored by [`crate::sim`] under the request's costs and checked against the
//! limit by the simulator's own memory accounting (`F` allocates its stage's activations when it
//! starts, `I` and `W` release theirs when they end; in microbatches in flight each of `V` chunks
//! counts `1/V`). The result records the objective, the lower bound (for the makespan
//! [`crate::sim::lower_bound`], or under a limit [`crate::sim::lower_bound_with_limit`], which knows
//! that a rank holding at most `k` microbatches waits a round trip for every `k` forwards; the
//! busiest rank's work for the span, or under a limit [`crate::sim::span_bound`], which knows the
//! same about each rank's span; the proven optimum when the exact method finished) and the gap
//! ([`SolverInfo`]), which [`AutoSchedule::to_json`] writes next to the schedule.
//!
//! ```
//! use pipefill_host::cost::{CostModel, LinkCost, StageCost};
//! use pipefill_host::auto::{solve, AutoRequest, MemoryLimit};
//! use pipefill_host::schedule::validate::validate;
//! // Four ranks, the first and last stage 1.5x slower, at most 4 microbatches in flight per rank.
//! let mut costs = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
//! for s in [0, 3] {
//!     costs.stages[s] = StageCost::uniform(1.5, 1.5, 1.5);
//! }
//! let req = AutoRequest::new(4, 8, costs)
//!     .with_limit(MemoryLimit::InFlight(4.0))
//!     .with_budget(0.05, 1);
//! let out = solve(&req).unwrap();
//! validate(&out.schedule).unwrap();
//! assert!(out.solver.peak.iter().all(|&p| p <= 4.0));
//! assert!(out.solver.value >= out.solver.lower_bound);
//! ```

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::schedule::Schedule;
use crate::schedule::{Action, Op, Placement};
use crate::sim::{
    bound_for, bound_with_limit, bound_with_limit_until_input, span_bound, span_bound_until_input,
};

mod critical;
mod error;
mod exact;
mod greedy;
mod improve;
mod instance;
mod justify;
mod list;
mod pairing;
mod par;
mod request;
mod rng;
mod score;
mod seeds;
mod vbubble;
mod vgreedy;
mod vpattern;

pub use error::AutoError;
pub use exact::EXACT_MAX_ACTIONS;
pub use improve::WORK_PER_SECOND;
pub use request::{
    AutoOptions, AutoRequest, MemoryLimit, Objective, UnknownObjective, DEFAULT_TIME_BUDGET,
};
pub use seeds::FamilyResult;

use instance::{Instance, MEMORY_EPS};
use list::{build, Rule};
use rng::Rng;
use score::{schedule_of, score, Best, Scored};

/// The least budget of the constructive phase, seconds: every construction of an ordinary size
/// fits in it, so a budget of 0 still builds the list schedules.
pub const MIN_CONSTRUCT_SECONDS: f64 = 1.0;

/// The share of the time budget the reshaping moves get after every other phase.
const RESHAPE_SHARE: f64 = 0.5;

/// Mixed into the seed for the reshaping moves' own random stream.
const RESHAPE_STREAM: u64 = 0x7265_7368_6170_6521;

/// The share of the time budget the critical-path moves get, last of all.
const CRITICAL_SHARE: f64 = 0.5;

/// Mixed into the seed for the critical-path moves' own random stream.
const CRITICAL_STREAM: u64 = 0x6372_6974_6963_616c;

/// The share of the time budget justification gets (module `justify`), after the critical-path
/// moves.
const JUSTIFY_SHARE: f64 = 0.5;

/// Mixed into the seed for justification's own random stream.
const JUSTIFY_STREAM: u64 = 0x6a75_7374_6966_7921;

/// The share of the time budget the overtaking moves get (`improve::Moves::Overtake`), after the
/// critical-path moves.
const OVERTAKE_SHARE: f64 = 0.5;

/// The share of the time budget the run from the constructive phase's best with overlapped pairs
/// gets (module `pairing`), where overlap saves time.
const PAIRED_SHARE: f64 = 0.5;

/// How many of the V-shape seeds (best first, distinct values) the pairing tries as starts above
/// [`PAIRED_ALL_SEEDS_ACTIONS`] (at P = 16, M = 128 every seed gave the same values in 1.1-3.7 s
/// instead of under a second).
const PAIRED_SEEDS: usize = 2;

/// Up to this many actions every V-shape seed is a pairing start: the seeds built under each
/// smaller limit of the ladder among them, so that more memory does not give a longer paired seed
/// (P = 4, M = 8, 1:1.2:0.8, transfers: 24.1 at `2P` against 23.5 at `P` with two; 23.3 with all).
const PAIRED_ALL_SEEDS_ACTIONS: usize = 2048;

/// The random stream of the overtaking moves.
const OVERTAKE_STREAM: u64 = 0x6f76_6572_7461_6b65;

/// The family name of automatic schedules (defined with the families' names).
pub use crate::schedule::families::AUTO;

/// What the solver found besides the schedule (written as `"solver"` in the schedule's JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SolverInfo {
    /// What was minimised.
    pub objective: Objective,
    /// The objective of the returned schedule.
    pub value: f64,
    /// Its simulated makespan.
    pub makespan: f64,
    /// No schedule of this shape under these costs can do better than this (the proven optimum when
    /// `proven_optimal`).
    pub lower_bound: f64,
    /// `value / lower_bound - 1` (0 when proven optimal or when the bound is reached).
    pub gap: f64,
    /// Whether the exact method proved `value` optimal (under the memory limit).
    pub proven_optimal: bool,
    /// Where the schedule came from: a family name, `zb-greedy` (the zero-bubble authors' greedy),
    /// `zbv-greedy` (their V-shape scheduler), `list` (the list rules of the constructive phase), with
    /// `+improved` when the improvement phase changed it, or `exact`; prefixed [`SECOND_SEED`] or
    /// [`MAKESPAN_RUN`] when a run beside the request's own found it, and [`DEFAULT_RUN`] when, under
    /// a budget above the default, the default budget's search found it ([`solve`]).
    pub origin: String,
    /// The memory limit, if any.
    pub limit: Option<MemoryLimit>,
    /// Per rank, the simulator's peak activation memory: bytes, or microbatches in flight when the
    /// limit is given in those or when there is none.
    pub peak: Vec<f64>,
    /// `bytes` or `microbatches in flight` (the unit of `peak` and of the limit).
    pub peak_unit: String,
    /// The seed of the improvement phase.
    pub seed: u64,
    /// The time budget, seconds.
    pub time_budget: f64,
    /// Candidates simulated, by every run of [`solve`] (by the request's own run alone when that
    /// one proved its schedule optimal and stopped the others).
    pub evaluations: u64,
    /// Every handcrafted family of this shape: its objective when it fits the limit.
    pub families: Vec<FamilyResult>,
}

/// A schedule from [`solve`] and what the solver knows about it.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoSchedule {
    /// The schedule (named `auto`).
    pub schedule: Schedule,
    /// Objective, bound, gap and where it came from.
    pub solver: SolverInfo,
}

impl AutoSchedule {
    /// `self`, recording `seconds` as the budget it was solved with.
    fn for_budget(mut self, seconds: f64) -> Self {
        self.solver.time_budget = seconds;
        self
    }

    /// `more` (the search with the rest of the budget) unless `self` (the default budget's search
    /// on the same request) is strictly better by the objective; the higher of their bounds, their
    /// evaluations summed.
    fn or_better(self, more: AutoSchedule) -> AutoSchedule {
        let lower = self.solver.lower_bound.max(more.solver.lower_bound);
        let evaluations = self.solver.evaluations + more.solver.evaluations;
        let mut out = if self.solver.value < more.solver.value {
            let mut base = self;
            base.solver.origin = format!("{DEFAULT_RUN}{}", base.solver.origin);
            base
        } else {
            more
        };
        let info = &mut out.solver;
        info.lower_bound = lower;
        info.evaluations = evaluations;
        info.proven_optimal = info.value <= lower * (1.0 + 1e-9);
        info.gap = gap(info.value, lower, info.proven_optimal);
        out
    }

    /// The schedule's canonical JSON ([`crate::schedule::format::to_json`]) with a `"solver"` field
    /// holding [`SolverInfo`]; [`crate::schedule::format::from_json`] reads it back (the field is
    /// optional there, so files without it read as before).
    pub fn to_json(&self) -> String {
        let base = crate::schedule::format::to_json(&self.schedule);
        let solver = serde_json::to_string(&self.solver).unwrap_or_else(|_| "null".into());
        match base.trim_end().strip_suffix('}') {
            Some(head) => format!("{},\n  \"solver\": {solver}\n}}\n", head.trim_end()),
            None => base,
        }
    }
}

/// One construction of the constructive phase.
enum Construction {
    /// The zero-bubble authors' greedy with these flags (module `greedy`).
    Greedy(greedy::Flags),
    /// List scheduling with this rule (module `list`).
    List(Rule),
}

/// Solves `req`: see the [module docs](self).
///
/// Errors ([`AutoError`]): a shape no schedule can have, unusable costs or a stage count that does
/// not match `P * V`, a limit that is not positive or is below what one microbatch needs on some
/// rank, a limit in bytes without activation sizes, a bad budget.
pub fn solve(req: &AutoRequest) -> Result<AutoSchedule, AutoError> {
    // (A budget that is not a number goes to `solve_once`, which refuses it.)
    if req.time_budget.is_nan() || req.time_budget <= DEFAULT_TIME_BUDGET {
        return solve_once(req);
    }
    // A larger budget: the default budget's search, then one with the rest of the budget, the
    // better kept. The searches are random walks whose phases scale with the budget, so a longer
    // one ends shorter on average but not everywhere (on the V-shape grid, 1 s against 0.3 s: 65
    // rows shorter, 12 longer); with the default's search first, more time never returns a
    // schedule worse than the default's (0.3 s then 0.7 s: 59 rows shorter, none longer, the same
    // mean as one search of 1 s).
    let base = solve_once(&req.clone().with_budget(DEFAULT_TIME_BUDGET, req.seed))?;
    if base.solver.proven_optimal {
        return Ok(base.for_budget(req.time_budget));
    }
    let rest = req.time_budget - DEFAULT_TIME_BUDGET;
    let out = match solve_once(&req.clone().with_budget(rest, req.seed)) {
        Ok(more) => base.or_better(more),
        // A rest too small for any construction leaves the default's result.
        Err(AutoError::OverBudget { .. }) => base,
        Err(e) => return Err(e),
    };
    Ok(out.for_budget(req.time_budget))
}

/// [`solve`] with the request's budget alone.
fn solve_once(req: &AutoRequest) -> Result<AutoSchedule, AutoError> {
    let inst = Instance::new(req)?;
    let built = construct(&inst, req);
    let runs = runs(req);
    let shared = Shared::default();
    // The request's own run first, never stopped: when it proves its schedule optimal the others
    // stop (nothing of theirs can be better), so which schedule is returned never depends on
    // timing.
    let mut results: Vec<Result<AutoSchedule, AutoError>> = std::thread::scope(|scope| {
        let others: Vec<_> = runs[1..]
            .iter()
            .map(|r| {
                scope.spawn(|| {
                    let _stop = improve::StopWhen::set(shared.proved.clone());
                    // The runs with the second seed start the late rules' phase from their second
                    // best schedule.
                    let late_rank = usize::from(r.seed != req.seed);
                    solve_from(&inst, r, &built, &shared, late_rank)
                })
            })
            .collect();
        let own = solve_from(&inst, &runs[0], &built, &shared, 0);
        if own.as_ref().is_ok_and(|o| o.solver.proven_optimal) {
            shared
                .proved
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let mut all = vec![own];
        for h in others {
            all.push(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        }
        all
    });
    let rest = results.split_off(1);
    let mut out = results
        .pop()
        .ok_or_else(|| AutoError::Internal("no run".into()))??;
    // When the own run proved its schedule optimal the others stopped where timing had them, so
    // their evaluations are left out of the count (which then stays the same for a seed).
    let own_proved = out.solver.proven_optimal;
    for (other, run) in rest.into_iter().zip(&runs[1..]) {
        let other = other?;
        if own_proved {
            continue;
        }
        out.solver.evaluations += other.solver.evaluations;
        if out.solver.proven_optimal {
            continue;
        }
        let Some(s) = score(&inst, req.objective, other.schedule)? else {
            continue;
        };
        if s.value < out.solver.value {
            let prefix = match (run.seed == req.seed, run.objective == req.objective) {
                (true, _) => MAKESPAN_RUN.to_string(),
                (false, true) => SECOND_SEED.to_string(),
                (false, false) => format!("{SECOND_SEED}{MAKESPAN_RUN}"),
            };
            let info = &mut out.solver;
            info.value = s.value;
            info.makespan = s.makespan;
            info.peak = s.peak;
            info.origin = format!("{prefix}{}", other.solver.origin);
            info.proven_optimal = s.value <= info.lower_bound * (1.0 + 1e-9);
            info.gap = gap(s.value, info.lower_bound, info.proven_optimal);
            out.schedule = s.schedule;
            out.schedule.name = AUTO.to_string();
        }
    }
    // The moves' results skip the static checks when scored ([`score::Checks::Reordered`]); the
    // schedule returned passes them here, so none that breaks them leaves the solver.
    crate::schedule::validate::check_static(&out.schedule)
        .map_err(|e| AutoError::Internal(format!("the schedule does not validate: {e}")))?;
    Ok(out)
}

/// `value / lower - 1` (0 when proven optimal or without a positive bound).
fn gap(value: f64, lower: f64, proven: bool) -> f64 {
    if proven || lower <= 0.0 {
        0.0
    } else {
        (value / lower - 1.0).max(0.0)
    }
}

/// The runs [`solve`] makes side by side, the request's own first: a makespan run with a seed of
/// its own ([`SECOND_STREAM`]), and for the span objective the makespan run with the request's
/// seed as well (so the span result is never longer than the makespan result) and a span run with
/// the second seed.
fn runs(req: &AutoRequest) -> Vec<AutoRequest> {
    let makespan = req.clone().with_objective(Objective::Makespan);
    let second = makespan
        .clone()
        .with_budget(req.time_budget, req.seed ^ SECOND_STREAM);
    match req.objective {
        Objective::Makespan => vec![req.clone(), second],
        Objective::Span => {
            let span = req
                .clone()
                .with_budget(req.time_budget, req.seed ^ SECOND_STREAM);
            vec![req.clone(), makespan, second, span]
        }
    }
}

/// How much longer than the constructive phase's best the late list rules' second best may be and
/// still be improved, in the runs that start from it (the request's own runs improve the best only
/// when it is shorter): a start a little longer can end shorter, and those runs are there to search
/// elsewhere. On the V-shape grid 3 %, against none: 5 rows shorter, none longer, 3 more proven
/// optimal, 8 % more solve time in all.
const LATE_SLACK: f64 = 0.03;

/// Seeds the second makespan run apart from the request's.
const SECOND_STREAM: u64 = 0x7365_636f_6e64_2121;

/// Prefixes the origin of a result that the makespan run with the second seed found ([`solve`]).
pub const SECOND_SEED: &str = "second-seed:";

/// Prefixes the origin of a span result that the makespan run beside it found ([`solve`]).
pub const MAKESPAN_RUN: &str = "makespan-run:";

/// Prefixes the origin of a result that, under a budget above the default, the default budget's
/// search found and the search with the rest of the budget did not better ([`solve`]).
pub const DEFAULT_RUN: &str = "default-budget:";

/// One schedule's per-rank orders, tagged with its origin.
type Tagged = (Vec<Vec<Action>>, &'static str);

/// A scored schedule with its origin.
type Origined = (Scored, &'static str);

/// The constructive phase's schedules (per-rank orders and their origin, `None` where a
/// construction gave none), in the order they are offered, and whether the budget skipped any.
struct Built {
    /// Per construction, its orders and origin.
    orders: Vec<Option<Tagged>>,
    /// Whether a construction was skipped for want of budget.
    skipped: bool,
    /// The estimated work of one construction.
    one_build: f64,
}

/// The constructive phase (step 2 of the [module docs](self)) up to scoring, which depends on the
/// objective: built once for both runs of the span objective.
fn construct(inst: &Instance, req: &AutoRequest) -> Built {
    // The constructive phase gets the budget (at least [`MIN_CONSTRUCT_SECONDS`]) of its own:
    // a construction estimated past what is left is skipped, so a huge `V x M` cannot run for
    // minutes whatever the budget.
    let mut construct = improve::Work::new(req.time_budget.max(MIN_CONSTRUCT_SECONDS));
    let one_build = improve::build_work(inst);
    let mut skipped = false;
    let mut afford = |construct: &mut improve::Work| {
        let ok = one_build <= construct.left() && construct.take(one_build);
        skipped |= !ok;
        ok
    };
    // Which constructions the budget affords is fixed before any runs (each costs `one_build`),
    // so they can run side by side (module `par`) and be offered in order, as one by one.
    let mut jobs: Vec<Construction> = Vec::new();
    for flags in greedy::Flags::all() {
        if afford(&mut construct) {
            jobs.push(Construction::Greedy(flags));
        }
    }
    let rules = Rule::standard(inst);
    let first_rule = rules.first().cloned();
    for rule in rules {
        if afford(&mut construct) {
            jobs.push(Construction::List(rule));
        }
    }
    // At least one list schedule (memory-safe by construction, backward first) wherever the budget
    // affords any construction: where it affords only a few greedy variants (hundreds of thousands
    // of actions), those alone can be far from what the limit allows (P = 64, M = 1024, 32 in
    // flight: 67647 against a bound of 4221). It costs one construction more than the budget, one
    // that the budget afforded at least once; where it affords none, the request is refused below.
    if !jobs.is_empty() && !jobs.iter().any(|j| matches!(j, Construction::List(_))) {
        if let Some(rule) = first_rule {
            jobs.push(Construction::List(rule));
        }
    }
    let orders = par::map_ordered(&jobs, |job| match job {
        Construction::Greedy(flags) => greedy::build(inst, *flags).map(|o| (o, "zb-greedy")),
        Construction::List(rule) => build(inst, rule).map(|o| (o, "list")),
    });
    Built {
        orders,
        skipped,
        one_build,
    }
}

/// What the runs of one request share, each part computed by the first run that needs it: the
/// lower bound per objective (runs of one objective start from the same constructive best), the
/// V-shape seeds' and the late list rules' schedules (scored by each run's objective).
#[derive(Default)]
struct Shared {
    /// The bound of the makespan (0) and of the span (1).
    bounds: [OnceLock<f64>; 2],
    /// The V-shape seeds (modules `vgreedy`, `vbubble`, `vpattern`), tagged with their origin.
    v_seeds: OnceLock<Vec<Tagged>>,
    /// The late list rules' schedules (safe admission, waiting), tagged with their origin.
    late: OnceLock<Vec<Tagged>>,
    /// The exact method's result (makespan runs; it depends on the constructive best only).
    exact: OnceLock<Option<exact::Exact>>,
    /// Per objective (the makespan 0, the span 1), the schedules above scored: runs of one
    /// objective score the same schedules (a span request's four runs, two per objective).
    scored: [Scores; 2],
    /// Set when the request's own run proved its schedule optimal: the other runs' budgets then
    /// count as spent ([`improve::Work::take`]), since none can do better.
    proved: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// The schedules [`Shared`] holds, scored by one objective.
#[derive(Default)]
struct Scores {
    /// The constructive phase's best (the first of equals in its order; `None` where none gave a
    /// schedule within the budgets).
    built: OnceLock<Result<Option<Origined>, AutoError>>,
    /// The V-shape seeds' ([`ranked`]).
    v_seeds: OnceLock<Result<Vec<Origined>, AutoError>>,
    /// The late list rules' ([`ranked`]), the tuned caps' schedule left out.
    late: OnceLock<Result<Vec<Origined>, AutoError>>,
    /// The tuned caps' schedule ([`tuned`]), when there is one.
    tuned: OnceLock<Result<Vec<Origined>, AutoError>>,
}

/// [`solve`] for one run, from the constructive phase's schedules and what the runs share; the
/// late list rules' phase starts from their `late_rank`-th best schedule (0: the best; distinct
/// values counted, the last where fewer).
fn solve_from(
    inst: &Instance,
    req: &AutoRequest,
    built: &Built,
    shared: &Shared,
    late_rank: usize,
) -> Result<AutoSchedule, AutoError> {
    let (families, seeded) = seeds::seeds(inst, req.objective)?;
    // Where overlap saves time, the families that fit are also starts for pairing (below).
    let pairing_starts: Vec<(Scored, String)> = if pairing::pairs_save(inst) {
        seeded
            .iter()
            .map(|s| (s.clone(), s.schedule.name.clone()))
            .collect()
    } else {
        Vec::new()
    };
    // The best candidate.
    let mut found: Best<String> = Best::default();
    let mut offer = |s: Scored, origin: String| found.offer(s, origin);
    for s in seeded {
        let name = s.schedule.name.clone();
        offer(s, name);
    }
    let scores = &shared.scored[usize::from(req.objective == Objective::Span)];
    // Offered after the families, the constructions' first best is what offering each in turn
    // would keep.
    let built_best = scores.built.get_or_init(|| {
        let scored = par::map_ordered(&built.orders, |b| match b {
            Some((o, origin)) => score(inst, req.objective, schedule_of(inst, AUTO, o))
                .map(|s| s.map(|s| (s, *origin))),
            None => Ok(None),
        });
        let mut best = Best::default();
        for result in scored {
            if let Some((s, origin)) = result? {
                best.offer(s, origin);
            }
        }
        Ok(best.value)
    });
    if let Some((s, origin)) = built_best.clone()? {
        offer(s, origin.into());
    }
    let (skipped, one_build) = (built.skipped, built.one_build);
    let (mut best, origin) = found.value.take().ok_or_else(|| match skipped {
        true => AutoError::OverBudget {
            seconds: one_build / WORK_PER_SECOND,
            budget: req.time_budget,
        },
        false => AutoError::Internal("no rule produced a schedule within the limit".into()),
    })?;
    let start_value = best.value;
    // Where overlap saves time, the constructive phase's best also starts a run with overlapped
    // pairs of its own, after the phases below (module `pairing`).
    let first = pairing::pairs_save(inst).then(|| (best.clone(), origin.to_string()));
    let target = *shared.bounds[usize::from(req.objective == Objective::Span)]
        .get_or_init(|| bound(inst, req, &best.schedule));
    let mut lower = target;
    let mut proven = best.value <= target * (1.0 + 1e-9);
    let mut work = improve::Work::new(req.time_budget);
    let mut exact_won = false;
    if !proven && req.objective == Objective::Makespan {
        let exact = shared
            .exact
            .get_or_init(|| exact::solve(inst, best.value, req.time_budget));
        if let Some(result) = exact {
            lower = lower.max(result.lower_bound);
            if let Some(orders) = &result.improved {
                if let Some(s) = score(inst, req.objective, schedule_of(inst, AUTO, orders))? {
                    exact_won = s.value < best.value;
                    if exact_won {
                        best = s;
                    }
                }
            }
            proven = result.complete;
        }
    }
    if !proven {
        polish(inst, req, &mut best, &mut work, lower);
        proven = best.value <= lower * (1.0 + 1e-9);
    }
    let mut origin = if exact_won {
        "exact".to_string()
    } else if best.value < start_value {
        format!("{origin}+improved")
    } else {
        origin
    };
    // The V-shape seeds (module `vgreedy`) come after the phases above, which they leave as they
    // were: a seed better than every other starts an improvement run of its own.
    if !proven {
        let seeds = nth_of(
            inst,
            req.objective,
            &scores.v_seeds,
            &shared.v_seeds,
            &v_seeds,
            |_| true,
            0,
        )?;
        if let Some((v, name)) = seeds {
            let seed_value = v.value;
            let mut v = v;
            if seed_value < start_value {
                let mut more = improve::Work::new(req.time_budget);
                polish(inst, req, &mut v, &mut more, lower);
                work.evaluations += more.evaluations;
            }
            if v.value < best.value {
                origin = if v.value < seed_value {
                    format!("{name}+improved")
                } else {
                    name.into()
                };
                best = v;
                proven = best.value <= lower * (1.0 + 1e-9);
            }
        }
    }
    // Reshaping and critical-path moves on the best of all, each with a budget of its own: they
    // keep only what is no worse, so the phases above give what they gave.
    if !proven {
        if reshape_and_critical(inst, req, &mut best, &mut work, lower)
            && !origin.ends_with("+improved")
        {
            origin.push_str("+improved");
        }
        proven = best.value <= lower * (1.0 + 1e-9);
    }
    // The late list rules, last: safe admission (V-shape under a limit) and waiting (two or more
    // stages per rank), module `list`. The `late_rank`-th schedule of theirs, when better than the
    // constructive phase's best (a run that starts from the second best: within [`LATE_SLACK`] of
    // it), gets every improvement phase of its own and replaces the result only when it ends
    // shorter, so every phase above gives what it gave.
    // Then the best safe-admission rule's caps tuned rank by rank ([`tuned`]), a start of its own
    // the same way: as one of the late rules it was often their best start and then ended longer
    // than the untuned start (7 of 22 rows changed).
    let slack = if late_rank > 0 { LATE_SLACK } else { 0.0 };
    let make_late = |inst: &Instance| late_rules(inst, req.time_budget);
    type Keep = fn(&str) -> bool;
    type Ranked = OnceLock<Result<Vec<Origined>, AutoError>>;
    let starts: [(&Ranked, Keep, usize); 2] = [
        (&scores.late, |name| name != TUNED, late_rank),
        (&scores.tuned, |name| name == TUNED, 0),
    ];
    for (scored, keep, rank) in starts {
        if proven {
            break;
        }
        let start = nth_of(
            inst,
            req.objective,
            scored,
            &shared.late,
            &make_late,
            keep,
            rank,
        )?;
        if let Some((mut seed, name)) = start {
            let seed_value = seed.value;
            if seed_value < start_value * (1.0 + slack) {
                let mut more = improve::Work::new(req.time_budget);
                polish(inst, req, &mut seed, &mut more, lower);
                reshape_and_critical(inst, req, &mut seed, &mut more, lower);
                work.evaluations += more.evaluations;
            }
            if seed.value < best.value {
                origin = if seed.value < seed_value {
                    format!("{name}+improved")
                } else {
                    name.into()
                };
                best = seed;
                proven = best.value <= lower * (1.0 + 1e-9);
            }
        }
    }
    // Overtaking, last of all (a microbatch passing another from a stage on, with short moves;
    // `improve::Moves::Overtake`): kept when no worse, so every phase above gives what it gave.
    if !proven {
        let before = best.value;
        let mut more = improve::Work::new(req.time_budget * OVERTAKE_SHARE);
        let mut rng = Rng::new(req.seed ^ OVERTAKE_STREAM);
        improve::climb(
            inst,
            req.objective,
            &mut best,
            &mut rng,
            &mut more,
            lower,
            improve::Moves::Overtake,
        );
        let mut more2 = improve::Work::new(req.time_budget * JUSTIFY_SHARE);
        justify::climb(inst, req.objective, &mut best, &mut rng, &mut more2, lower);
        work.evaluations += more.evaluations + more2.evaluations;
        if best.value < before && !origin.ends_with("+improved") {
            origin.push_str("+improved");
        }
        proven = best.value <= lower * (1.0 + 1e-9);
    }
    // Overlapped pairs (module `pairing`), where overlap saves time: the result's neighbours
    // joined, and a run of its own from the constructive phase's best with pairs, its improvement
    // phase on [`PAIRED_SHARE`] of the budget; each kept only when shorter, so every phase above
    // gives what it gave.
    if !proven && pairing::pair_up(inst, req.objective, &mut best, &mut work) {
        origin.push_str("+paired");
        proven = best.value <= lower * (1.0 + 1e-9);
    }
    if let Some(first) = first.filter(|_| !proven) {
        // Every start paired: the families that fit, the constructive phase's best and the
        // V-shape seeds (built under every smaller limit of the ladder too, so that more memory
        // still never gives a worse seed); the best paired one, when pairing shortened it, runs.
        let mut starts = pairing_starts;
        starts.push(first);
        if inst.placement == Placement::Vshape {
            let ranked = ranked_of(
                inst,
                req.objective,
                &scores.v_seeds,
                &shared.v_seeds,
                &v_seeds,
                |_| true,
            );
            let v = ranked.as_ref().map_err(Clone::clone)?;
            let take = if inst.actions() <= PAIRED_ALL_SEEDS_ACTIONS {
                v.len()
            } else {
                PAIRED_SEEDS
            };
            starts.extend(
                v.iter()
                    .take(take)
                    .map(|(s, name)| (s.clone(), name.to_string())),
            );
        }
        let mut more = improve::Work::new(req.time_budget * PAIRED_SHARE);
        let mut chosen: Option<(Scored, String)> = None;
        for (mut start, name) in starts {
            if pairing::pair_up(inst, req.objective, &mut start, &mut more)
                && chosen.as_ref().is_none_or(|(c, _)| start.value < c.value)
            {
                chosen = Some((start, name));
            }
        }
        if let Some((mut start, name)) = chosen {
            let paired_value = start.value;
            polish(inst, req, &mut start, &mut more, lower);
            pairing::pair_up(inst, req.objective, &mut start, &mut more);
            if start.value < best.value {
                origin = if start.value < paired_value {
                    format!("{name}+paired+improved")
                } else {
                    format!("{name}+paired")
                };
                best = start;
                proven = best.value <= lower * (1.0 + 1e-9);
            }
        }
        work.evaluations += more.evaluations;
    }
    if proven {
        lower = best.value;
    }
    best.schedule.name = AUTO.to_string();
    let solver = SolverInfo {
        objective: req.objective,
        value: best.value,
        makespan: best.makespan,
        lower_bound: lower,
        gap: gap(best.value, lower, proven),
        proven_optimal: proven,
        origin,
        limit: req.limit,
        peak: best.peak.clone(),
        peak_unit: if inst.unit {
            "microbatches in flight"
        } else {
            "bytes"
        }
        .into(),
        seed: req.seed,
        time_budget: req.time_budget,
        evaluations: work.evaluations,
        families,
    };
    Ok(AutoSchedule {
        schedule: best.schedule,
        solver,
    })
}

/// The V-shape seeds (modules `vgreedy`, `vbubble`, `vpattern`), each with its origin; none off
/// V-shape.
fn v_seeds(inst: &Instance) -> Vec<Tagged> {
    let greedy = vgreedy::candidates(inst)
        .into_iter()
        .map(|o| (o, "zbv-greedy"));
    let bubble = vgreedy::ladder(inst)
        .into_iter()
        .flat_map(|budget| vbubble::runs(inst, &budget))
        .map(|o| (o, "zbv-bubble"));
    let pattern = [true, false]
        .into_iter()
        .filter_map(|half| vpattern::build(inst, half))
        .map(|o| (o, "v-pattern"));
    greedy.chain(bubble).chain(pattern).collect()
}

/// The late list rules' schedules (module `list`: safe admission on V-shape under a limit, waiting
/// wherever a rank holds two or more stages), each with its origin, and the best safe-admission
/// rule's warm-up caps tuned rank by rank ([`tuned`]) within `seconds` of budget.
fn late_rules(inst: &Instance, seconds: f64) -> Vec<Tagged> {
    let safe = Rule::safe(inst);
    let rules: Vec<(Rule, &'static str)> = safe
        .iter()
        .cloned()
        .map(|r| (r, "safe-list"))
        .chain(Rule::waiting(inst).into_iter().map(|r| (r, "wait-list")))
        .collect();
    let mut built = par::map_ordered(&rules, |(rule, name)| build(inst, rule).map(|o| (o, *name)));
    let tune = tuned(inst, &safe, &built[..safe.len()], seconds);
    built.push(tune);
    built.into_iter().flatten().collect()
}

/// The origin of [`tuned`]'s schedule.
const TUNED: &str = "safe-list-tuned";

/// The most rounds of [`tuned`].
const TUNE_ROUNDS: usize = 4;

/// Steepest descent on the warm-up caps of the best of the safe-admission rules `rules` (whose
/// schedules are `built`), by makespan: each round builds the `2P` rules with one rank's cap one
/// higher or lower and moves to the best when it is shorter, for at most [`TUNE_ROUNDS`] rounds and
/// what `seconds` affords (at the default budget a round is affordable up to P = 16, M = 64, none
/// at P = 16, M = 128; half the budget stopped at M = 32, and 4 V-Half rows at M = 64 were
/// 0.4-0.7 % longer). The shapes of [`Rule::safe`] are lines across the ranks; a rank's own step
/// can fit the costs better (at P = 8, M = 32, 2:2:1 with transfers at V-Half's limit the best line
/// builds 227.1, the tuned caps 218.0). Origin `safe-list-tuned`; `None` when nothing shorter was
/// found.
fn tuned(
    inst: &Instance,
    rules: &[Rule],
    built: &[Option<Tagged>],
    seconds: f64,
) -> Option<Tagged> {
    let n = list::safe_slots(inst)?;
    let makespan = |orders: &Vec<Vec<Action>>| {
        score(inst, Objective::Makespan, schedule_of(inst, AUTO, orders))
            .ok()
            .flatten()
            .map(|s| s.value)
    };
    let one = improve::build_work(inst) + inst.actions() as f64;
    let mut afford = (seconds * improve::WORK_PER_SECOND / one).floor() as usize;
    let (mut rule, mut orders, mut value) = rules
        .iter()
        .zip(built)
        .filter_map(|(r, b)| {
            let (o, _) = b.as_ref()?;
            Some((r.clone(), o.clone(), makespan(o)?))
        })
        .min_by(|a, b| a.2.total_cmp(&b.2))?;
    let start = value;
    for _ in 0..TUNE_ROUNDS {
        let mut next = Vec::new();
        for r in 0..inst.p {
            for step in [-1.0, 1.0] {
                let cap = (rule.soft[r] + step).clamp(1.0, (n - 1.0).max(1.0));
                if cap != rule.soft[r] {
                    let mut cand = rule.clone();
                    cand.soft[r] = cap;
                    next.push(cand);
                }
            }
        }
        if next.is_empty() || next.len() > afford {
            break;
        }
        afford -= next.len();
        let tried = par::map_ordered(&next, |cand| {
            let o = build(inst, cand)?;
            let v = makespan(&o)?;
            Some((v, o))
        });
        let best = next
            .into_iter()
            .zip(tried)
            .filter_map(|(r, t)| t.map(|(v, o)| (r, o, v)))
            .min_by(|a, b| a.2.total_cmp(&b.2));
        match best {
            Some((r, o, v)) if v < value * (1.0 - 1e-9) => {
                rule = r;
                orders = o;
                value = v;
            }
            _ => break,
        }
    }
    (value < start).then_some((orders, TUNED))
}

/// `candidates` that the simulator keeps within the instance's budgets, scored by `objective`,
/// best first; of equal values only the first is kept ([`nth`] counts distinct values).
fn ranked(
    inst: &Instance,
    objective: Objective,
    candidates: &[&Tagged],
) -> Result<Vec<Origined>, AutoError> {
    let scored = par::map_ordered(candidates, |(orders, name)| {
        score(inst, objective, schedule_of(inst, AUTO, orders)).map(|s| s.map(|s| (s, *name)))
    });
    let mut all = Vec::new();
    for s in scored {
        if let Some(x) = s? {
            all.push(x);
        }
    }
    // Stable: the first of equal values stays first, and `dedup_by` keeps it.
    all.sort_by(|a, b| a.0.value.total_cmp(&b.0.value));
    all.dedup_by(|later, kept| later.0.value <= kept.0.value * (1.0 + 1e-9));
    Ok(all)
}

/// The `rank`-th of the schedules `make` builds (once per request, kept in `schedules`) by
/// `objective` ([`ranked`] once per objective, kept in `scored`; [`nth`]).
fn nth_of(
    inst: &Instance,
    objective: Objective,
    scored: &OnceLock<Result<Vec<Origined>, AutoError>>,
    schedules: &OnceLock<Vec<Tagged>>,
    make: &dyn Fn(&Instance) -> Vec<Tagged>,
    keep: fn(&str) -> bool,
    rank: usize,
) -> Result<Option<Origined>, AutoError> {
    nth(
        ranked_of(inst, objective, scored, schedules, make, keep),
        rank,
    )
}

/// All of the schedules `make` builds that `keep` keeps, [`ranked`] by `objective` (built once
/// per request, ranked once per objective, as [`nth_of`] takes them).
fn ranked_of<'a>(
    inst: &Instance,
    objective: Objective,
    scored: &'a OnceLock<Result<Vec<Origined>, AutoError>>,
    schedules: &OnceLock<Vec<Tagged>>,
    make: &dyn Fn(&Instance) -> Vec<Tagged>,
    keep: fn(&str) -> bool,
) -> &'a Result<Vec<Origined>, AutoError> {
    scored.get_or_init(|| {
        let all = schedules.get_or_init(|| make(inst));
        let kept: Vec<&Tagged> = all.iter().filter(|(_, name)| keep(name)).collect();
        ranked(inst, objective, &kept)
    })
}

/// The `nth` of `ranked`'s schedules (0: the best; the last where there are fewer) with its
/// origin. Runs that start from different schedules end in different places: on P = 8, M = 32,
/// 2:2:1 with transfers under twice 1F1B's memory the second best late list schedule (a span of
/// 167.7, against 164.7 for the best) improves to 162.3, the best to 164.1.
fn nth(
    ranked: &Result<Vec<Origined>, AutoError>,
    nth: usize,
) -> Result<Option<Origined>, AutoError> {
    let all = ranked.as_ref().map_err(Clone::clone)?;
    Ok(all.get(nth.min(all.len().saturating_sub(1))).cloned())
}

/// The improvement phase on `best` within `work`: randomised restarts, then local moves, seeded
/// by the request.
fn polish(
    inst: &Instance,
    req: &AutoRequest,
    best: &mut Scored,
    work: &mut improve::Work,
    lower: f64,
) {
    let mut rng = Rng::new(req.seed);
    improve::restarts(inst, req.objective, best, &mut rng, work, 0.5, lower);
    improve::climb(
        inst,
        req.objective,
        best,
        &mut rng,
        work,
        lower,
        improve::Moves::Short,
    );
}

/// Phases 5, 6 and 7 on `best` (see the [module docs](self)), each with a budget of its own, their
/// evaluations counted in `work`: the reshaping moves, then the moves on the critical path, then
/// justification. Each keeps only what is no worse. Returns whether `best` got better.
fn reshape_and_critical(
    inst: &Instance,
    req: &AutoRequest,
    best: &mut Scored,
    work: &mut improve::Work,
    lower: f64,
) -> bool {
    let before = best.value;
    let proven = |b: &Scored| b.value <= lower * (1.0 + 1e-9);
    for (share, stream, moves) in [
        (RESHAPE_SHARE, RESHAPE_STREAM, improve::Moves::Reshape),
        // Moves on the critical path (module `critical`).
        (CRITICAL_SHARE, CRITICAL_STREAM, improve::Moves::Critical),
    ] {
        if !proven(best) {
            let mut more = improve::Work::new(req.time_budget * share);
            let mut rng = Rng::new(req.seed ^ stream);
            improve::climb(inst, req.objective, best, &mut rng, &mut more, lower, moves);
            work.evaluations += more.evaluations;
        }
    }
    // Justification (module `justify`), last: whole waves moved at once.
    if !proven(best) {
        let mut more = improve::Work::new(req.time_budget * JUSTIFY_SHARE);
        let mut rng = Rng::new(req.seed ^ JUSTIFY_STREAM);
        justify::climb(inst, req.objective, best, &mut rng, &mut more, lower);
        work.evaluations += more.evaluations;
    }
    best.value < before
}

/// The lower bound on the objective: for the makespan, the simulator's, memory-aware when the
/// request has a limit ([`held_limits`]); for the span, [`span_bound`] (the busiest rank's work,
/// or more under the limit). Where fewer stage-microbatches fit from a forward to the end of its
/// `I` than to the end of its `W` ([`until_input_limits`]), also the same bounds with slots counted
/// up to `I` ([`bound_with_limit_until_input`], [`span_bound_until_input`]), the larger taken.
fn bound(inst: &Instance, req: &AutoRequest, schedule: &Schedule) -> f64 {
    // Overlap savings counted when the schedule has overlapped pairs, or when the moves may form
    // them (overlap saves time): a bound without them is none for a schedule with pairs.
    let pairs = crate::sim::has_pairs(schedule) || pairing::pairs_save(inst);
    let (p, m, placement) = (inst.p, inst.m, inst.placement);
    // Without a limit, the most a rank can hold (all `M` microbatches), which binds nothing: the
    // memory-aware bounds then add only their terms that need no binding limit (section 14, the
    // tip rank with rank 1 where microbatches are few).
    let limits = held_limits(inst).unwrap_or_else(|| vec![m as f64; p]);
    let held = match req.objective {
        Objective::Makespan => {
            let free = bound_for(p, m, placement, &req.costs, pairs);
            bound_with_limit(p, m, placement, &req.costs, pairs, &limits)
                .map_or(free, |limited| limited.max(free))
        }
        Objective::Span => {
            span_bound(p, m, placement, &req.costs, pairs, Some(&limits)).unwrap_or(0.0)
        }
    };
    let Some((limits, after)) = until_input_limits(inst) else {
        return held;
    };
    let until_input = match req.objective {
        Objective::Makespan => {
            bound_with_limit_until_input(p, m, placement, &req.costs, pairs, &limits, &after)
        }
        Objective::Span => {
            span_bound_until_input(p, m, placement, &req.costs, pairs, &limits, &after)
        }
    };
    until_input.map_or(held, |b| b.max(held))
}

/// Per rank, the two levels of holding of section 11 of the bound: every stage-microbatch holds at
/// least the least its rank's `F`s allocate (a whole slot) from its forward's start to the end of
/// its `I`, and at least the least its `W`s still release from there to the end of its `W` (that
/// share of a slot); the rank holds at most its budget over a whole slot (rank-microbatches, not
/// rounded). `None` in microbatches in flight (`I` releases nothing: one level), without a limit,
/// or where no rank's second level is below a whole slot.
fn until_input_limits(inst: &Instance) -> Option<(Vec<f64>, Vec<f64>)> {
    if inst.unit || inst.budget.iter().all(|b| b.is_infinite()) {
        return None;
    }
    let v = inst.v as f64;
    let mut limits = Vec::with_capacity(inst.p);
    let mut after = Vec::with_capacity(inst.p);
    for r in 0..inst.p {
        let least = |op: Op| {
            inst.stages_of[r]
                .iter()
                .map(|&x| match op {
                    Op::F => inst.foot[x].allocated_by(Op::F),
                    _ => inst.foot[x].released_by(Op::W),
                })
                .fold(f64::INFINITY, f64::min)
        };
        let (whole, rest) = (least(Op::F), least(Op::W));
        let budget = inst.budget[r];
        if budget.is_finite() && whole > 0.0 {
            limits.push(budget * (1.0 + MEMORY_EPS) / whole / v);
            after.push((rest / whole).max(0.0));
        } else {
            limits.push(f64::INFINITY);
            after.push(1.0);
        }
    }
    after.iter().any(|&w| w < 1.0).then_some((limits, after))
}

/// Per rank, the most rank-microbatches (a stage's microbatch counts `1/V`) that can be held from
/// a forward's start to the end of its `W` under the request's limit: the limit the memory term
/// of the bound ([`crate::sim::bound_with_limit`]) needs. `None` without a limit.
///
/// In microbatches in flight the limit is that number. In bytes, every stage-microbatch between
/// its `F` and the end of its `W` holds at least the lesser of what its `F` keeps (its input only
/// under full recomputation) and what its `I` does not release, so at most
/// `budget / (least such remainder among the rank's stages)` of them fit; a rank whose stages
/// release everything at `I` is not limited this way (infinite).
fn held_limits(inst: &Instance) -> Option<Vec<f64>> {
    if inst.budget.iter().all(|b| b.is_infinite()) {
        return None;
    }
    let limits = (0..inst.p)
        .map(|r| {
            let budget = inst.budget[r];
            if inst.unit || budget.is_infinite() {
                return budget;
            }
            let kept = inst.stages_of[r]
                .iter()
                .map(|&x| {
                    let f = &inst.foot[x];
                    f.released_by(Op::W).min(f.allocated_by(Op::F))
                })
                .fold(f64::INFINITY, f64::min);
            if kept > 0.0 {
                (budget * (1.0 + MEMORY_EPS) / kept).floor() / inst.v as f64
            } else {
                f64::INFINITY
            }
        })
        .collect();
    Some(limits)
}
