//! The improvement phase, scored by the simulator: randomised restarts of the list scheduler
//! (priority rule, `W` policy and per-rank warm-up caps drawn at random), then local moves on the
//! best schedule's lists (an item moved a few places within its rank, which moves `W`s, swaps
//! forwards and backwards and changes warm-up counts), keeping every move that is no worse.
//!
//! The budget is counted in work, not read from a clock: each simulation costs its number of actions
//! (twice that with the spans recorded, for the span objective), each construction its number of
//! actions times `3P + 1`, and one second of budget is
//! [`WORK_PER_SECOND`] units. So a result depends only on the request and the seed, on any machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::schedule::{Action, Item, Op, Schedule};

use super::critical;
use super::instance::Instance;
use super::list::{build, warmup_caps, Order, Rule, WMode};
use super::rng::Rng;
use super::score::{fits_budget, schedule_of, score_with, Checks, Scored};
use super::Objective;

/// Work units per second of budget (a simulated action and a scheduling step are one unit each;
/// measured on the development machine so that one second of budget takes about a second).
pub const WORK_PER_SECOND: f64 = 6.0e6;

/// What is left of the budget.
#[derive(Debug, Clone)]
pub(crate) struct Work {
    left: f64,
    /// Simulations run.
    pub(crate) evaluations: u64,
}

impl Work {
    /// `seconds` of budget.
    pub(crate) fn new(seconds: f64) -> Self {
        Work {
            left: seconds * WORK_PER_SECOND,
            evaluations: 0,
        }
    }

    /// Takes `units`; false when the budget was already spent, or when another run of the same
    /// request proved its schedule optimal ([`StopWhen`]).
    pub(crate) fn take(&mut self, units: f64) -> bool {
        if self.left <= 0.0 || StopWhen::stopped() {
            return false;
        }
        self.left -= units;
        true
    }

    /// Units left.
    pub(crate) fn left(&self) -> f64 {
        self.left
    }
}

thread_local! {
    /// The flag that ends this thread's budgets (see [`StopWhen`]).
    static STOP: std::cell::RefCell<Option<Arc<AtomicBool>>> = const { std::cell::RefCell::new(None) };
}

/// Ends every budget ([`Work::take`]) of the calling thread once a flag is set, for as long as
/// the guard lives: `auto` runs several searches of one request side by side, and once the
/// request's own run proves its schedule optimal the others cannot do better. Where a run stops
/// then depends on timing, and so does its evaluation count; the schedule returned does not (it
/// is the request's own run's).
pub(crate) struct StopWhen(());

impl StopWhen {
    /// Makes `flag` end the calling thread's budgets until the guard drops.
    pub(crate) fn set(flag: Arc<AtomicBool>) -> StopWhen {
        STOP.with(|s| *s.borrow_mut() = Some(flag));
        StopWhen(())
    }

    /// Whether the calling thread's flag is set.
    fn stopped() -> bool {
        STOP.with(|s| {
            s.borrow()
                .as_ref()
                .is_some_and(|f| f.load(Ordering::Relaxed))
        })
    }
}

impl Drop for StopWhen {
    fn drop(&mut self) {
        STOP.with(|s| *s.borrow_mut() = None);
    }
}

/// Candidates one list construction looks at per work unit: a look in the rule's choice takes
/// about 10 ns on the development machine, a unit 1 / [`WORK_PER_SECOND`] s.
const LOOKS_PER_UNIT: f64 = 16.0;

/// Work units of one list construction as it really runs: each of the `n` steps looks at the
/// three ops of every stage of every rank (`3 x P x V`). Used to skip a construction that cannot
/// finish within what is left (the restarts' own charge, `n x (3P + 1)`, is kept as it was, so
/// results for a seed do not change).
pub(crate) fn build_work(inst: &Instance) -> f64 {
    inst.actions() as f64 * (3.0 * inst.s as f64 + 1.0) / LOOKS_PER_UNIT
}

/// Work units of one simulation: its actions, twice with the spans recorded (span objective).
fn sim_cost(inst: &Instance, objective: Objective) -> f64 {
    let n = inst.actions() as f64;
    match objective {
        Objective::Makespan => n,
        Objective::Span => 2.0 * n,
    }
}

/// Whether `value` reaches `target` (the lower bound: nothing better exists).
fn reached(value: f64, target: f64) -> bool {
    value <= target * (1.0 + 1e-9)
}

/// Evaluates `schedule` after `checks` ([`score_with`]: [`Checks::Reordered`] for a move's
/// result), counting the work; `None` if it deadlocks or exceeds a budget.
pub(crate) fn evaluate(
    inst: &Instance,
    objective: Objective,
    schedule: Schedule,
    work: &mut Work,
    checks: Checks,
) -> Option<Scored> {
    work.evaluations += 1;
    if !fits_budget(inst, &schedule) {
        return None;
    }
    score_with(inst, objective, schedule, checks).ok().flatten()
}

