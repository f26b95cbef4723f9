//! Validation: proves a schedule can run.
//!
//! [`validate`] checks, in this order, and stops at the first problem:
//!
//! 1. the header: `P >= 1`, `V >= 1`, `M >= 1`, one list per rank, `V = 2` for `vshape`;
//! 2. each action, in each rank's list order: stage `< P*V`, microbatch `< M`, on the rank its placement
//!    gives, not a duplicate, `B` and `I`/`W` not mixed for one (stage, microbatch), `F` before its
//!    `I`/`B`, `I` before its `W` (an overlapped pair's halves count as one position, so a pair cannot hold
//!    the forward and the backward of the same (stage, microbatch));
//! 3. completeness: every (stage, microbatch) has one `F` and either one `B` or one `I` and one `W`;
//! 4. a dependency-driven dry run: each rank runs its list in order; an item starts once its
//!    dependencies ran (`F(s,k)` needs `F(s-1,k)`; `I/B(s,k)` needs `F(s,k)` and `I/B(s+1,k)`, the last
//!    stage's backward only its own `F`; `W(s,k)` needs `I(s,k)`; an overlapped pair needs both halves
//!    ready). If every rank finishes, the schedule runs; otherwise the error lists the waiting ranks.
//!
//! Errors name the rank, the position and the action and show the rank lists around it.
//! The dry run is event driven and costs O(actions): a rank is looked at again only when an action it
//! may be waiting for completes.
//!
//! The [`ValidationReport`] gives each rank's peak in-flight activations and the slot each item gets
//! when every item takes one time slot (the dry run's as-soon-as-possible timing), which the text
//! grid of [`format`](super::format) draws.

use std::collections::VecDeque;

use super::format::context_grid;
use super::{Action, Item, Op, Placement, Schedule, ScheduleError, Wait};

/// What a valid schedule looks like when run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationReport {
    /// Per rank, the largest number of (stage, microbatch) activations held at once, counted in the
    /// rank's list order: a (stage, microbatch) is in flight from its `F` until the end of its `B`, or
    /// of its `W` when the backward is split. Units: microbatch-stages (one stage's activations for one
    /// microbatch). In an overlapped pair the forward is counted before the backward releases.
    pub peak_in_flight: Vec<usize>,
    /// Per rank, per item, the time slot at which the item starts when every item takes one slot and
    /// starts as soon as its rank is free and its dependencies have finished.
    pub slots: Vec<Vec<usize>>,
    /// Number of slots until the last item finishes (the unit-time makespan).
    pub makespan_slots: usize,
}

/// Checks that `schedule` can run; see the [module docs](self) for what is checked.
///
/// ```
/// use pipefill_host::schedule::{families, validate::validate, Params};
/// # fn main() -> Result<(), pipefill_host::schedule::ScheduleError> {
/// let s = families::generate("1f1b", &Params::new(4, 8))?;
/// let report = validate(&s)?;
/// assert_eq!(report.peak_in_flight, vec![4, 3, 2, 1]);
/// # Ok(())
/// # }
/// ```
pub fn validate(schedule: &Schedule) -> Result<ValidationReport, ScheduleError> {
    check_header(schedule)?;
    let peak_in_flight = check_lists(schedule)?;
    let (slots, makespan_slots) = dry_run(schedule)?;
    Ok(ValidationReport {
        peak_in_flight,
        slots,
        makespan_slots,
    })
}

/// Header checks; also bounds `S * M` by the number of actions so a bogus header cannot make the
/// checker allocate more than a few words per action.
fn check_header(s: &Schedule) -> Result<(), ScheduleError> {
    let invalid = |m: String| Err(ScheduleError::Invalid(m));
    if s.ranks == 0 {
        return invalid("ranks (P) must be at least 1".into());
    }
    if s.chunks == 0 {
        return invalid("chunks (V) must be at least 1".into());
    }
    if s.microbatches == 0 {
        return invalid("microbatches (M) must be at least 1".into());
    }
    if s.placement == Placement::Vshape && s.chunks != 2 {
        return invalid(format!(
            "placement vshape needs chunks (V) = 2, got {}; use V = 2 or placement looped",
            s.chunks
        ));
    }
    if s.actions.len() != s.ranks {
        return invalid(format!(
            "ranks (P) is {} but there are {} rank lists; give one list per rank",
            s.ranks,
            s.actions.len()
        ));
    }
    let pairs = s
        .ranks
        .checked_mul(s.chunks)
        .and_then(|x| x.checked_mul(s.microbatches));
    // A complete schedule holds at least 2 actions per pair; fewer than 1 per pair means the header
    // is wrong (a few missing actions are reported one by one by the completeness check instead).
    match pairs {
        Some(n) if n <= s.action_count() => Ok(()),
        _ => invalid(format!(
            "P*V*M = {}*{}*{} (stage, microbatch) pairs need at least {} actions (an F and a B each), \
             but the lists hold {}; fix ranks, chunks or microbatches, or add the missing actions",
            s.ranks,
            s.chunks,
            s.microbatches,
            pairs.map_or("too many".to_string(), |n| n.saturating_mul(2).to_string()),
            s.action_count()
        )),
    }
}

