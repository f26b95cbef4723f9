//! Step hooks: a trainer's callback, told of every action as it completes and of every stage whose
//! weight gradients are final for the step (see [`Executor::step_with`](super::Executor::step_with)).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::clock::panic_message;
use super::machine::RankStop;
use super::RuntimeError;
use crate::schedule::{Action, Op, Schedule};

/// What a step hook is told, on the thread of the rank concerned, while the step runs.
///
/// Times are seconds since the step began: the clock of
/// [`StepReport::seconds`](super::StepReport::seconds) and of
/// [`StepReport::timeline`](super::StepReport::timeline), whose span of an action starts and ends
/// at the same times as its [`StepEvent::ActionDone`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum StepEvent {
    /// `action` finished on `rank`: its layer calls returned and its output was handed on.
    ActionDone {
        /// The rank that ran it.
        rank: usize,
        /// What ran.
        action: Action,
        /// Start of its first layer call.
        start: f64,
        /// End of its last layer call.
        end: f64,
    },
    /// The last `B` or `W` of `stage` in this step finished on `rank`: the stage's weight
    /// gradients are final for the step (nothing adds to them before its optimizer step). Told
    /// once per stage per step, right after that action's [`StepEvent::ActionDone`]: the moment
    /// to start, for example, a data-parallel reduction of those gradients.
    GradientsReady {
        /// The rank holding the stage.
        rank: usize,
        /// The global stage index.
        stage: usize,
        /// When the last gradient action ended.
        at: f64,
    },
}

impl StepEvent {
    /// The rank the event happened on.
    pub fn rank(&self) -> usize {
        match *self {
            StepEvent::ActionDone { rank, .. } | StepEvent::GradientsReady { rank, .. } => rank,
        }
    }
}

/// For each global stage, the action after which its weight gradients are final for a step: the
/// last `B` or `W` of that stage in its rank's list (`None` only for a schedule that never runs
/// the stage's backward, which does not validate).
///
/// ```
/// use pipefill_host::runtime::last_gradient_actions;
/// use pipefill_host::schedule::{families, Params};
/// let s = families::generate("zb-h1", &Params::new(2, 4)).unwrap();
/// let last = last_gradient_actions(&s);
/// assert_eq!(last.len(), 2);
/// assert!(last.iter().all(|a| a.map_or(false, |a| a.to_string().contains('W'))));
/// ```
pub fn last_gradient_actions(schedule: &Schedule) -> Vec<Option<Action>> {
    let mut last = vec![None; schedule.stages()];
    for a in schedule
        .actions
        .iter()
        .flatten()
        .flat_map(|item| item.actions())
    {
        if matches!(a.op, Op::B | Op::W) {
            if let Some(slot) = last.get_mut(a.stage) {
                *slot = Some(a);
            }
        }
    }
    last
}

/// A step hook as a worker holds it: the callback and the gradient actions of the rank's stages.
pub(super) struct Hooked<'h> {
    hook: &'h (dyn Fn(StepEvent) + Sync),
    /// The last gradient action of each stage this rank holds.
    last_gradient: Vec<Action>,
}

impl<'h> Hooked<'h> {
    /// The hook of `rank` in `schedule`.
    pub fn new(hook: &'h (dyn Fn(StepEvent) + Sync), schedule: &Schedule, rank: usize) -> Self {
        let last_gradient = last_gradient_actions(schedule)
            .into_iter()
            .enumerate()
            .filter(|(s, _)| schedule.rank_of(*s) == rank)
            .filter_map(|(_, a)| a)
            .collect();
        Hooked {
            hook,
            last_gradient,
        }
    }

    /// Tells the hook that `action` ran on `rank` from `start` to `end` and, if it was the stage's
    /// last gradient action of the step, that the stage's gradients are ready. A panic in the hook
    /// stops the step.
    pub fn done(&self, rank: usize, action: Action, start: f64, end: f64) -> Result<(), RankStop> {
        self.tell(
            rank,
            action,
            StepEvent::ActionDone {
                rank,
                action,
                start,
                end,
            },
        )?;
        if matches!(action.op, Op::B | Op::W) && self.last_gradient.contains(&action) {
            let ready = StepEvent::GradientsReady {
                rank,
                stage: action.stage,
                at: end,
            };
            self.tell(rank, action, ready)?;
        }
        Ok(())
    }

    fn tell(&self, rank: usize, action: Action, event: StepEvent) -> Result<(), RankStop> {
        catch_unwind(AssertUnwindSafe(|| (self.hook)(event))).map_err(|p| {
            RankStop::Failed(RuntimeError::HookPanicked {
                rank,
                action,
                message: panic_message(&*p),
            })
        })
    }
}

/// A hook of its own for each rank (an `FnMut` each) behind the one `Fn + Sync` hook a step
/// takes: what `step_with_each` of every runner builds.
pub(super) struct EachRank<H>(Vec<Mutex<H>>);

impl<H: FnMut(StepEvent)> EachRank<H> {
    /// `hook_of(rank)` for each of `ranks` ranks.
    pub fn new(ranks: usize, hook_of: impl FnMut(usize) -> H) -> Self {
        EachRank((0..ranks).map(hook_of).map(Mutex::new).collect())
    }

    /// Tells the hook of the event's rank. One lock per rank, taken only while that rank's events
    /// are told: never contended.
    pub fn tell(&self, event: StepEvent) {
        if let Some(hook) = self.0.get(event.rank()) {
            let mut hook = hook.lock().unwrap_or_else(PoisonError::into_inner);
            (*hook)(event);
        }
    }
}

/// Every rank's events of one step, gathered over a channel: what `step_with_events` of every
/// runner returns.
pub(super) struct Events {
    tx: Sender<StepEvent>,
    rx: Receiver<StepEvent>,
}

impl Events {
    pub fn new() -> Self {
        let (tx, rx) = mpsc::channel();
        Events { tx, rx }
    }

    /// A rank's hook, sending its events here.
    pub fn hook(&self) -> impl FnMut(StepEvent) + Send {
        let tx = self.tx.clone();
        // The receiver lives until the step ends: a send cannot fail.
        move |event| {
            let _ = tx.send(event);
        }
    }

    /// The events by rank (`ranks` of them), each rank's in the order told.
    pub fn by_rank(self, ranks: usize) -> Vec<Vec<StepEvent>> {
        drop(self.tx);
        let mut events = vec![Vec::new(); ranks];
        for event in self.rx.try_iter() {
            if let Some(list) = events.get_mut(event.rank()) {
                list.push(event);
            }
        }
        events
    }
}