/// A random rule: any priority, order and `W` policy, warm-up caps between one microbatch and the
/// limit, some random flips.
fn random_rule(inst: &Instance, rng: &mut Rng) -> Rule {
    let orders = [Order::Deep, Order::Oldest, Order::Shallow];
    let modes = [WMode::Eager, WMode::FitGap, WMode::Late];
    let mut rule = Rule::plain(
        inst.p,
        rng.below(2) == 0,
        orders[rng.below(3)],
        modes[rng.below(3)],
    );
    if rng.below(3) > 0 {
        let slope = [0.5, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0][rng.below(8)];
        let offset = rng.below(5) as f64 - 2.0;
        rule.soft = warmup_caps(inst.p, slope, offset);
    }
    rule.flip = [0.0, 0.05, 0.2][rng.below(3)];
    rule.seed = rng.next_u64();
    rule
}

/// Randomised restarts until `share` of the budget is spent; improves `best` in place.
pub(crate) fn restarts(
    inst: &Instance,
    objective: Objective,
    best: &mut Scored,
    rng: &mut Rng,
    work: &mut Work,
    share: f64,
    target: f64,
) {
    let n = inst.actions() as f64;
    let stop = work.left() * (1.0 - share);
    while work.left() > stop && !reached(best.value, target) && build_work(inst) <= work.left() {
        let rule = random_rule(inst, rng);
        if !work.take(n * (3.0 * inst.p as f64 + 1.0) + sim_cost(inst, objective)) {
            break;
        }
        let Some(orders) = build(inst, &rule) else {
            continue;
        };
        if let Some(s) = evaluate(
            inst,
            objective,
            schedule_of(inst, "auto", &orders),
            work,
            Checks::Full,
        ) {
            if s.value < best.value {
                *best = s;
            }
        }
    }
}

/// The moves [`climb`] tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moves {
    /// One item moved a few places within its rank.
    Short,
    /// Moves that reshape a rank's list where the short moves rarely reach: one `W` moved
    /// anywhere after its `I` (the position of the weight passes), or one forward moved over the
    /// backward passes between it and the previous or next forward (how many forwards the rank
    /// runs ahead: its warm-up depth, and its depth at every later point).
    Reshape,
    /// Moves on the critical path (module `critical`: a block's first or last two swapped, one
    /// of its actions moved to its start or end), three in four; the rest [`Moves::Short`].
    Critical,
    /// One microbatch overtaking another from a stage on: two microbatches' labels swapped on
    /// every action of that stage and the stages after it (so the later one runs first there
    /// and every rank's order stays as it was), half of them; the rest [`Moves::Short`].
    Overtake,
}

/// Tries `moves` on `best` (half of them on the rank whose span is the objective, when there is
/// one), each scored like every candidate (the simulator, the limit by the instance's
/// accounting) and kept when no worse, until the budget is spent or the target is reached.
pub(crate) fn climb(
    inst: &Instance,
    objective: Objective,
    best: &mut Scored,
    rng: &mut Rng,
    work: &mut Work,
    target: f64,
    moves: Moves,
) {
    // The critical chain of `best`, read again after each move kept (it costs one simulation).
    let mut chain: Option<critical::Chain> = None;
    let mut stale = true;
    while !reached(best.value, target) && work.take(sim_cost(inst, objective)) {
        let focus = best.worst.filter(|_| rng.below(2) == 0);
        let candidate = match moves {
            Moves::Critical if rng.below(4) > 0 => {
                if stale {
                    let goal = match best.worst {
                        Some(r) => critical::Target::Rank(r),
                        None => critical::Target::Makespan,
                    };
                    chain = critical::Chain::of(inst, &best.schedule, goal);
                    work.take(sim_cost(inst, Objective::Span));
                    stale = false;
                }
                chain
                    .as_ref()
                    .and_then(|c| critical::moved(&best.schedule, c, rng))
            }
            Moves::Overtake if rng.below(2) == 0 => overtaken(&best.schedule, rng),
            Moves::Short | Moves::Critical | Moves::Overtake => moved(&best.schedule, focus, rng),
            Moves::Reshape => {
                let r = focus.unwrap_or_else(|| rng.below(best.schedule.ranks));
                if rng.below(2) == 0 {
                    w_moved(&best.schedule, r, rng)
                } else {
                    depth_moved(&best.schedule, r, rng)
                }
            }
        };
        let Some(candidate) = candidate else {
            continue;
        };
        if let Some(s) = evaluate(inst, objective, candidate, work, Checks::Reordered) {
            if s.value <= best.value {
                *best = s;
                stale = true;
            }
        }
    }
}