/// Which ops of one (stage, microbatch) have been seen so far.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    f: bool,
    b: bool,
    i: bool,
    w: bool,
}

impl Seen {
    fn has(&self, op: Op) -> bool {
        match op {
            Op::F => self.f,
            Op::B => self.b,
            Op::I => self.i,
            Op::W => self.w,
        }
    }

    fn set(&mut self, op: Op) {
        match op {
            Op::F => self.f = true,
            Op::B => self.b = true,
            Op::I => self.i = true,
            Op::W => self.w = true,
        }
    }
}

/// Per-action checks in list order, then completeness; returns the peak in-flight per rank.
fn check_lists(s: &Schedule) -> Result<Vec<usize>, ScheduleError> {
    let m = s.microbatches;
    let mut seen = vec![Seen::default(); s.stages() * m];
    let mut peaks = Vec::with_capacity(s.ranks);
    for (rank, list) in s.actions.iter().enumerate() {
        let (mut live, mut peak) = (0usize, 0usize);
        for (pos, item) in list.iter().enumerate() {
            let bad = |problem: String| bad_action(s, rank, pos, problem);
            if let Item::Overlap { forward, backward } = item {
                if (forward.stage, forward.microbatch) == (backward.stage, backward.microbatch) {
                    return Err(bad(
                        "an overlapped pair cannot hold the forward and the backward of the same \
                         (stage, microbatch); put the forward in an earlier position"
                            .into(),
                    ));
                }
            }
            for a in item.actions() {
                check_action(s, rank, a, &seen).map_err(bad)?;
                let key = a.stage * m + a.microbatch;
                seen[key].set(a.op);
                match a.op {
                    Op::F => {
                        live += 1;
                        peak = peak.max(live);
                    }
                    Op::B | Op::W => live = live.saturating_sub(1),
                    Op::I => {}
                }
            }
        }
        peaks.push(peak);
    }
    check_complete(s, &seen)?;
    Ok(peaks)
}

/// One action against the header, its placement, and what its rank has already run.
fn check_action(s: &Schedule, rank: usize, a: Action, seen: &[Seen]) -> Result<(), String> {
    let stages = s.stages();
    if a.stage >= stages {
        return Err(format!(
            "stage {} is out of range: P*V = {} stages, so stages are 0..={}",
            a.stage,
            stages,
            stages - 1
        ));
    }
    if a.microbatch >= s.microbatches {
        return Err(format!(
            "microbatch {} is out of range: M = {}, so microbatches are 0..={}",
            a.microbatch,
            s.microbatches,
            s.microbatches - 1
        ));
    }
    let home = s.rank_of(a.stage);
    if home != rank {
        return Err(format!(
            "stage {} belongs on rank {} under {} placement (P = {}); move `{a}` to rank {}'s list",
            a.stage, home, s.placement, s.ranks, home
        ));
    }
    let st = seen[a.stage * s.microbatches + a.microbatch];
    if st.has(a.op) {
        return Err(format!(
            "duplicate: `{a}` already appears earlier in rank {rank}'s list; keep only one"
        ));
    }
    let (f, g) = (a.stage, a.microbatch);
    match a.op {
        Op::F => Ok(()),
        Op::B if st.i || st.w => Err(format!(
            "stage {f} microbatch {g} already has a split backward (I/W); use either B or I and W"
        )),
        Op::I if st.b => Err(format!(
            "stage {f} microbatch {g} already has a full backward (B); use either B or I and W"
        )),
        Op::W if st.b => Err(format!(
            "stage {f} microbatch {g} already has a full backward (B); use either B or I and W"
        )),
        Op::B | Op::I if !st.f => Err(format!(
            "the backward runs before its forward `{f}F{g}`; move `{f}F{g}` to an earlier position"
        )),
        Op::W if !st.i => Err(format!(
            "the weight backward runs before its input backward `{f}I{g}`; move `{f}I{g}` earlier"
        )),
        _ => Ok(()),
    }
}

