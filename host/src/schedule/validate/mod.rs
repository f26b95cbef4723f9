//! Validation: proves a schedule can run.
//!
//! [`validate`] checks, in this order, and stops at the first problem:
//!
//! 1. the header: `P >= 1`, `V >= 1`, `M >= 1`, one list per rank, `V = 2` for `vshape`;
//! 2. each item, in each rank's list order (`lists.rs`): stage `< P*V`, microbatch `< M`, on the rank
//!    its placement gives, not a duplicate, `B` and `I`/`W` not mixed for one (stage, microbatch),
//!    what it [needs](super::deps) on its own stage earlier in the list (`F` before its `I`/`B`, `I`
//!    before its `W`; an overlapped pair's halves count as one position, so a pair cannot hold the
//!    forward and the backward of the same (stage, microbatch)). In a schedule with transfers (any
//!    `SEND_*` / `RECV_*`, see [`lower`](super::lower)): every send and receive names a boundary between
//!    stages on different ranks, sits on the rank of its end, a send comes after the action that
//!    produced its data, and each input that crosses ranks is received before the action that uses
//!    it. `REDUCE_GRAD` of a stage comes after the stage's last `W`/`B`; a stage with `UNSHARD` /
//!    `RESHARD` computes only while unsharded;
//! 3. completeness: every (stage, microbatch) has one `F` and either one `B` or one `I` and one `W`;
//!    with transfers, every boundary crossing has its send and its receive;
//! 4. a dependency-driven dry run (`dry_run.rs`): each rank runs its list in order; an item starts
//!    once what it needs ran. With transfers, as PyTorch's runtime runs them: a receive is posted at
//!    once, the compute that uses its data starts once the send ran, and a send's wait once the
//!    peer's receive was posted. If every rank finishes, the schedule runs;
//!    otherwise the error ([`ScheduleError::Deadlock`]) lists the waiting ranks and what each waits for.
//!
//! Errors name the rank, the position and the action and show the rank lists around it.
//! The dry run is event driven and costs O(actions): a rank is looked at again only when an item it
//! may be waiting for completes.
//!
//! The [`ValidationReport`] gives each rank's peak in-flight activations (counted by
//! [`deps::InFlight`](super::deps::InFlight)) and the slot each item gets when every item takes one
//! time slot (the dry run's as-soon-as-possible timing), which the text grid of
//! [`format`](super::format) draws.

use super::{Placement, Schedule, ScheduleError};

mod dry_run;
mod lists;

pub(crate) use dry_run::deadlock;

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
    let peak_in_flight = check_static(schedule)?;
    let (slots, makespan_slots) = dry_run::dry_run(schedule)?;
    Ok(ValidationReport {
        peak_in_flight,
        slots,
        makespan_slots,
    })
}

/// Steps 1 to 3 of [`validate`] (everything but the dry run), returning the peak in-flight count per
/// rank. The simulator runs these checks and then its own timed run, which finds the deadlocks the
/// dry run finds, so both accept exactly the same schedules.
pub fn check_static(schedule: &Schedule) -> Result<Vec<usize>, ScheduleError> {
    check_static_lowered(schedule).map(|(peak, _)| peak)
}

/// [`check_static`], also telling whether the schedule carries transfers ([`has_transfers`]).
/// A compute-only schedule that validates is checked in one pass over its lists; anything else
/// (transfers, parameter operations, a problem to report) takes the full checks.
pub(crate) fn check_static_lowered(
    schedule: &Schedule,
) -> Result<(Vec<usize>, bool), ScheduleError> {
    check_fields(schedule)?;
    let items: usize = schedule.actions.iter().map(Vec::len).sum();
    // An item holds at most 2 actions, so `pairs <= 2 * items` is necessary for the count check
    // below and bounds what the one-pass check allocates.
    if let Some(pairs) = header_pairs(schedule).filter(|&n| n <= items.saturating_mul(2)) {
        if let Some(peak) = lists::check_compute_only(schedule, pairs) {
            return Ok((peak, false));
        }
    }
    check_pairs(schedule)?;
    let lowered = has_transfers(schedule);
    Ok((lists::check_lists(schedule, lowered)?, lowered))
}

/// `true` when the schedule carries its transfers (any `SEND_*` / `RECV_*` item).
pub fn has_transfers(schedule: &Schedule) -> bool {
    schedule
        .actions
        .iter()
        .flatten()
        .any(|it| matches!(it, super::Item::Comm(_)))
}

/// Header checks but the count ([`check_pairs`]).
fn check_fields(s: &Schedule) -> Result<(), ScheduleError> {
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
    Ok(())
}

/// `P * V * M` when it is below 2^32 (what [`check_pairs`] accepts at most).
fn header_pairs(s: &Schedule) -> Option<usize> {
    s.ranks
        .checked_mul(s.chunks)
        .and_then(|x| x.checked_mul(s.microbatches))
        .filter(|&n| n < u32::MAX as usize)
}

/// Bounds `S * M` by the number of actions so a bogus header cannot make the checker allocate more
/// than a few words per action.
fn check_pairs(s: &Schedule) -> Result<(), ScheduleError> {
    let invalid = |m: String| Err(ScheduleError::Invalid(m));
    let pairs = s
        .ranks
        .checked_mul(s.chunks)
        .and_then(|x| x.checked_mul(s.microbatches));
    // A complete schedule holds at least 2 actions per pair; fewer than 1 per pair means the header
    // is wrong (a few missing actions are reported one by one by the completeness check instead).
    match pairs {
        Some(n) if n <= s.action_count() && n < u32::MAX as usize => Ok(()),
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

#[cfg(test)]
mod tests;
