//! The gate in front of the executor: only a schedule that validates runs.

use crate::schedule::{Schedule, ScheduleError};

/// Refuses a schedule the executor cannot run.
///
/// Until `schedule::validate` lands this checks the shape only (every action on a stage its rank
/// holds, within `S` and `M`); the dependency checks that rule out deadlocks are validate's.
pub(super) fn check_schedule(s: &Schedule) -> Result<(), ScheduleError> {
    let bad = |m: String| Err(ScheduleError::Invalid(m));
    if s.ranks == 0 || s.chunks == 0 || s.microbatches == 0 {
        return bad(format!(
            "ranks, chunks and microbatches must be at least 1 (got P = {}, V = {}, M = {})",
            s.ranks, s.chunks, s.microbatches
        ));
    }
    if s.actions.len() != s.ranks {
        return bad(format!(
            "{} rank lists for P = {} ranks",
            s.actions.len(),
            s.ranks
        ));
    }
    for (r, list) in s.actions.iter().enumerate() {
        for (i, item) in list.iter().enumerate() {
            for a in item.actions() {
                if a.stage >= s.stages() || a.microbatch >= s.microbatches {
                    return bad(format!(
                        "rank {r}, position {i}: {a} is outside S = {} stages, M = {} microbatches",
                        s.stages(),
                        s.microbatches
                    ));
                }
                if s.rank_of(a.stage) != r {
                    return bad(format!(
                        "rank {r}, position {i}: {a} runs a stage held by rank {}",
                        s.rank_of(a.stage)
                    ));
                }
            }
        }
    }
    Ok(())
}
