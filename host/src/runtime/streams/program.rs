//! [`StreamProgram`]: a lowered schedule turned into one enqueue order of stream operations.

use std::collections::HashMap;

use crate::schedule::deps::Edge;
use crate::schedule::lower::lowered_items;
use crate::schedule::walk::{walk, Waker, Walk};
use crate::schedule::{Action, Comm, Item, Op, Schedule};

use super::StreamError;

/// A stream of the device: lane 0 of a rank runs its list in order; lane 1 exists only on ranks whose
/// list overlaps a forward with a backward (`Item::Overlap`, as DualPipeV does) and runs the backward
/// halves, so that the pair really runs at the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId {
    /// The rank whose work the stream runs.
    pub rank: usize,
    /// 0: the rank's main lane; 1: the backward halves of its overlapped pairs.
    pub lane: usize,
}

/// Why an event is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventRole {
    /// A lowered schedule's send: recorded after the producer, waited on by the receiving rank's
    /// stream before the consumer.
    Transfer(Edge),
    /// Lane 1 starts an overlapped pair only after lane 0's earlier work.
    Fork {
        /// The rank.
        rank: usize,
    },
    /// Lane 0 goes on after an overlapped pair only once lane 1's half is done.
    Join {
        /// The rank.
        rank: usize,
    },
}

/// One operation, enqueued by the one host thread that drives a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOp {
    /// Enqueue `action`'s work on stream `stream` (an index into [`StreamProgram::streams`]).
    Run {
        /// The stream.
        stream: usize,
        /// The compute action.
        action: Action,
    },
    /// Record event `event` on `stream`: it completes when everything enqueued on `stream` before
    /// it has completed.
    Record {
        /// The stream.
        stream: usize,
        /// The event (an index into [`StreamProgram::events`]).
        event: usize,
    },
    /// Make `stream` wait, on the device, for event `event` before it runs what comes next. A wait
    /// must be enqueued after its record (a wait on an event not yet recorded waits for nothing).
    Wait {
        /// The stream.
        stream: usize,
        /// The event.
        event: usize,
    },
}

/// A schedule as the device backends execute it: the streams, the events, and one enqueue order of
/// [`StreamOp`]s for the whole step.
///
/// Built from the [lowered](crate::schedule::lower) schedule: each rank's compute items become `Run`s on
/// the rank's stream in list order; a `SEND` becomes a `Record` on the producer's stream right after the
/// producer; the matching `RECV` becomes a `Wait` on the consumer's stream before the consumer. An
/// overlapped pair forks lane 1 from lane 0 before it and joins it back after it. The order interleaves
/// the ranks as a dry run does (a rank stops at a receive whose send is not enqueued yet), so every
/// wait comes after its record: one host thread can enqueue the whole step (as CUDA graph capture
/// needs), and the device orders the work.
///
/// [`check`](fn@super::check) verifies these properties for any program, so a program edited by hand or
/// produced by another pass is checked before it runs.
///
/// ```
/// use pipefill_host::runtime::streams::{check, StreamOp, StreamProgram};
/// use pipefill_host::schedule::{families, Params};
/// let schedule = families::generate("1f1b", &Params::new(2, 2)).unwrap();
/// let program = StreamProgram::build(&schedule).unwrap();
/// assert_eq!(program.streams.len(), 2); // one per rank: 1F1B overlaps nothing
/// // 8 actions; 2 activations and 2 gradients cross ranks: a record and a wait each.
/// let runs = program.ops.iter().filter(|o| matches!(o, StreamOp::Run { .. })).count();
/// assert_eq!((runs, program.events.len()), (8, 4));
/// check(&program, &schedule).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamProgram {
    /// The streams, rank by rank (lane 0 first).
    pub streams: Vec<StreamId>,
    /// What each event is for.
    pub events: Vec<EventRole>,
    /// The enqueue order.
    pub ops: Vec<StreamOp>,
}

impl StreamProgram {
    /// The program of `schedule` (which must validate: a schedule that deadlocks has no enqueue
    /// order, and gets [`StreamError::Stuck`]).
    pub fn build(schedule: &Schedule) -> Result<Self, StreamError> {
        Builder::new(schedule).run()
    }

