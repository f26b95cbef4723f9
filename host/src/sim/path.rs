//! The critical path of a simulated run.

use super::engine::{Cause, Engine, Ready};
use super::{PathStep, Via};

/// Walks back from the item that ends last. An item's start was fixed by its rank (the previous
/// item ended exactly then; preferred on a tie, as the rank was the limit) or else by its last
/// input, recomputed from the completion tables exactly as during the run.
pub(super) fn critical_path(engine: &Engine) -> Vec<PathStep> {
    let spans = &engine.timeline.spans;
    let mut last: Option<(usize, usize)> = None;
    let mut best = f64::NEG_INFINITY;
    for (r, lane) in spans.iter().enumerate() {
        if let Some(s) = lane.last() {
            if s.end > best {
                best = s.end;
                last = Some((r, lane.len() - 1));
            }
        }
    }
    path_to(engine, last)
}

/// The chain that ends at rank `rank`'s last item (what sets that rank's end; for its span, the
/// part after the rank's first item).
pub(super) fn path_to_rank(engine: &Engine, rank: usize) -> Vec<PathStep> {
    let lane = engine.timeline.spans.get(rank);
    path_to(
        engine,
        lane.and_then(|l| l.len().checked_sub(1)).map(|i| (rank, i)),
    )
}

/// Walks back from `last` (rank, position), as [`critical_path`] does.
fn path_to(engine: &Engine, last: Option<(usize, usize)>) -> Vec<PathStep> {
    let spans = &engine.timeline.spans;
    let mut path = Vec::new();
    let mut at = last;
    while let Some((r, i)) = at {
        let span = spans[r][i];
        let (via, next) = if i > 0 && spans[r][i - 1].end >= span.start {
            (Via::Rank, Some((r, i - 1)))
        } else {
            match engine.ready_time(r, &span.item()) {
                Ready::At(
                    _,
                    Cause::Data {
                        rank,
                        index,
                        transfer,
                    },
                ) => (
                    Via::Data { transfer },
                    Some((rank as usize, index as usize)),
                ),
                _ => (Via::Start, None),
            }
        };
        path.push(PathStep {
            rank: r,
            index: i,
            via,
        });
        at = next;
    }
    path.reverse();
    path
}