/// Every (stage, microbatch) has `F` and `B`, or `F`, `I` and `W`.
fn check_complete(s: &Schedule, seen: &[Seen]) -> Result<(), ScheduleError> {
    let m = s.microbatches;
    for (key, st) in seen.iter().enumerate() {
        let (stage, microbatch) = (key / m, key % m);
        let rank = s.rank_of(stage);
        let missing = if !st.f {
            Some(format!(
                "no forward; add `{stage}F{microbatch}` to rank {rank}"
            ))
        } else if st.i && !st.w {
            Some(format!(
                "`{stage}I{microbatch}` has no weight backward; add `{stage}W{microbatch}` after it on rank {rank}"
            ))
        } else if !st.b && !st.i {
            Some(format!(
                "no backward; add `{stage}B{microbatch}` (or `{stage}I{microbatch}` and `{stage}W{microbatch}`) to rank {rank}"
            ))
        } else {
            None
        };
        if let Some(problem) = missing {
            return Err(ScheduleError::Incomplete {
                stage,
                microbatch,
                problem,
            });
        }
    }
    Ok(())
}

/// Builds a [`ScheduleError::BadAction`] with the grid around the action.
fn bad_action(s: &Schedule, rank: usize, position: usize, problem: String) -> ScheduleError {
    ScheduleError::BadAction {
        rank,
        position,
        item: s.actions[rank][position].to_string(),
        problem,
        grid: context_grid(s, &[(rank, position)]),
    }
}

/// Finish slot of every (stage, microbatch)'s forward and of its input-gradient backward (`B` or `I`);
/// `NOT_RUN` until it ran.
struct Done {
    forward: Vec<usize>,
    grad: Vec<usize>,
}

const NOT_RUN: usize = usize::MAX;

/// The dependency-driven dry run; returns each item's unit-time start slot and the makespan.
fn dry_run(s: &Schedule) -> Result<(Vec<Vec<usize>>, usize), ScheduleError> {
    let m = s.microbatches;
    let mut done = Done {
        forward: vec![NOT_RUN; s.stages() * m],
        grad: vec![NOT_RUN; s.stages() * m],
    };
    let mut next = vec![0usize; s.ranks];
    let mut free_at = vec![0usize; s.ranks];
    let mut slots: Vec<Vec<usize>> = s.actions.iter().map(|l| vec![0; l.len()]).collect();
    let mut queued = vec![true; s.ranks];
    let mut work: VecDeque<usize> = (0..s.ranks).collect();
    while let Some(rank) = work.pop_front() {
        queued[rank] = false;
        while let Some(item) = s.actions[rank].get(next[rank]) {
            let Some(ready_at) = ready_time(s, &done, item) else {
                break;
            };
            let start = ready_at.max(free_at[rank]);
            slots[rank][next[rank]] = start;
            free_at[rank] = start + 1;
            next[rank] += 1;
            for a in item.actions() {
                if let Some(woken) = complete(s, &mut done, a, start + 1) {
                    if !queued[woken] {
                        queued[woken] = true;
                        work.push_back(woken);
                    }
                }
            }
        }
    }
    if next.iter().zip(&s.actions).any(|(n, l)| *n < l.len()) {
        return Err(deadlock(s, &done, &next));
    }
    Ok((slots, free_at.into_iter().max().unwrap_or(0)))
}

/// The first dependency of `a` that has not run, if any.
fn missing_dep(s: &Schedule, done: &Done, a: Action) -> Option<Action> {
    let m = s.microbatches;
    let key = a.stage * m + a.microbatch;
    let last = s.stages() - 1;
    let dep = match a.op {
        Op::F if a.stage > 0 && done.forward[key - m] == NOT_RUN => {
            Action::new(Op::F, a.stage - 1, a.microbatch)
        }
        Op::B | Op::I if done.forward[key] == NOT_RUN => Action::new(Op::F, a.stage, a.microbatch),
        Op::B | Op::I if a.stage < last && done.grad[key + m] == NOT_RUN => {
            Action::new(Op::I, a.stage + 1, a.microbatch)
        }
        Op::W if done.grad[key] == NOT_RUN => Action::new(Op::I, a.stage, a.microbatch),
        _ => return None,
    };
    Some(dep)
}