    /// The stream index of `id`, if the program has that stream.
    pub fn stream(&self, id: StreamId) -> Option<usize> {
        self.streams.iter().position(|s| *s == id)
    }
}

/// One operation of one rank's part of a [`StreamProgram`], for a process that runs only that rank
/// (one process per GPU rank): a transfer between ranks becomes a send after the producer and a
/// receive before the consumer (NCCL point-to-point on the stream), everything else stays as is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankOp {
    /// An operation on this rank's own streams: a run, or an event between its lanes.
    Local(StreamOp),
    /// Where the program records a transfer's event: send `edge`'s data to rank `to`, enqueued on
    /// `stream` after its producer.
    Send {
        /// The producer's stream.
        stream: usize,
        /// What crosses.
        edge: Edge,
        /// The consumer's rank.
        to: usize,
    },
    /// Where the program waits for another rank's transfer event: receive `edge`'s data from rank
    /// `from`, enqueued on `stream` before its consumer.
    Recv {
        /// The consumer's stream.
        stream: usize,
        /// What crosses.
        edge: Edge,
        /// The producer's rank.
        from: usize,
    },
}

impl StreamProgram {
    /// Rank `rank`'s operations in the program's order (the rank's lowered list order): its runs
    /// and lane events as [`RankOp::Local`], each transfer it produces as a [`RankOp::Send`] and
    /// each it consumes as a [`RankOp::Recv`]. Another rank's operations are left out.
    pub fn rank_ops(&self, rank: usize) -> Vec<RankOp> {
        let rank_of = |stream: usize| self.streams.get(stream).map(|s| s.rank);
        let mut recorder = vec![None; self.events.len()];
        let mut waiter = vec![None; self.events.len()];
        for op in &self.ops {
            match *op {
                StreamOp::Record { stream, event } => recorder[event] = rank_of(stream),
                StreamOp::Wait { stream, event } => waiter[event] = rank_of(stream),
                StreamOp::Run { .. } => {}
            }
        }
        let transfer = |event: usize| match self.events.get(event) {
            Some(EventRole::Transfer(e)) => Some(*e),
            _ => None,
        };
        let mut out = Vec::new();
        for op in &self.ops {
            let (stream, event) = match *op {
                StreamOp::Run { stream, .. } => (stream, None),
                StreamOp::Record { stream, event } | StreamOp::Wait { stream, event } => {
                    (stream, Some(event))
                }
            };
            if rank_of(stream) != Some(rank) {
                continue;
            }
            let crossing = event.and_then(|ev| Some((ev, transfer(ev)?)));
            out.push(match (op, crossing) {
                (StreamOp::Record { .. }, Some((ev, edge))) => match waiter[ev] {
                    Some(to) if to != rank => RankOp::Send { stream, edge, to },
                    _ => RankOp::Local(*op),
                },
                (StreamOp::Wait { .. }, Some((ev, edge))) => match recorder[ev] {
                    Some(from) if from != rank => RankOp::Recv { stream, edge, from },
                    _ => RankOp::Local(*op),
                },
                _ => RankOp::Local(*op),
            });
        }
        out
    }
}

/// Which lane each compute action of each rank runs on: lane 1 for the backward half of an
/// overlapped pair, else 0.
pub(super) fn lanes(schedule: &Schedule) -> HashMap<Action, usize> {
    let mut lanes = HashMap::new();
    for list in &schedule.actions {
        for item in list {
            match *item {
                Item::One(a) => {
                    lanes.insert(a, 0);
                }
                Item::Overlap { forward, backward } => {
                    lanes.insert(forward, 0);
                    lanes.insert(backward, 1);
                }
                Item::Comm(_) | Item::Param(_) => {}
            }
        }
    }
    lanes
}

/// The action that consumes `e`'s data in `lanes` (for a gradient: the `I` or the `B`, whichever
/// the schedule has).
pub(super) fn consumer(e: &Edge, lanes: &HashMap<Action, usize>) -> Action {
    let consumer = e.consumer();
    if consumer.op == Op::I && !lanes.contains_key(&consumer) {
        return Action::new(Op::B, consumer.stage, consumer.microbatch);
    }
    consumer
}