/// `schedule` with one item moved a few places within its rank (`rank`, or one at random); `None` when the move would put an
/// item before one of the same stage and microbatch it needs (or after one that needs it).
fn moved(schedule: &Schedule, rank: Option<usize>, rng: &mut Rng) -> Option<Schedule> {
    let r = rank.unwrap_or_else(|| rng.below(schedule.ranks));
    let list = &schedule.actions[r];
    if list.len() < 2 {
        return None;
    }
    let i = rng.below(list.len());
    let reach = 1 + rng.below(4 * schedule.chunks + 2);
    let j = if rng.below(2) == 0 {
        i.checked_sub(reach)?
    } else {
        (i + reach).min(list.len() - 1)
    };
    if i == j {
        return None;
    }
    let (lo, hi) = (i.min(j), i.max(j));
    let item = list[i];
    let between = if i < j { lo + 1..=hi } else { lo..=hi - 1 };
    if list[between].iter().any(|other| shares_pair(&item, other)) {
        return None;
    }
    let mut s = schedule.clone();
    let it = s.actions[r].remove(i);
    s.actions[r].insert(j, it);
    Some(s)
}

/// The single action of `item` when it is one `op` pass.
fn single(item: &Item, op: Op) -> Option<Action> {
    match item {
        Item::One(a) if a.op == op => Some(*a),
        _ => None,
    }
}

/// `schedule` with one `W` of rank `r` moved to a random place after its own `I`.
fn w_moved(schedule: &Schedule, r: usize, rng: &mut Rng) -> Option<Schedule> {
    let list = &schedule.actions[r];
    let ws: Vec<usize> = (0..list.len())
        .filter(|&i| single(&list[i], Op::W).is_some())
        .collect();
    let &i = ws.get(rng.below(ws.len().max(1)))?;
    let w = single(&list[i], Op::W)?;
    let own_i = list.iter().position(|it| {
        it.actions()
            .any(|a| a.op == Op::I && (a.stage, a.microbatch) == (w.stage, w.microbatch))
    })?;
    // Without the `W`, the list has `len - 1` items; it may go back anywhere after its `I`.
    let places = list.len() - 1 - own_i;
    if places < 2 {
        return None;
    }
    let j = own_i + 1 + rng.below(places);
    if j == i {
        return None;
    }
    let mut s = schedule.clone();
    let it = s.actions[r].remove(i);
    s.actions[r].insert(j, it);
    Some(s)
}

/// `schedule` with one forward of rank `r` moved over the items between it and the forward one
/// or two places before it (just after that one) or after it (just before that one).
fn depth_moved(schedule: &Schedule, r: usize, rng: &mut Rng) -> Option<Schedule> {
    let list = &schedule.actions[r];
    let fs: Vec<usize> = (0..list.len())
        .filter(|&i| single(&list[i], Op::F).is_some())
        .collect();
    let k = rng.below(fs.len().max(1));
    let &i = fs.get(k)?;
    let hop = 1 + rng.below(2);
    let j = if rng.below(2) == 0 {
        // Earlier: just after the forward `hop` places before (or to the front).
        k.checked_sub(hop).map_or(0, |q| fs[q] + 1)
    } else {
        // Later: just before the forward `hop` places after (or to the end).
        fs.get(k + hop).map_or(list.len() - 1, |&q| q - 1)
    };
    if j == i {
        return None;
    }
    let (lo, hi) = (i.min(j), i.max(j));
    let item = list[i];
    let between = if i < j { lo + 1..=hi } else { lo..=hi - 1 };
    // Nothing of the same microbatch is passed over (its own backwards, or on V-shape the
    // forward of the neighbouring stage on this rank, which it needs or which needs it).
    let k = single(&item, Op::F)?.microbatch;
    if list[between]
        .iter()
        .any(|other| other.actions().any(|a| a.microbatch == k))
    {
        return None;
    }
    let mut s = schedule.clone();
    let it = s.actions[r].remove(i);
    s.actions[r].insert(j, it);
    Some(s)
}

/// `schedule` with microbatches `k` and `k + d` (`d` 1 or 2) swapped on every action of stage `x`
/// and the stages after it: from `x` on, `k + d` takes `k`'s place in every rank's order (it
/// overtakes `k` between stages `x - 1` and `x`), and the gradients pass back in the same swapped
/// order down to `x`. `None` for a single stage or microbatch.
fn overtaken(schedule: &Schedule, rng: &mut Rng) -> Option<Schedule> {
    let stages = schedule.ranks * schedule.chunks;
    let m = schedule.microbatches;
    if stages < 2 || m < 2 {
        return None;
    }
    let x = 1 + rng.below(stages - 1);
    let d = 1 + rng.below(2.min(m - 1));
    let k = rng.below(m - d);
    let swap = |a: Action| {
        if a.stage < x {
            a
        } else if a.microbatch == k {
            Action::new(a.op, a.stage, k + d)
        } else if a.microbatch == k + d {
            Action::new(a.op, a.stage, k)
        } else {
            a
        }
    };
    let mut s = schedule.clone();
    for list in &mut s.actions {
        for item in list.iter_mut() {
            *item = match *item {
                Item::One(a) => Item::One(swap(a)),
                Item::Overlap { forward, backward } => Item::Overlap {
                    forward: swap(forward),
                    backward: swap(backward),
                },
                other => other,
            };
        }
    }
    Some(s)
}

