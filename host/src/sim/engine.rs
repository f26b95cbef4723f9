//! The simulator's run: ranks advance through their lists as their inputs arrive.
//!
//! What an action needs and hands on is read from [`deps`](crate::schedule::deps). A compute-only
//! schedule is simulated as its [lowering](crate::schedule::lower) would run, without building it: an
//! input from another rank arrives `latency + bytes / bandwidth` after its producer ended. A schedule
//! that carries its transfers is run as written: a send happens when its rank reaches it, a receive
//! waits on its rank until the data sent has arrived, both take no time on the rank.

use crate::cost::CostModel;
use crate::schedule::deps::{self, Edge, Flow, Footprint, InFlight, Need};
use crate::schedule::validate::{deadlock, has_transfers};
use crate::schedule::{Action, Comm, Item, Op, Schedule, ScheduleError};
use crate::timeline::{Source, Timeline, Transfer};

/// What a blocked rank waits for; indexes are `k * S + s` into [`Tables`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wanted {
    /// The output of `F(s,k)`.
    Forward(usize),
    /// The input gradient from `I(s,k)` / `B(s,k)`.
    Grad(usize),
    /// The send of an edge from stage `s` (explicit transfers only).
    Sent(Flow, usize),
}

/// Which input of an item arrived last (for the critical path).
#[derive(Debug, Clone, Copy)]
pub(super) enum Cause {
    Start,
    Data {
        rank: u32,
        index: u32,
        transfer: f64,
    },
}

/// When an item can start, or what it waits for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ready {
    /// All inputs are there at this time; the cause names the last one.
    At(f64, Cause),
    /// This input is missing.
    Wait(Wanted),
}

/// Sentinel for "not done yet" in the location tables.
const NOT_DONE: u64 = u64::MAX;

/// Packs a span location.
#[inline]
fn loc(rank: usize, index: usize) -> u64 {
    ((rank as u64) << 32) | index as u64
}

/// When and where something finished: 16 bytes.
#[derive(Debug, Clone, Copy)]
struct Mark {
    end: f64,
    at: u64,
}

const UNDONE: Mark = Mark {
    end: 0.0,
    at: NOT_DONE,
};

/// Completion of one `(stage, microbatch)`: its forward and its input backward, 32 bytes, so an
/// entry and its neighbour stages share cache lines.
#[derive(Debug, Clone, Copy)]
struct Entry {
    forward: Mark,
    grad: Mark,
}

/// Completion tables, one entry per `(stage, microbatch)` at index `k * S + s`: the stages of one
/// microbatch are adjacent (an action reads its own and a neighbour stage's entry), and only the
/// microbatches in flight are touched at any time.
struct Tables {
    stages: usize,
    entries: Vec<Entry>,
    /// Whether the backward ran as a full `B` (for the producer named in transfers).
    full_backward: Vec<bool>,
    /// Explicit transfers only: the sends of activations and gradients from each entry.
    sent: Vec<[Mark; 2]>,
}

impl Tables {
    #[inline]
    fn index(&self, stage: usize, microbatch: usize) -> usize {
        microbatch * self.stages + stage
    }

    /// `(stage, microbatch)` of an index.
    fn split(&self, j: usize) -> (usize, usize) {
        (j % self.stages, j / self.stages)
    }
}

fn flow_slot(flow: Flow) -> usize {
    match flow {
        Flow::Activation => 0,
        Flow::Gradient => 1,
    }
}

/// The simulator's working state for one run.
pub(super) struct Engine<'a> {
    pub schedule: &'a Schedule,
    pub costs: &'a CostModel,
    /// The schedule carries its transfers.
    lowered: bool,
    stage_rank: Vec<usize>,
    /// Transfer time across the boundary after stage `s`.
    send: Vec<f64>,
    footprint: Vec<Footprint>,
    tables: Tables,
    pub free_at: Vec<f64>,
    pos: Vec<usize>,
    blocked: Vec<Option<Wanted>>,
    ready: Vec<usize>,
    /// Busy time per rank.
    pub busy: Vec<f64>,
    /// Whether spans and transfers are recorded (off for `summarize`).
    record: bool,
    pub memory: InFlight,
    /// Whether an overlapped pair ran (the lower bound then allows overlap savings).
    pub overlapped: bool,
    pub timeline: Timeline,
}