struct Builder<'a> {
    schedule: &'a Schedule,
    lists: Vec<Vec<Item>>,
    lanes: HashMap<Action, usize>,
    index: HashMap<StreamId, usize>,
    sent: HashMap<Edge, usize>,
    program: StreamProgram,
    /// The first error met while emitting (the walk then stops that rank).
    error: Option<StreamError>,
}

impl Walk for Builder<'_> {
    /// The edge whose send a receive waits for (`None`: emitting failed, see `error`).
    type Wanted = Option<Edge>;

    fn advance(
        &mut self,
        rank: usize,
        pos: &mut usize,
        waker: &mut Waker<Option<Edge>>,
    ) -> Option<Option<Edge>> {
        while let Some(&item) = self.lists[rank].get(*pos) {
            match self.emit(rank, item) {
                Ok(Emitted::Done) => {}
                Ok(Emitted::Sent(e)) => waker.wake(self.schedule.rank_of(e.to()), Some(e)),
                Ok(Emitted::Waits(e)) => return Some(Some(e)),
                Err(err) => {
                    self.error.get_or_insert(err);
                    return Some(None);
                }
            }
            *pos += 1;
        }
        None
    }
}

/// What emitting one item did.
enum Emitted {
    /// It was emitted.
    Done,
    /// It was the send of this edge (its receiver may now go on).
    Sent(Edge),
    /// It is the receive of this edge, whose send is not enqueued yet: nothing was emitted.
    Waits(Edge),
}

impl<'a> Builder<'a> {
    fn new(schedule: &'a Schedule) -> Self {
        let lists: Vec<Vec<Item>> = (0..schedule.ranks)
            .map(|r| lowered_items(schedule, r).collect())
            .collect();
        let mut streams = Vec::new();
        for (rank, list) in schedule.actions.iter().enumerate() {
            streams.push(StreamId { rank, lane: 0 });
            if list.iter().any(|i| matches!(i, Item::Overlap { .. })) {
                streams.push(StreamId { rank, lane: 1 });
            }
        }
        let index = streams.iter().enumerate().map(|(i, s)| (*s, i)).collect();
        Builder {
            schedule,
            lists,
            lanes: lanes(schedule),
            index,
            sent: HashMap::new(),
            program: StreamProgram {
                streams,
                events: Vec::new(),
                ops: Vec::new(),
            },
            error: None,
        }
    }

    /// Every rank as far as it can go (the one [walk](crate::schedule::walk)), emitting; a
    /// receive waits until its send is enqueued.
    fn run(mut self) -> Result<StreamProgram, StreamError> {
        let mut pos = vec![0usize; self.lists.len()];
        let stuck = walk(&mut self, &mut pos);
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        match stuck.first() {
            None => Ok(self.program),
            Some(w) => Err(StreamError::Stuck {
                rank: w.rank,
                item: self.lists[w.rank][w.pos].to_string(),
            }),
        }
    }

    fn stream(&self, rank: usize, lane: usize) -> Result<usize, StreamError> {
        self.index
            .get(&StreamId { rank, lane })
            .copied()
            .ok_or(StreamError::NoStream { rank, lane })
    }

    fn event(&mut self, stream: usize, role: EventRole) -> usize {
        let event = self.program.events.len();
        self.program.events.push(role);
        self.program.ops.push(StreamOp::Record { stream, event });
        event
    }

    /// Emits `item` of `rank`, unless it is a receive whose send is not enqueued yet.
    fn emit(&mut self, rank: usize, item: Item) -> Result<Emitted, StreamError> {
        match item {
            Item::One(action) => {
                let stream = self.stream(rank, 0)?;
                self.program.ops.push(StreamOp::Run { stream, action });
            }
            Item::Overlap { forward, backward } => {
                let (main, second) = (self.stream(rank, 0)?, self.stream(rank, 1)?);
                let fork = self.event(main, EventRole::Fork { rank });
                let ops = &mut self.program.ops;
                ops.push(StreamOp::Wait {
                    stream: second,
                    event: fork,
                });
                ops.push(StreamOp::Run {
                    stream: main,
                    action: forward,
                });
                ops.push(StreamOp::Run {
                    stream: second,
                    action: backward,
                });
                let join = self.event(second, EventRole::Join { rank });
                self.program.ops.push(StreamOp::Wait {
                    stream: main,
                    event: join,
                });
            }
            Item::Comm(c) => return self.transfer(rank, c),
            // Parameter operations move no data within one device program.
            Item::Param(_) => {}
        }
        Ok(Emitted::Done)
    }