/// The slot at which all dependencies of `item` have finished, or `None` if one has not run.
fn ready_time(s: &Schedule, done: &Done, item: &Item) -> Option<usize> {
    let m = s.microbatches;
    let last = s.stages() - 1;
    let mut at = 0;
    for a in item.actions() {
        if missing_dep(s, done, a).is_some() {
            return None;
        }
        let key = a.stage * m + a.microbatch;
        let t = match a.op {
            Op::F if a.stage > 0 => done.forward[key - m],
            Op::F => 0,
            Op::B | Op::I if a.stage < last => done.forward[key].max(done.grad[key + m]),
            Op::B | Op::I => done.forward[key],
            Op::W => done.grad[key],
        };
        at = at.max(t);
    }
    Some(at)
}

/// Records that `a` finished at slot `end`; returns the ranks that may have been waiting for it.
fn complete(s: &Schedule, done: &mut Done, a: Action, end: usize) -> Option<usize> {
    let m = s.microbatches;
    let key = a.stage * m + a.microbatch;
    match a.op {
        Op::F => {
            done.forward[key] = end;
            (a.stage + 1 < s.stages()).then(|| s.rank_of(a.stage + 1))
        }
        Op::B | Op::I => {
            done.grad[key] = end;
            a.stage.checked_sub(1).map(|prev| s.rank_of(prev))
        }
        Op::W => None,
    }
}

/// Describes the ranks stuck when the dry run stopped.
fn deadlock(s: &Schedule, done: &Done, next: &[usize]) -> ScheduleError {
    let mut waits = Vec::new();
    let mut marks = Vec::new();
    for (rank, &pos) in next.iter().enumerate() {
        let Some(item) = s.actions[rank].get(pos) else {
            continue;
        };
        let needs = item.actions().find_map(|a| missing_dep(s, done, a));
        if let Some(needs) = needs {
            let needs_rank = s.rank_of(needs.stage);
            let (needs, needs_position) = locate(s, needs, needs_rank);
            waits.push(Wait {
                rank,
                position: pos,
                item: item.to_string(),
                needs,
                needs_rank,
                needs_position,
            });
            marks.push((rank, pos));
        }
    }
    ScheduleError::Deadlock {
        waits,
        grid: context_grid(s, &marks),
    }
}