impl<'a> Engine<'a> {
    pub fn new(schedule: &'a Schedule, costs: &'a CostModel, record: bool) -> Self {
        let (p, s, m) = (schedule.ranks, schedule.stages(), schedule.microbatches);
        let lowered = has_transfers(schedule);
        let mut timeline = Timeline::new(schedule.name.clone(), Source::Predicted, p);
        if record {
            for (lane, list) in timeline.spans.iter_mut().zip(&schedule.actions) {
                lane.reserve_exact(list.len());
            }
            // Every boundary between stages on different ranks carries M activations and M gradients.
            let crossings = (1..s)
                .filter(|&st| schedule.rank_of(st) != schedule.rank_of(st - 1))
                .count();
            timeline.transfers.reserve_exact(2 * m * crossings);
        }
        let n = s * m;
        Engine {
            schedule,
            costs,
            lowered,
            stage_rank: (0..s).map(|st| schedule.rank_of(st)).collect(),
            send: (0..s).map(|st| costs.boundary_time(st)).collect(),
            footprint: costs
                .stages
                .iter()
                .map(|c| Footprint {
                    bytes: c.activation_bytes,
                    released_at_input: c.released_at_input,
                })
                .collect(),
            tables: Tables {
                stages: s,
                entries: vec![
                    Entry {
                        forward: UNDONE,
                        grad: UNDONE,
                    };
                    n
                ],
                full_backward: vec![false; n],
                sent: if lowered {
                    vec![[UNDONE; 2]; n]
                } else {
                    Vec::new()
                },
            },
            free_at: vec![0.0; p],
            pos: vec![0; p],
            blocked: vec![None; p],
            ready: (0..p).rev().collect(),
            busy: vec![0.0; p],
            record,
            memory: InFlight::new(p),
            overlapped: false,
            timeline,
        }
    }

    /// Runs ranks from the ready stack until all are done or none can progress.
    pub fn run(&mut self) -> Result<(), ScheduleError> {
        while let Some(r) = self.ready.pop() {
            self.blocked[r] = None;
            self.advance(r);
        }
        if (0..self.schedule.ranks).any(|r| self.pos[r] < self.schedule.actions[r].len()) {
            return Err(self.deadlock());
        }
        Ok(())
    }

    /// Runs rank `r`'s items until it finishes or waits for an input.
    fn advance(&mut self, r: usize) {
        let list = &self.schedule.actions[r];
        while let Some(&item) = list.get(self.pos[r]) {
            let index = self.pos[r];
            let ready_at = match self.ready_time(r, &item) {
                Ready::At(t, _) => t,
                Ready::Wait(wanted) => {
                    self.blocked[r] = Some(wanted);
                    return;
                }
            };
            let dur = self.duration(&item);
            let start = ready_at.max(self.free_at[r]);
            let end = start + dur;
            self.free_at[r] = end;
            self.busy[r] += dur;
            for a in item.actions() {
                self.memory.start(r, a, &self.footprint[a.stage]);
            }
            for a in item.actions() {
                self.memory.end(r, a, &self.footprint[a.stage]);
                self.complete(r, index, a, end);
            }
            if let Item::Comm(c) = item {
                self.comm(r, index, c, end);
            }
            if self.record {
                self.timeline.push(r, item, start, end);
            }
            self.pos[r] = index + 1;
        }
    }

    /// How long `item` keeps its rank busy (transfers and parameter operations: none).
    #[inline]
    fn duration(&mut self, item: &Item) -> f64 {
        match *item {
            Item::One(a) => self.costs.stages[a.stage].time(a.op),
            Item::Overlap { forward, backward } => {
                self.overlapped = true;
                self.costs.pair_time(
                    self.costs.stages[forward.stage].forward,
                    self.costs.stages[backward.stage].time(backward.op),
                )
            }
            Item::Comm(_) | Item::Param(_) => 0.0,
        }
    }

    /// When all inputs of `item` (on rank `r`) are available and which input came last, or what it
    /// still waits for. For a pair, the later of its halves (the forward's on a tie). Pure: called
    /// again after the run to trace the critical path.
    #[inline]
    pub fn ready_time(&self, r: usize, item: &Item) -> Ready {
        match *item {
            Item::One(a) => self.inputs(r, a),
            Item::Overlap { forward, backward } => {
                let f = self.inputs(r, forward);
                let Ready::At(ft, _) = f else { return f };
                let b = self.inputs(r, backward);
                match b {
                    Ready::At(bt, _) if bt > ft => b,
                    Ready::At(..) => f,
                    other => other,
                }
            }
            Item::Comm(c) if !c.op.is_send() => self.received(r, c),
            Item::Comm(_) | Item::Param(_) => Ready::At(0.0, Cause::Start),
        }
    }

    /// When the inputs of `a` (to run on rank `r`) are available and which came last, or what it
    /// waits for. Small by design: this is the hot path.
    #[inline]
    fn inputs(&self, r: usize, a: Action) -> Ready {
        let t = &self.tables;
        let mut best: Option<(f64, Cause)> = None;
        for need in deps::needs(a, t.stages) {
            let (mark, transfer, wanted) = match need {
                Need::Stash(x) => {
                    let j = t.index(x.stage, x.microbatch);
                    match x.op {
                        Op::F => (t.entries[j].forward, 0.0, Wanted::Forward(j)),
                        _ => (t.entries[j].grad, 0.0, Wanted::Grad(j)),
                    }
                }
                Need::Data(e) => {
                    let crosses = self.stage_rank[e.from] != r;
                    if crosses && self.lowered {
                        // Its receive, earlier on this rank, waited for it.
                        continue;
                    }
                    let j = t.index(e.from, e.microbatch);
                    let transfer = if crosses {
                        self.send[e.boundary()]
                    } else {
                        0.0
                    };
                    match e.flow {
                        Flow::Activation => (t.entries[j].forward, transfer, Wanted::Forward(j)),
                        Flow::Gradient => (t.entries[j].grad, transfer, Wanted::Grad(j)),
                    }
                }
            };
            if mark.at == NOT_DONE {
                return Ready::Wait(wanted);
            }
            let at = mark.end + transfer;
            if best.is_none_or(|(b, _)| at > b) {
                let cause = Cause::Data {
                    rank: (mark.at >> 32) as u32,
                    index: mark.at as u32,
                    transfer,
                };
                best = Some((at, cause));
            }
        }
        let (at, cause) = best.unwrap_or((0.0, Cause::Start));
        Ready::At(at, cause)
    }