    fn transfer(&mut self, rank: usize, c: Comm) -> Result<Emitted, StreamError> {
        if c.op.is_wait() {
            // A send is an event record, which nothing retires: its wait has no op.
            return Ok(Emitted::Done);
        }
        let stages = self.schedule.stages();
        let e = Edge::of(c, stages).ok_or(StreamError::NoBoundary {
            rank,
            item: c.to_string(),
        })?;
        if c.op.is_send() {
            // The producer of a gradient is the I or the B, whichever this rank runs.
            let producer = e.producer();
            let b = Action::new(Op::B, producer.stage, producer.microbatch);
            let lane = self
                .lanes
                .get(&producer)
                .or_else(|| self.lanes.get(&b))
                .copied()
                .unwrap_or(0);
            let stream = self.stream(rank, lane)?;
            let event = self.event(stream, EventRole::Transfer(e));
            self.sent.insert(e, event);
            return Ok(Emitted::Sent(e));
        }
        let Some(&event) = self.sent.get(&e) else {
            return Ok(Emitted::Waits(e));
        };
        let lane = self
            .lanes
            .get(&consumer(&e, &self.lanes))
            .copied()
            .unwrap_or(0);
        let stream = self.stream(rank, lane)?;
        self.program.ops.push(StreamOp::Wait { stream, event });
        Ok(Emitted::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{families, Params};

    /// Each crossing is one send on the producer's rank and one receive on the consumer's, in the
    /// same order per pair of ranks (a transport that matches messages in order, NCCL or gloo
    /// point-to-point, needs it; the V-shape families consume some edges in another order than
    /// they are sent, and lowering moves those receives up).
    #[test]
    fn each_crossing_is_one_send_and_one_receive() {
        for family in [
            "gpipe",
            "1f1b",
            "interleaved-1f1b",
            "zb-h1",
            "zbv",
            "dualpipev",
        ] {
            let mut params = Params::new(2, 4);
            if family.contains("interleaved") {
                params.chunks = Some(2);
            }
            let schedule = families::generate(family, &params).unwrap();
            let program = StreamProgram::build(&schedule).unwrap();
            let views: Vec<Vec<RankOp>> = (0..2).map(|r| program.rank_ops(r)).collect();
            let runs: usize = views
                .iter()
                .flatten()
                .filter(|o| matches!(o, RankOp::Local(StreamOp::Run { .. })))
                .count();
            let all_runs = program
                .ops
                .iter()
                .filter(|o| matches!(o, StreamOp::Run { .. }))
                .count();
            assert_eq!(runs, all_runs, "{family}");
            let transfers = program
                .events
                .iter()
                .filter(|e| matches!(e, EventRole::Transfer(_)))
                .count();
            for (a, b) in [(0, 1), (1, 0)] {
                let sent: Vec<Edge> = views[a]
                    .iter()
                    .filter_map(|o| match *o {
                        RankOp::Send { edge, to, .. } if to == b => Some(edge),
                        _ => None,
                    })
                    .collect();
                let received: Vec<Edge> = views[b]
                    .iter()
                    .filter_map(|o| match *o {
                        RankOp::Recv { edge, from, .. } if from == a => Some(edge),
                        _ => None,
                    })
                    .collect();
                // Lowering lists a rank's receives in its sender's order, V-shape families too.
                assert_eq!(sent, received, "{family}: {a} -> {b}");
            }
            let crossings = views
                .iter()
                .flatten()
                .filter(|o| matches!(o, RankOp::Send { .. }))
                .count();
            assert_eq!(crossings, transfers, "{family}");
            assert!(crossings > 0, "{family}");
        }
    }
}
