//! Step 4 of validation: the dependency-driven dry run, and the one deadlock report.

use super::super::deps::{self, Edge, Flow, Need};
use super::super::format::context_grid;
use super::super::walk::{walk, Waker, Walk};
use super::super::{Comm, Item, Op, Schedule, ScheduleError, Wait};

/// Slot in which something finished; `NOT_RUN` until it ran.
const NOT_RUN: usize = usize::MAX;

/// Finish slots of forwards, input backwards (`I` or `B`) and sends, per (stage, microbatch).
struct Finish {
    m: usize,
    forward: Vec<usize>,
    grad: Vec<usize>,
    /// `SEND_F` from the stage.
    sent_f: Vec<usize>,
    /// `SEND_B` from the stage.
    sent_b: Vec<usize>,
    /// `RECV_F` of the stage's activation (indexed by the sending stage).
    recv_f: Vec<usize>,
    /// `RECV_B` of the stage's gradient (indexed by the sending stage).
    recv_b: Vec<usize>,
}

/// What of an edge's transfer an item waits for.
#[derive(Clone, Copy)]
enum Step {
    /// The action that computes the data.
    Produced,
    /// Its `SEND_*`.
    Sent,
    /// Its `RECV_*` (posted).
    Posted,
}

/// The dry run's view of one schedule.
struct Dry<'s> {
    s: &'s Schedule,
    lowered: bool,
    done: Finish,
}

/// Runs every rank's list in order, each item one slot, starting when what it needs finished; returns
/// each item's start slot and the makespan, or the deadlock.
pub(super) fn dry_run(s: &Schedule) -> Result<(Vec<Vec<usize>>, usize), ScheduleError> {
    let n = s.stages() * s.microbatches;
    let mut dry = Dry {
        s,
        lowered: super::has_transfers(s),
        done: Finish {
            m: s.microbatches,
            forward: vec![NOT_RUN; n],
            grad: vec![NOT_RUN; n],
            sent_f: Vec::new(),
            sent_b: Vec::new(),
            recv_f: Vec::new(),
            recv_b: Vec::new(),
        },
    };
    if dry.lowered {
        dry.done.sent_f = vec![NOT_RUN; n];
        dry.done.sent_b = vec![NOT_RUN; n];
        dry.done.recv_f = vec![NOT_RUN; n];
        dry.done.recv_b = vec![NOT_RUN; n];
    }
    let mut run = Run {
        dry,
        free_at: vec![0usize; s.ranks],
        slots: s.actions.iter().map(|l| vec![0; l.len()]).collect(),
    };
    let stuck = walk(&mut run, &mut vec![0usize; s.ranks]);
    if !stuck.is_empty() {
        let waiting: Vec<(usize, usize, Item)> =
            stuck.iter().map(|w| (w.rank, w.pos, w.wanted)).collect();
        return Err(deadlock(s, &waiting));
    }
    Ok((run.slots, run.free_at.into_iter().max().unwrap_or(0)))
}

/// The dry run as a [`Walk`]: each item one slot, from when what it needs finished.
struct Run<'s> {
    dry: Dry<'s>,
    free_at: Vec<usize>,
    slots: Vec<Vec<usize>>,
}

impl Walk for Run<'_> {
    /// The item that must finish first.
    type Wanted = Item;

    fn advance(&mut self, rank: usize, pos: &mut usize, waker: &mut Waker<Item>) -> Option<Item> {
        while let Some(item) = self.dry.s.actions[rank].get(*pos) {
            let ready_at = match self.dry.ready(item) {
                Ok(t) => t,
                Err(wanted) => return Some(wanted),
            };
            let start = ready_at.max(self.free_at[rank]);
            self.slots[rank][*pos] = start;
            self.free_at[rank] = start + 1;
            *pos += 1;
            for woken in self.dry.complete(item, start + 1).into_iter().flatten() {
                waker.nudge(woken);
            }
        }
        None
    }
}