    /// A receive on rank `r`: ready when the data sent has arrived.
    fn received(&self, r: usize, c: Comm) -> Ready {
        let Some(e) = Edge::of(c, self.tables.stages) else {
            return Ready::At(0.0, Cause::Start);
        };
        let j = self.tables.index(e.from, e.microbatch);
        let mark = self.tables.sent[j][flow_slot(e.flow)];
        if mark.at == NOT_DONE {
            return Ready::Wait(Wanted::Sent(e.flow, j));
        }
        let transfer = if self.stage_rank[e.from] != r {
            self.send[e.boundary()]
        } else {
            0.0
        };
        Ready::At(
            mark.end + transfer,
            Cause::Data {
                rank: (mark.at >> 32) as u32,
                index: mark.at as u32,
                transfer,
            },
        )
    }

    /// Records the completion of `a` at `end` on rank `r`; without explicit transfers, also the
    /// transfer of its output and the wake-up of the rank waiting for it.
    #[inline]
    fn complete(&mut self, r: usize, index: usize, a: Action, end: f64) {
        let j = self.tables.index(a.stage, a.microbatch);
        let here = Mark {
            end,
            at: loc(r, index),
        };
        let wanted = match a.op {
            Op::F => {
                self.tables.entries[j].forward = here;
                Wanted::Forward(j)
            }
            Op::I | Op::B => {
                self.tables.entries[j].grad = here;
                self.tables.full_backward[j] = a.op == Op::B;
                Wanted::Grad(j)
            }
            Op::W => return,
        };
        if self.lowered {
            return;
        }
        let Some(e) = deps::output(a, self.tables.stages) else {
            return;
        };
        let c = self.stage_rank[e.to()];
        if c == r {
            return;
        }
        self.hand_over(r, c, e, end, wanted);
    }

    /// A send on rank `r` at `end`: records it and wakes the receiving rank.
    fn comm(&mut self, r: usize, index: usize, c: Comm, end: f64) {
        if !c.op.is_send() {
            return;
        }
        let Some(e) = Edge::of(c, self.tables.stages) else {
            return;
        };
        let j = self.tables.index(e.from, e.microbatch);
        self.tables.sent[j][flow_slot(e.flow)] = Mark {
            end,
            at: loc(r, index),
        };
        let to = self.stage_rank[e.to()];
        self.hand_over(r, to, e, end, Wanted::Sent(e.flow, j));
    }

    /// Records the transfer over `e` from rank `r` to rank `to` starting at `end`, and wakes `to`
    /// if it waits for `wanted`.
    #[inline]
    fn hand_over(&mut self, r: usize, to: usize, e: Edge, end: f64, wanted: Wanted) {
        if self.record {
            let j = self.tables.index(e.from, e.microbatch);
            let mut producer = e.producer();
            if e.flow == Flow::Gradient && self.tables.full_backward[j] {
                producer.op = Op::B;
            }
            self.timeline.push_transfer(Transfer {
                from_rank: r,
                to_rank: to,
                producer,
                consumer: Action::new(producer.op, e.to(), e.microbatch),
                start: end,
                end: end + self.send[e.boundary()],
                bytes: self.costs.stages[e.boundary()].output_bytes,
            });
        }
        if self.blocked[to] == Some(wanted) {
            self.blocked[to] = None;
            self.ready.push(to);
        }
    }

    /// The deadlock error: every unfinished rank, its next item and what it waits for.
    fn deadlock(&self) -> ScheduleError {
        let waiting: Vec<(usize, usize, Item)> = (0..self.schedule.ranks)
            .filter(|&r| self.pos[r] < self.schedule.actions[r].len())
            .filter_map(|r| {
                let needs = match self.blocked[r]? {
                    Wanted::Forward(j) => {
                        let (s, k) = self.tables.split(j);
                        Item::One(Action::new(Op::F, s, k))
                    }
                    Wanted::Grad(j) => {
                        let (s, k) = self.tables.split(j);
                        Item::One(Action::new(Op::I, s, k))
                    }
                    Wanted::Sent(flow, j) => {
                        let (from, microbatch) = self.tables.split(j);
                        Item::Comm(
                            Edge {
                                flow,
                                from,
                                microbatch,
                            }
                            .send(),
                        )
                    }
                };
                Some((r, self.pos[r], needs))
            })
            .collect();
        deadlock(self.schedule, &waiting)
    }
}
