//! [`check`]: the static check of a [`StreamProgram`] before any device runs it.
//!
//! It replays the enqueue order with one vector clock per stream (how far each stream is known to
//! have run, as seen from this stream): a `Run` advances its stream's own entry, a `Record` stores
//! the stream's clock in the event, a `Wait` merges the event's clock into the waiting stream's. A
//! consumer on stream `s` is ordered after its producer on stream `p` exactly when `s`'s clock has
//! reached the producer's position on `p`. Same-stream pairs are ordered by the stream itself.

use std::collections::HashMap;

use super::{StreamError, StreamOp, StreamProgram};
use crate::schedule::deps::{needs, Need};
use crate::schedule::{Action, Op, Schedule};

/// Checks that `program` runs `schedule` correctly on any device that honours stream order and events:
///
/// - every stream and event it names exists, and each event is recorded once, **before** any wait
///   on it (a wait enqueued before its record waits for nothing on CUDA);
/// - each action runs on a stream of its stage's rank, and each rank's actions are enqueued in the
///   order of its list;
/// - every action is ordered after what it needs ([`needs`]): on the same stream, or through a chain
///   of records and waits.
///
/// ```
/// use pipefill_host::runtime::streams::{check, StreamError, StreamOp, StreamProgram};
/// use pipefill_host::schedule::{families, Params};
/// let schedule = families::generate("gpipe", &Params::new(2, 2)).unwrap();
/// let mut program = StreamProgram::build(&schedule).unwrap();
/// // Move the first wait to the very start: it now comes before its record.
/// let at = program.ops.iter().position(|o| matches!(o, StreamOp::Wait { .. })).unwrap();
/// let wait = program.ops.remove(at);
/// program.ops.insert(0, wait);
/// assert!(matches!(check(&program, &schedule), Err(StreamError::WaitBeforeRecord { .. })));
/// ```
pub fn check(program: &StreamProgram, schedule: &Schedule) -> Result<(), StreamError> {
    let n = program.streams.len();
    let stages = schedule.stages();
    let mut clocks = vec![vec![0usize; n]; n];
    let mut recorded: Vec<Option<Vec<usize>>> = vec![None; program.events.len()];
    let mut done: HashMap<Action, (usize, usize)> = HashMap::new();
    let mut next_in_list = vec![0usize; schedule.ranks];
    let lists = compute_lists(schedule);
    for (op_index, op) in program.ops.iter().enumerate() {
        match *op {
            StreamOp::Record { stream, event } => {
                known(stream, n, op_index)?;
                let slot = recorded.get_mut(event).ok_or(StreamError::UnknownEvent {
                    op: op_index,
                    event,
                })?;
                if slot.is_some() {
                    return Err(StreamError::RecordedTwice {
                        op: op_index,
                        event,
                    });
                }
                *slot = Some(clocks[stream].clone());
            }
            StreamOp::Wait { stream, event } => {
                known(stream, n, op_index)?;
                let got = recorded
                    .get(event)
                    .ok_or(StreamError::UnknownEvent {
                        op: op_index,
                        event,
                    })?
                    .as_ref()
                    .ok_or(StreamError::WaitBeforeRecord {
                        op: op_index,
                        event,
                    })?;
                for (mine, theirs) in clocks[stream].iter_mut().zip(got) {
                    *mine = (*mine).max(*theirs);
                }
            }
            StreamOp::Run { stream, action } => {
                known(stream, n, op_index)?;
                let rank = schedule.rank_of(action.stage);
                if program.streams[stream].rank != rank {
                    return Err(StreamError::WrongRank {
                        action,
                        stream_rank: program.streams[stream].rank,
                        rank,
                    });
                }
                let expected = lists[rank].get(next_in_list[rank]).copied();
                if expected != Some(action) {
                    return Err(StreamError::Order {
                        rank,
                        expected: expected.map(|a| a.to_string()),
                        got: action.to_string(),
                    });
                }
                next_in_list[rank] += 1;
                for need in needs(action, stages) {
                    let wanted = match need {
                        Need::Stash(a) => a,
                        Need::Data(e) => e.producer(),
                    };
                    let b = Action::new(Op::B, wanted.stage, wanted.microbatch);
                    let found = done
                        .get(&wanted)
                        .or_else(|| (wanted.op == Op::I).then(|| done.get(&b)).flatten());
                    let &(p_stream, p_seq) = found.ok_or(StreamError::BeforeProducer {
                        consumer: action,
                        producer: wanted,
                    })?;
                    if clocks[stream][p_stream] < p_seq {
                        return Err(StreamError::Unordered {
                            consumer: action,
                            producer: wanted,
                        });
                    }
                }
                clocks[stream][stream] += 1;
                done.insert(action, (stream, clocks[stream][stream]));
            }
        }
    }
    for (rank, list) in lists.iter().enumerate() {
        if next_in_list[rank] != list.len() {
            return Err(StreamError::Order {
                rank,
                expected: list.get(next_in_list[rank]).map(|a| a.to_string()),
                got: "the end of the program".into(),
            });
        }
    }
    Ok(())
}

fn known(stream: usize, streams: usize, op: usize) -> Result<(), StreamError> {
    if stream < streams {
        Ok(())
    } else {
        Err(StreamError::UnknownStream { op, stream })
    }
}

/// Each rank's compute actions in list order (an overlapped pair: forward, then backward).
fn compute_lists(schedule: &Schedule) -> Vec<Vec<Action>> {
    schedule
        .actions
        .iter()
        .map(|list| list.iter().flat_map(|i| i.actions()).collect())
        .collect()
}
