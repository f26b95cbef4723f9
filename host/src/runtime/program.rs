//! What a rank's runner executes: the schedule's lowered lists.

use crate::schedule::forward_only::forward_only;
use crate::schedule::lower::lowered_items;
use crate::schedule::validate::has_transfers;
use crate::schedule::{Item, ParamOp, Schedule};

/// Each rank's list as the runners execute it: the schedule [lowered](crate::schedule::lower), with
/// its sends and receives, and whether the schedule carried its transfers itself (then every item
/// gets a span; otherwise only the schedule's own items do). Built once per schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct RankProgram {
    lists: Vec<Vec<Item>>,
    explicit: bool,
    /// An evaluation: forwards only, no stash kept, no gradients, no optimizer step.
    evaluation: bool,
}

impl RankProgram {
    /// The lowered lists of `schedule`.
    pub fn of(schedule: &Schedule) -> Self {
        RankProgram {
            lists: (0..schedule.ranks)
                .map(|r| lowered_items(schedule, r).collect())
                .collect(),
            explicit: has_transfers(schedule),
            evaluation: false,
        }
    }

    /// The evaluation program of `schedule`: its [forward order](forward_only) lowered, run with
    /// no stash kept, no gradient and no optimizer step (see
    /// [`Executor::evaluate`](super::Executor::evaluate)).
    pub fn evaluation_of(schedule: &Schedule) -> Self {
        let forward = forward_only(schedule);
        RankProgram {
            lists: (0..schedule.ranks)
                .map(|r| lowered_items(&forward, r).collect())
                .collect(),
            explicit: false,
            evaluation: true,
        }
    }

    /// Whether this is an evaluation program ([`RankProgram::evaluation_of`]).
    pub fn is_evaluation(&self) -> bool {
        self.evaluation
    }

    /// Rank `rank`'s lowered list.
    pub fn list(&self, rank: usize) -> &[Item] {
        self.lists.get(rank).map_or(&[], Vec::as_slice)
    }

    /// Whether the schedule carried its transfers itself.
    pub(super) fn explicit(&self) -> bool {
        self.explicit
    }

    /// Per global stage of `schedule`, whether rank `rank`'s list starts the stage's reduction with
    /// a `REDUCE_GRAD` (else the runner reduces right after the stage's last `W`/`B`).
    pub(super) fn reduces_at_item(&self, schedule: &Schedule, rank: usize) -> Vec<bool> {
        let mut at = vec![false; schedule.stages()];
        for it in self.list(rank) {
            if let Item::Param(p) = it {
                if let (ParamOp::ReduceGrad, Some(slot)) = (p.op, at.get_mut(p.stage)) {
                    *slot = true;
                }
            }
        }
        at
    }
}
