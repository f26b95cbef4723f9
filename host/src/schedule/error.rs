//! Errors of the schedule layer: refusals by generators, parse errors, validation failures.

use std::fmt;

use thiserror::Error;

use super::Item;

/// Everything that can go wrong building, reading or checking a schedule.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A generator refused its parameters; `reason` names the constraint and values that would work.
    #[error("{family}: {reason}")]
    Refused {
        /// The family that refused.
        family: String,
        /// Which constraint failed and what would work.
        reason: String,
    },
    /// No family of that name.
    #[error("unknown schedule family `{name}`; the families are {known}")]
    UnknownFamily {
        /// The name asked for.
        name: String,
        /// The known family names, comma-separated.
        known: String,
    },
    /// `auto` asked of the family generators: it is solved from costs, not generated from a shape.
    #[error(
        "`auto` is not a fixed family: it is solved for measured costs and a memory limit; call \
         `pipefill_host::plan::generate(\"auto\", &params, Some(&costs), &AutoOptions::default())` \
         (any schedule name, `auto` included), or `pipefill_host::auto::solve(&AutoRequest::new(\
         ranks, microbatches, costs))`"
    )]
    AutoNeedsCosts,
    /// An action's text form is malformed.
    #[error(
        "cannot read action `{}`: {}",
        crate::input::excerpt(text),
        crate::input::message(reason)
    )]
    ParseAction {
        /// The text that failed.
        text: String,
        /// Why.
        reason: String,
    },
    /// Unknown placement name.
    #[error("unknown placement `{0}`: use `looped` or `vshape`")]
    ParsePlacement(String),
    /// A schedule file is malformed (field named in the message; quoted tokens shown shortened).
    #[error("{}", crate::input::shorten(.0))]
    Format(String),
    /// The schedule's header (`P`, `V`, `M`, placement, number of rank lists) is inconsistent.
    #[error("{}", crate::input::shorten(.0))]
    Invalid(String),
    /// One action cannot run where it sits: out of range, on the wrong rank, duplicated, or before
    /// what must precede it on its rank. `grid` shows the rank lists around it, the action marked.
    #[error("rank {rank}, position {position}, `{item}`: {problem}\n{grid}")]
    BadAction {
        /// The rank whose list holds the action.
        rank: usize,
        /// Its position (0-based) in that list.
        position: usize,
        /// The item's text form.
        item: String,
        /// What is wrong and how to fix it.
        problem: String,
        /// The rank lists around the action, the action in brackets.
        grid: String,
    },
    /// A (stage, microbatch) lacks one of its actions (`F`, and `B` or `I` + `W`).
    #[error("stage {stage}, microbatch {microbatch}: {problem}")]
    Incomplete {
        /// Global stage.
        stage: usize,
        /// Microbatch.
        microbatch: usize,
        /// What is missing and where it belongs.
        problem: String,
    },
    /// The dependency-driven dry run stopped: every unfinished rank waits for an action that a waiting
    /// rank has not run yet.
    #[error(
        "deadlock: {} rank(s) wait on each other and none can proceed:\n{}\n{grid}",
        waits.len(),
        waits.iter().map(|w| format!("  {w}")).collect::<Vec<_>>().join("\n")
    )]
    Deadlock {
        /// One entry per waiting rank.
        waits: Vec<Wait>,
        /// The rank lists around the waiting actions, each marked in brackets.
        grid: String,
    },
}

/// One rank stuck in a deadlock: the item it cannot start and the action it waits for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Wait {
    /// The waiting rank.
    pub rank: usize,
    /// Position of the blocked item in its list.
    pub position: usize,
    /// The blocked item (text form).
    pub item: String,
    /// The item it needs that has not run: a compute action, or the send a receive waits for.
    pub needs: Item,
    /// The rank that must run `needs`.
    pub needs_rank: usize,
    /// Position of `needs` in that rank's list.
    pub needs_position: usize,
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} at position {} (`{}`) waits for `{}` (rank {}, position {})",
            self.rank, self.position, self.item, self.needs, self.needs_rank, self.needs_position
        )
    }
}

impl ScheduleError {
    /// Shorthand for [`ScheduleError::Refused`].
    pub fn refused(family: &str, reason: impl Into<String>) -> Self {
        ScheduleError::Refused {
            family: family.to_string(),
            reason: reason.into(),
        }
    }
}