/// Whether two items touch the same (stage, microbatch).
fn shares_pair(a: &Item, b: &Item) -> bool {
    a.actions().any(|x| {
        b.actions()
            .any(|y| (x.stage, x.microbatch) == (y.stage, y.microbatch))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::families::generate;
    use crate::schedule::validate::validate;
    use crate::schedule::Params;

    /// Forwards before the first backward on each rank.
    fn depths(s: &Schedule) -> Vec<usize> {
        s.actions
            .iter()
            .map(|l| l.iter().take_while(|i| single(i, Op::F).is_some()).count())
            .collect()
    }

    /// Whether every rank runs F, I, W of each of its stage-microbatches in that order.
    fn in_order(s: &Schedule) -> bool {
        s.actions.iter().all(|list| {
            let pos = |op: Op, a: Action| {
                list.iter().position(|i| {
                    single(i, op)
                        .is_some_and(|b| (b.stage, b.microbatch) == (a.stage, a.microbatch))
                })
            };
            list.iter().filter_map(|i| single(i, Op::I)).all(|a| {
                let i = pos(Op::I, a);
                pos(Op::F, a) < i && i < pos(Op::W, a)
            })
        })
    }

    #[test]
    fn reshaping_moves_keep_rank_orders_and_reach_depths_and_w_places() {
        let base = generate("zbv", &Params::new(4, 8).with_chunks(2)).unwrap();
        let mut rng = Rng::new(3);
        let (mut deeper, mut w_changed, mut runs) = (0, 0, 0);
        for n in 0..400 {
            let r = (n / 2) % base.ranks;
            let moved = if n % 2 == 0 {
                w_moved(&base, r, &mut rng)
            } else {
                depth_moved(&base, r, &mut rng)
            };
            let Some(s) = moved else { continue };
            // Every move keeps F, I, W of a stage-microbatch in order on its rank (a move may
            // still deadlock across ranks: the simulator refuses those, and the search with them).
            assert!(in_order(&s), "{:?}", s.actions[r]);
            assert_ne!(s.actions, base.actions);
            runs += usize::from(validate(&s).is_ok());
            if n % 2 == 0 {
                w_changed += 1;
                assert_eq!(depths(&s), depths(&base));
            } else {
                deeper += usize::from(depths(&s)[r] != depths(&base)[r]);
            }
        }
        assert!(w_changed > 50, "{w_changed}");
        assert!(deeper > 0, "no move changed a warm-up depth");
        assert!(runs > 50, "{runs}");
    }

    /// An overtaking move swaps two microbatches from a stage on: every rank keeps the shape of
    /// its order (the same op and stage at every place), F, I, W of a stage-microbatch stay in
    /// order, and from that stage the later microbatch's forward comes first. Many validate;
    /// where a rank also holds a stage below the swap, the later microbatch's forward can land
    /// before that microbatch's own lower-stage forward on the rank (a deadlock across ranks),
    /// and the simulator refuses those, as it does in the search (here 87 of 200 validate).
    #[test]
    fn overtaking_moves_keep_rank_shapes_and_reorder_from_a_stage_on() {
        let base = generate("zbv", &Params::new(4, 8).with_chunks(2)).unwrap();
        let mut rng = Rng::new(5);
        let (mut overtook, mut runs) = (0, 0);
        for _ in 0..200 {
            let s = overtaken(&base, &mut rng).unwrap();
            runs += usize::from(validate(&s).is_ok());
            assert!(in_order(&s));
            let kinds = |x: &Schedule| -> Vec<Vec<(Op, usize)>> {
                x.actions
                    .iter()
                    .map(|l| {
                        l.iter()
                            .flat_map(|i| i.actions().map(|a| (a.op, a.stage)))
                            .collect()
                    })
                    .collect()
            };
            assert_eq!(kinds(&s), kinds(&base));
            // Somewhere a stage's forwards now run out of microbatch order.
            overtook += usize::from(s.actions.iter().any(|l| {
                let fs: Vec<Action> = l.iter().filter_map(|i| single(i, Op::F)).collect();
                fs.iter().enumerate().any(|(j, a)| {
                    fs[j + 1..]
                        .iter()
                        .any(|b| b.stage == a.stage && b.microbatch < a.microbatch)
                })
            }));
        }
        assert!(overtook > 100, "{overtook}");
        assert!(runs > 50, "{runs}");
    }
}