impl Dry<'_> {
    fn key(&self, stage: usize, microbatch: usize) -> usize {
        stage * self.done.m + microbatch
    }

    fn crosses(&self, e: &Edge) -> bool {
        self.s.rank_of(e.from) != self.s.rank_of(e.to())
    }

    /// When `step` of edge `e` finished (its producer, its send or its receive), or what to wait
    /// for.
    fn finished(&self, e: &Edge, step: Step) -> Result<usize, Item> {
        let d = &self.done;
        let (table, missing) = match (step, e.flow) {
            (Step::Produced, Flow::Activation) => (&d.forward, Item::One(e.producer())),
            (Step::Produced, Flow::Gradient) => (&d.grad, Item::One(e.producer())),
            (Step::Sent, Flow::Activation) => (&d.sent_f, Item::Comm(e.send())),
            (Step::Sent, Flow::Gradient) => (&d.sent_b, Item::Comm(e.send())),
            (Step::Posted, Flow::Activation) => (&d.recv_f, Item::Comm(e.recv())),
            (Step::Posted, Flow::Gradient) => (&d.recv_b, Item::Comm(e.recv())),
        };
        match table[self.key(e.from, e.microbatch)] {
            NOT_RUN => Err(missing),
            t => Ok(t),
        }
    }

    /// The slot at which everything `item` needs has finished, or the first thing it waits for.
    fn ready(&self, item: &Item) -> Result<usize, Item> {
        let stages = self.s.stages();
        let mut at = 0;
        for a in item.actions() {
            for need in deps::needs(a, stages) {
                let t = match need {
                    Need::Stash(x) => {
                        let table = if x.op == Op::F {
                            &self.done.forward
                        } else {
                            &self.done.grad
                        };
                        match table[self.key(x.stage, x.microbatch)] {
                            NOT_RUN => return Err(Item::One(x)),
                            t => t,
                        }
                    }
                    // Its receive is posted earlier on this rank; the data comes with the send.
                    Need::Data(e) if self.lowered && self.crosses(&e) => {
                        self.finished(&e, Step::Sent)?
                    }
                    Need::Data(e) => self.finished(&e, Step::Produced)?,
                };
                at = at.max(t);
            }
        }
        match item {
            Item::Comm(c) => self.comm_ready(c),
            _ => Ok(at),
        }
    }

    /// As PyTorch's runtime runs them: a send, when its data was produced; a receive is posted at
    /// once (the compute that uses the data waits for its send, above); a send's wait, when the
    /// peer's receive was posted (the sender blocks there until the peer takes the data).
    fn comm_ready(&self, c: &Comm) -> Result<usize, Item> {
        match Edge::of(*c, self.s.stages()) {
            Some(e) if c.op.is_send() => self.finished(&e, Step::Produced),
            Some(e) if c.op.is_wait() => self.finished(&e, Step::Posted),
            _ => Ok(0),
        }
    }

    /// Records that `item` finished at slot `end`; returns the ranks that may have waited for it.
    fn complete(&mut self, item: &Item, end: usize) -> [Option<usize>; 2] {
        let stages = self.s.stages();
        let mut woken = [None, None];
        for (i, a) in item.actions().enumerate() {
            let key = self.key(a.stage, a.microbatch);
            match a.op {
                Op::F => self.done.forward[key] = end,
                Op::B | Op::I => self.done.grad[key] = end,
                Op::W => {}
            }
            if let Some(e) = deps::output(a, stages) {
                if !(self.lowered && self.crosses(&e)) {
                    woken[i] = Some(self.s.rank_of(e.to()));
                }
            }
        }
        if let Item::Comm(c) = item {
            if let Some(e) = Edge::of(*c, stages).filter(|_| !c.op.is_wait()) {
                let key = self.key(e.from, e.microbatch);
                let (table, peer) = match (c.op.is_send(), e.flow) {
                    (true, Flow::Activation) => (&mut self.done.sent_f, e.to()),
                    (true, Flow::Gradient) => (&mut self.done.sent_b, e.to()),
                    (false, Flow::Activation) => (&mut self.done.recv_f, e.from),
                    (false, Flow::Gradient) => (&mut self.done.recv_b, e.from),
                };
                table[key] = end;
                woken[0] = Some(self.s.rank_of(peer));
            }
        }
        woken
    }
}

/// The deadlock report: for each waiting `(rank, position, needs)`, where the needed item sits, and
/// the rank lists around the waiting items. The simulator reports its deadlocks with it too.
pub(crate) fn deadlock(s: &Schedule, waiting: &[(usize, usize, Item)]) -> ScheduleError {
    let mut waits = Vec::new();
    let mut marks = Vec::new();
    for &(rank, position, needs) in waiting {
        let Some(item) = s.actions.get(rank).and_then(|l| l.get(position)) else {
            continue;
        };
        let needs_rank = s.rank_of(needs.stage());
        let (needs, needs_position) = locate(s, needs, needs_rank);
        waits.push(Wait {
            rank,
            position,
            item: item.to_string(),
            needs,
            needs_rank,
            needs_position,
        });
        marks.push((rank, position));
    }
    ScheduleError::Deadlock {
        waits,
        grid: context_grid(s, &marks),
    }
}

/// Finds the item a waiting rank needs in its rank's list, as written there (a needed input gradient
/// is asked for as `I`; the schedule may hold it as `B`); the list's length if it is not there.
fn locate(s: &Schedule, needs: Item, rank: usize) -> (Item, usize) {
    let Some(list) = s.actions.get(rank) else {
        return (needs, 0);
    };
    let found = list.iter().enumerate().find_map(|(pos, it)| match needs {
        Item::One(wanted) => it
            .actions()
            .find(|a| deps::satisfies(*a, wanted))
            .map(|a| (Item::One(a), pos)),
        other => (*it == other).then_some((other, pos)),
    });
    found.unwrap_or((needs, list.len()))
}
