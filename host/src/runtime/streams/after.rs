//! What a stream runner does once a step's device work has run (after the device synchronised):
//! tells the step hook of every action ([`tell`]) and reduces each stage's gradients through the
//! data-parallel [`Reducer`] ([`reduce`]). The hook and the reducer are the threaded
//! [`Executor`](crate::runtime::Executor)'s: the same [`StepEvent`]s, the same `Reducer`.
//!
//! Where the stream path differs, because the host only enqueues: the hook is told after the
//! device synchronised, not while the step runs; each rank's events come in its list's order, with
//! the times of the device's timing marks around each action (the step's timeline: on CUDA the
//! streams' event times, not the host's enqueue times); and the reduction runs after that, stage
//! by stage in stage order, on the host buffers [`StreamStage::with_gradients`] lends (on CUDA a
//! copy to the host and back), not overlapped with the cool-down of the other stages.

use super::stage::bound_home;
use super::{Device, StreamStage};
use crate::runtime::hook::Hooked;
use crate::runtime::worker::reduce_failed;
use crate::runtime::{last_gradient_actions, RankStop, Reducer, RuntimeError, StepEvent};
use crate::schedule::{Action, Schedule};

/// Each action of a step with its start and end, in enqueue order.
pub(super) type Timed = Vec<(Action, f64, f64)>;

/// A step's hook, if any, as the stream runners take it.
pub(super) type Hook<'h> = Option<&'h (dyn Fn(StepEvent) + Sync)>;

/// Tells `hook` that each `(action, start, end)` of `timed` ran (in enqueue order, which is each
/// rank's list order), and of each stage whose gradients are final ([`StepEvent::GradientsReady`]
/// after its last `B` or `W`). A panic in the hook is the step's error.
pub(super) fn tell(
    schedule: &Schedule,
    hook: Hook<'_>,
    timed: &[(Action, f64, f64)],
) -> Result<(), RuntimeError> {
    let Some(hook) = hook else {
        return Ok(());
    };
    let mut hooked: Vec<Option<Hooked<'_>>> = (0..schedule.ranks).map(|_| None).collect();
    for &(a, start, end) in timed {
        let rank = schedule.rank_of(a.stage);
        let Some(slot) = hooked.get_mut(rank) else {
            continue;
        };
        let told = slot
            .get_or_insert_with(|| Hooked::new(hook, schedule, rank))
            .done(rank, a, start, end);
        match told {
            Ok(()) => {}
            Err(RankStop::Failed(e)) => return Err(e),
            Err(RankStop::Aborted) => {
                return Err(RuntimeError::Internal {
                    rank,
                    message: format!("the hook stopped the step after {a}"),
                })
            }
        }
    }
    Ok(())
}

/// Reduces the gradients of `stages` (`(global stage, stage)`, each lending them on stream
/// `home(stage)` of `device`) through `reduce`, in the order given; nothing without a reducer.
pub(super) fn reduce<'a, D: Device, S: StreamStage<D::Stream, D::Payload> + 'a>(
    schedule: &Schedule,
    device: &'a D,
    stages: impl IntoIterator<Item = (usize, &'a mut S)>,
    home: impl Fn(usize) -> Option<usize>,
    reduce: Option<&Reducer>,
) -> Result<(), RuntimeError> {
    let Some(reduce) = reduce else {
        return Ok(());
    };
    let last = last_gradient_actions(schedule);
    for (s, bound) in bound_home(device, stages, home)? {
        let reduced = bound.stage.with_gradients(bound.on, &mut |g| reduce(s, g));
        reduced.map_err(|e| match last.get(s).copied().flatten() {
            Some(a) => reduce_failed(schedule.rank_of(s), a, e),
            None => RuntimeError::Internal {
                rank: schedule.rank_of(s),
                message: format!("stage {s} has no gradient action to reduce after"),
            },
        })?;
    }
    Ok(())
}