/// Finds the action a waiting rank needs in its rank's list. A needed input gradient is written `I` by
/// [`missing_dep`]; the schedule may hold it as `B`, and this returns the action as written.
fn locate(s: &Schedule, needs: Action, rank: usize) -> (Action, usize) {
    let matches = |a: &Action| {
        (a.stage, a.microbatch) == (needs.stage, needs.microbatch)
            && (a.op == needs.op || (needs.op == Op::I && a.op == Op::B))
    };
    s.actions[rank]
        .iter()
        .enumerate()
        .find_map(|(pos, it)| it.actions().find(matches).map(|a| (a, pos)))
        .unwrap_or((needs, s.actions[rank].len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(ranks: usize, chunks: usize, m: usize, lists: &[&str]) -> Schedule {
        Schedule {
            name: "t".into(),
            ranks,
            chunks,
            microbatches: m,
            placement: Placement::Looped,
            actions: lists
                .iter()
                .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
                .collect(),
        }
    }

    #[test]
    fn accepts_a_small_1f1b_and_counts_peaks() {
        let s = sched(2, 1, 2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
        let r = validate(&s).unwrap();
        assert_eq!(r.peak_in_flight, vec![2, 1]);
        // 1F1 waits for rank 1 to be free (slot 3) although 0F1 ended at slot 2.
        assert_eq!(r.slots, vec![vec![0, 1, 3, 5], vec![1, 2, 3, 4]]);
        assert_eq!(r.makespan_slots, 6);
    }

    #[test]
    fn split_backward_peak_ends_at_w() {
        let s = sched(1, 1, 2, &["0F0 0I0 0F1 0W0 0I1 0W1"]);
        assert_eq!(validate(&s).unwrap().peak_in_flight, vec![2]);
    }

    #[test]
    fn wrong_rank_names_rank_position_and_fix() {
        let s = sched(2, 1, 1, &["0F0 1B0 0B0", "1F0"]);
        let e = validate(&s).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(
                e,
                ScheduleError::BadAction {
                    rank: 0,
                    position: 1,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(msg.contains("rank 1"), "{msg}");
        assert!(msg.contains("[1B0]"), "{msg}");
    }

    #[test]
    fn duplicate_and_order_errors() {
        let dup = sched(1, 1, 1, &["0F0 0F0 0B0"]);
        assert!(validate(&dup)
            .unwrap_err()
            .to_string()
            .contains("duplicate"));
        let order = sched(1, 1, 1, &["0B0 0F0"]);
        let e = validate(&order).unwrap_err();
        assert!(matches!(e, ScheduleError::BadAction { position: 0, .. }));
        let w_first = sched(1, 1, 1, &["0F0 0W0 0I0"]);
        assert!(validate(&w_first).unwrap_err().to_string().contains("0I0"));
        let mixed = sched(1, 1, 1, &["0F0 0B0 0W0"]);
        assert!(validate(&mixed)
            .unwrap_err()
            .to_string()
            .contains("either B or I and W"));
    }

    #[test]
    fn incomplete_is_reported() {
        let missing_b = sched(2, 1, 2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1"]);
        let e = validate(&missing_b).unwrap_err();
        assert!(
            matches!(
                e,
                ScheduleError::Incomplete {
                    stage: 1,
                    microbatch: 1,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("add `1B1`"), "{e}");
        let s = sched(1, 1, 2, &["0F0 0B0 0F1 0I1"]);
        let e = validate(&s).unwrap_err();
        assert!(
            matches!(
                e,
                ScheduleError::Incomplete {
                    stage: 0,
                    microbatch: 1,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn header_errors() {
        let mut s = sched(2, 1, 1, &["0F0 0B0", "1F0 1B0"]);
        s.ranks = 3;
        assert!(matches!(validate(&s), Err(ScheduleError::Invalid(_))));
        let mut big = sched(2, 1, 1, &["0F0 0B0", "1F0 1B0"]);
        big.microbatches = usize::MAX / 2;
        assert!(matches!(validate(&big), Err(ScheduleError::Invalid(_))));
    }

    #[test]
    fn deadlock_names_the_waiting_ranks() {
        // Rank 0 waits for 1B1's gradient before forwarding microbatch 1; rank 1 waits for 0F1.
        let s = sched(2, 1, 2, &["0F0 0B1 0F1 0B0", "1F0 1F1 1B0 1B1"]);
        let e = validate(&s);
        // 0B1 before 0F1 is an order error, caught before the dry run.
        assert!(matches!(e, Err(ScheduleError::BadAction { .. })));
        let s = sched(2, 1, 2, &["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"]);
        match validate(&s) {
            Err(ScheduleError::Deadlock { waits, grid }) => {
                assert_eq!(waits.len(), 2, "{waits:?}");
                assert_eq!(waits[0].rank, 0);
                assert_eq!(waits[0].needs, Action::new(Op::B, 1, 0));
                assert_eq!(waits[0].needs_position, 2);
                assert_eq!(waits[1].rank, 1);
                assert_eq!(waits[1].needs, Action::new(Op::F, 0, 1));
                assert!(grid.contains("[0B0]") && grid.contains("[1F1]"), "{grid}");
            }
            other => panic!("expected a deadlock, got {other:?}"),
        }
    }

    #[test]
    fn overlap_needs_both_halves_ready() {
        // Rank 1 overlaps 1F1 with 1B0; fine once 0F1 ran.
        let s = sched(
            2,
            1,
            2,
            &["0F0 0F1 0B0 0B1", "1F0 (1F1;1B0)OVERLAP_F_B 1B1"],
        );
        let r = validate(&s).unwrap();
        assert_eq!(r.peak_in_flight, vec![2, 2]);
        let same = sched(1, 1, 1, &["(0F0;0B0)OVERLAP_F_B"]);
        assert!(matches!(
            validate(&same),
            Err(ScheduleError::BadAction { .. })
        ));
    }
}
