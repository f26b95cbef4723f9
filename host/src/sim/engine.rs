//! The simulator's run: ranks advance through their lists as their inputs arrive.
//!
//! What an action needs and hands on is read from [`deps`]. A compute-only
//! schedule is simulated as its [lowering](crate::schedule::lower) would run, without building it: an
//! input from another rank arrives `latency + bytes / bandwidth` after its producer ended. A schedule
//! that carries its transfers is run as PyTorch's `_PipelineScheduleRuntime` runs it: a send is
//! posted when its rank reaches it and the data travels at once (it arrives `latency + bytes /
//! bandwidth` later); a receive is posted where it sits and never blocks its rank; the compute that
//! consumes the data waits for it to arrive (PyTorch waits on the receive right before the `F`,
//! `I` or `B` that needs it); a send's wait (`WAIT_SEND_*`) blocks the sender until the data has
//! arrived and the peer has posted its receive. Sends, receives and waits take no time on the rank.
//! A `REDUCE_GRAD` starts its stage's data-parallel reduction, which takes the time
//! [`Engine::with_reductions`] gives it (none by default) and overlaps what follows; its
//! `WAIT_REDUCE_GRAD` blocks the rank until it has ended.

use crate::cost::{CostModel, StageCost};
use crate::schedule::deps::{self, Edge, Flow, Footprint, InFlight, Need};
use crate::schedule::validate::deadlock;
use crate::schedule::walk::{walk, Stuck, Waker, Walk};
use crate::schedule::{Action, Comm, Item, Op, ParamOp, Schedule, ScheduleError};
use crate::timeline::{Source, Span, Timeline, Transfer};

/// What a blocked rank waits for; indexes are `s * M + k` into [`Tables`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wanted {
    /// The output of `F(s,k)`.
    Forward(usize),
    /// The input gradient from `I(s,k)` / `B(s,k)`.
    Grad(usize),
    /// The send of an edge from stage `s` (explicit transfers only).
    Sent(Flow, usize),
    /// The receive of an edge from stage `s` (a send's wait waits for it).
    Received(Flow, usize),
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

/// Completion of one `(stage, microbatch)`: when its forward and its input backward ended, and
/// where (their position in their rank's list plus one; 0 while not done). 24 bytes, so an entry
/// and its neighbour stages share cache lines. The rank is the stage's own.
#[derive(Debug, Clone, Copy)]
struct Entry {
    forward_end: f64,
    grad_end: f64,
    forward_at: u32,
    grad_at: u32,
}

impl Entry {
    const UNDONE: Entry = Entry {
        forward_end: 0.0,
        grad_end: 0.0,
        forward_at: 0,
        grad_at: 0,
    };

    /// `(end, position + 1)` of the forward, or of the input backward when `grad`.
    #[inline]
    fn get(&self, grad: bool) -> (f64, u32) {
        if grad {
            (self.grad_end, self.grad_at)
        } else {
            (self.forward_end, self.forward_at)
        }
    }
}

/// When and where a send ended (explicit transfers only), as in [`Entry`].
#[derive(Debug, Clone, Copy)]
struct Mark {
    end: f64,
    at: u32,
}

/// Completion tables, one entry per `(stage, microbatch)` at index `s * M + k`: a rank runs a
/// stage's microbatches mostly in order, so its reads of its own and of a neighbour stage's entries
/// are two sequential streams (which the hardware prefetches; the `k * S + s` order missed the
/// cache on about every read).
struct Tables {
    stages: usize,
    microbatches: usize,
    entries: Vec<Entry>,
    /// Explicit transfers only: the sends of activations and gradients from each entry, their
    /// receives, and whether the backward ran as a full `B` (for the producer named in transfers).
    sent: Vec<[Mark; 2]>,
    received: Vec<[Mark; 2]>,
    full_backward: Vec<bool>,
}

impl Tables {
    #[inline]
    fn index(&self, stage: usize, microbatch: usize) -> usize {
        stage * self.microbatches + microbatch
    }

    /// `(stage, microbatch)` of an index.
    fn split(&self, j: usize) -> (usize, usize) {
        (j / self.microbatches, j % self.microbatches)
    }
}

fn flow_slot(flow: Flow) -> usize {
    match flow {
        Flow::Activation => 0,
        Flow::Gradient => 1,
    }
}

/// How many items ahead of the one it runs a rank touches its list (see `Engine::advance`).
const LOOK_AHEAD: usize = 4;

/// What a run records besides the numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Record {
    /// A span per item.
    pub spans: bool,
    /// A transfer per crossing.
    pub transfers: bool,
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
    /// Busy time per rank.
    pub busy: Vec<f64>,
    /// Per rank, when its first item started (0 until it has).
    pub first_start: Vec<f64>,
    /// What is recorded into the timeline (nothing for `summarize`).
    record: Record,
    pub memory: InFlight,
    /// Whether an overlapped pair ran (the lower bound then allows overlap savings).
    pub overlapped: bool,
    pub timeline: Timeline,
    /// Per stage, how long its data-parallel reduction takes (empty: no time).
    reduce_time: Vec<f64>,
    /// Per stage, when its reduction ends and the position of its `REDUCE_GRAD` plus one (0: not
    /// started).
    reduce_end: Vec<Mark>,
}

impl Walk for Engine<'_> {
    type Wanted = Wanted;

    /// Runs rank `r`'s items until it finishes or waits for an input. The rank's position, clock
    /// and lane are kept in locals meanwhile (this is the hot loop).
    #[inline]
    fn advance(&mut self, r: usize, at: &mut usize, waker: &mut Waker<Wanted>) -> Option<Wanted> {
        let schedule = self.schedule;
        let list = &schedule.actions[r];
        let mut lane = std::mem::take(&mut self.timeline.spans[r]);
        let (mut pos, mut free, mut busy) = (*at, self.free_at[r], self.busy[r]);
        let mut waits = None;
        while let Some(&item) = list.get(pos) {
            // Touch an item a few places ahead so that its cache line is on its way by then: the
            // ranks take turns, too many interleaved streams for the hardware prefetcher.
            std::hint::black_box(list.get(pos + LOOK_AHEAD).map(Item::stage));
            let ready_at = match self.ready_time(r, &item) {
                Ready::At(t, _) => t,
                Ready::Wait(wanted) => {
                    waits = Some(wanted);
                    break;
                }
            };
            let dur = self.duration(&item);
            let start = ready_at.max(free);
            let end = start + dur;
            if pos == 0 {
                self.first_start[r] = start;
            }
            free = end;
            busy += dur;
            for a in item.actions() {
                self.memory.start(r, a, &self.footprint[a.stage]);
            }
            for a in item.actions() {
                self.memory.end(r, a, &self.footprint[a.stage]);
                self.complete(r, pos, a, end, waker);
            }
            match item {
                Item::Comm(c) => self.comm(r, pos, c, end, waker),
                Item::Param(p) if p.op == ParamOp::ReduceGrad => {
                    let time = self.reduce_time.get(p.stage).copied().unwrap_or(0.0);
                    if let Some(mark) = self.reduce_end.get_mut(p.stage) {
                        *mark = Mark {
                            end: end + time,
                            at: pos as u32 + 1,
                        };
                    }
                }
                _ => {}
            }
            if self.record.spans {
                lane.push(Span::new(item, start, end));
            }
            pos += 1;
        }
        (*at, self.free_at[r], self.busy[r]) = (pos, free, busy);
        self.timeline.spans[r] = lane;
        waits
    }
}

impl<'a> Engine<'a> {
    /// A run of `schedule` (`lowered`: it carries its transfers) under `costs`.
    pub fn new(
        schedule: &'a Schedule,
        costs: &'a CostModel,
        lowered: bool,
        record: Record,
    ) -> Self {
        let (p, s, m) = (schedule.ranks, schedule.stages(), schedule.microbatches);
        let mut timeline = Timeline::new(schedule.name.clone(), Source::Predicted, p);
        if record.spans {
            for (lane, list) in timeline.spans.iter_mut().zip(&schedule.actions) {
                lane.reserve_exact(list.len());
            }
        }
        if record.transfers {
            // Every boundary between stages on different ranks carries M activations and M gradients.
            let crossings = (1..s)
                .filter(|&st| schedule.rank_of(st) != schedule.rank_of(st - 1))
                .count();
            timeline.transfers.reserve_exact(2 * m * crossings);
        }
        let n = s * m;
        let unsent = [Mark { end: 0.0, at: 0 }; 2];
        let (sent, received, full_backward) = if lowered {
            (vec![unsent; n], vec![unsent; n], vec![false; n])
        } else {
            (Vec::new(), Vec::new(), Vec::new())
        };
        Engine {
            schedule,
            costs,
            lowered,
            stage_rank: (0..s).map(|st| schedule.rank_of(st)).collect(),
            send: (0..s).map(|st| costs.boundary_time(st)).collect(),
            footprint: costs.stages.iter().map(StageCost::footprint).collect(),
            tables: Tables {
                stages: s,
                microbatches: m,
                entries: vec![Entry::UNDONE; n],
                sent,
                received,
                full_backward,
            },
            free_at: vec![0.0; p],
            busy: vec![0.0; p],
            first_start: vec![0.0; p],
            record,
            memory: InFlight::new(p),
            overlapped: false,
            timeline,
            reduce_time: Vec::new(),
            reduce_end: vec![Mark { end: 0.0, at: 0 }; s],
        }
    }

    /// The same run with each stage's data-parallel reduction taking `time[stage]`: it starts at
    /// the stage's `REDUCE_GRAD` and its `WAIT_REDUCE_GRAD` waits for its end.
    pub fn with_reductions(mut self, time: Vec<f64>) -> Self {
        self.reduce_time = time;
        self
    }

    /// Runs every rank as far as it can (the one [walk](crate::schedule::walk)); an error
    /// names the ranks left waiting.
    pub fn run(&mut self) -> Result<(), ScheduleError> {
        let stuck = walk(self, &mut vec![0; self.schedule.ranks]);
        if stuck.is_empty() {
            return Ok(());
        }
        Err(self.deadlock(&stuck))
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
            Item::Comm(c) if c.op.is_wait() => self.taken(c),
            Item::Param(p) if p.op == ParamOp::WaitReduceGrad => self.reduced(r, p.stage),
            // A receive is posted where it sits; the compute that uses the data waits for it.
            Item::Comm(_) | Item::Param(_) => Ready::At(0.0, Cause::Start),
        }
    }

    /// When the inputs of `a` (to run on rank `r`) are available and which came last, or what it
    /// waits for. Small by design: this is the hot path.
    #[inline]
    fn inputs(&self, r: usize, a: Action) -> Ready {
        let t = &self.tables;
        let mut best = (0.0, Cause::Start);
        for need in deps::needs(a, t.stages) {
            let (j, grad, transfer, from) = match need {
                Need::Stash(x) => (t.index(x.stage, x.microbatch), x.op != Op::F, 0.0, r),
                Need::Data(e) => {
                    let from = self.stage_rank[e.from];
                    let crosses = from != r;
                    if crosses && self.lowered {
                        // Its receive is posted earlier on this rank; the data left with its send.
                        match self.arrival(r, e) {
                            Ready::At(t, cause) => {
                                if matches!(best.1, Cause::Start) || t > best.0 {
                                    best = (t, cause);
                                }
                                continue;
                            }
                            wait => return wait,
                        }
                    }
                    let transfer = if crosses {
                        self.send[e.boundary()]
                    } else {
                        0.0
                    };
                    let j = t.index(e.from, e.microbatch);
                    (j, e.flow == Flow::Gradient, transfer, from)
                }
            };
            let (end, at) = t.entries[j].get(grad);
            if at == 0 {
                return Ready::Wait(if grad {
                    Wanted::Grad(j)
                } else {
                    Wanted::Forward(j)
                });
            }
            let ready = end + transfer;
            if matches!(best.1, Cause::Start) || ready > best.0 {
                let cause = Cause::Data {
                    rank: from as u32,
                    index: at - 1,
                    transfer,
                };
                best = (ready, cause);
            }
        }
        Ready::At(best.0, best.1)
    }

    /// When the data of edge `e` reaches rank `r` (explicit transfers): its send's end plus the
    /// transfer, or the send it waits for.
    fn arrival(&self, r: usize, e: Edge) -> Ready {
        let j = self.tables.index(e.from, e.microbatch);
        let mark = self.tables.sent[j][flow_slot(e.flow)];
        if mark.at == 0 {
            return Ready::Wait(Wanted::Sent(e.flow, j));
        }
        let from = self.stage_rank[e.from];
        let transfer = if from != r {
            self.send[e.boundary()]
        } else {
            0.0
        };
        Ready::At(
            mark.end + transfer,
            Cause::Data {
                rank: from as u32,
                index: mark.at - 1,
                transfer,
            },
        )
    }

    /// A send's wait: ready when its data has arrived at the peer and the peer has posted the
    /// receive (the later of the two is the cause).
    fn taken(&self, c: Comm) -> Ready {
        let Some(e) = Edge::of(c, self.tables.stages) else {
            return Ready::At(0.0, Cause::Start);
        };
        let j = self.tables.index(e.from, e.microbatch);
        let mark = self.tables.received[j][flow_slot(e.flow)];
        if mark.at == 0 {
            return Ready::Wait(Wanted::Received(e.flow, j));
        }
        let posted = Ready::At(
            mark.end,
            Cause::Data {
                rank: self.stage_rank[e.to()] as u32,
                index: mark.at - 1,
                transfer: 0.0,
            },
        );
        match self.arrival(self.stage_rank[e.to()], e) {
            Ready::At(t, _) if t <= mark.end => posted,
            arrived => arrived,
        }
    }

    /// A `WAIT_REDUCE_GRAD` of `stage` on rank `r`: ready when the reduction its `REDUCE_GRAD`
    /// (earlier on the rank, as the validator requires) started has ended.
    fn reduced(&self, r: usize, stage: usize) -> Ready {
        match self.reduce_end.get(stage) {
            Some(m) if m.at > 0 => Ready::At(
                m.end,
                Cause::Data {
                    rank: r as u32,
                    index: m.at - 1,
                    transfer: self.reduce_time.get(stage).copied().unwrap_or(0.0),
                },
            ),
            _ => Ready::At(0.0, Cause::Start),
        }
    }

    /// Records the completion of `a` at `end`, item `index` of rank `r`; without explicit
    /// transfers, also the transfer of its output and the wake-up of the rank waiting for it.
    #[inline]
    fn complete(&mut self, r: usize, index: usize, a: Action, end: f64, waker: &mut Waker<Wanted>) {
        let j = self.tables.index(a.stage, a.microbatch);
        // `check_shape` keeps every list below 2^32 - 1 items.
        let at = index as u32 + 1;
        let entry = &mut self.tables.entries[j];
        let wanted = match a.op {
            Op::F => {
                (entry.forward_end, entry.forward_at) = (end, at);
                Wanted::Forward(j)
            }
            Op::I | Op::B => {
                (entry.grad_end, entry.grad_at) = (end, at);
                if self.lowered {
                    self.tables.full_backward[j] = a.op == Op::B;
                }
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
        self.hand_over(r, c, e, a.op, end, wanted, waker);
    }

    /// A send on rank `r` at `end`: records it and wakes the receiving rank. A receive: records
    /// it and wakes the sender if it waits for it.
    fn comm(&mut self, r: usize, index: usize, c: Comm, end: f64, waker: &mut Waker<Wanted>) {
        if c.op.is_wait() {
            return;
        }
        let Some(e) = Edge::of(c, self.tables.stages) else {
            return;
        };
        let j = self.tables.index(e.from, e.microbatch);
        if c.op.is_recv() {
            self.tables.received[j][flow_slot(e.flow)] = Mark {
                end,
                at: index as u32 + 1,
            };
            let from = self.stage_rank[e.from];
            waker.wake(from, Wanted::Received(e.flow, j));
            return;
        }
        self.tables.sent[j][flow_slot(e.flow)] = Mark {
            end,
            at: index as u32 + 1,
        };
        let op = match e.flow {
            Flow::Gradient if self.tables.full_backward[j] => Op::B,
            _ => e.producer().op,
        };
        let to = self.stage_rank[e.to()];
        self.hand_over(r, to, e, op, end, Wanted::Sent(e.flow, j), waker);
    }

    /// Records the transfer over `e` (produced by an `op`) from rank `r` to rank `to` starting at
    /// `end`, and wakes `to` if it waits for `wanted`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn hand_over(
        &mut self,
        r: usize,
        to: usize,
        e: Edge,
        op: Op,
        end: f64,
        wanted: Wanted,
        waker: &mut Waker<Wanted>,
    ) {
        if self.record.transfers {
            let producer = Action::new(op, e.from, e.microbatch);
            self.timeline.push_transfer(Transfer::new(
                r,
                to,
                producer,
                Action::new(op, e.to(), e.microbatch),
                end,
                end + self.send[e.boundary()],
                self.costs.stages[e.boundary()].output_bytes,
            ));
        }
        waker.wake(to, wanted);
    }

    /// The edge of `flow` from the stage and microbatch of index `j`.
    fn edge(&self, flow: Flow, j: usize) -> Edge {
        let (from, microbatch) = self.tables.split(j);
        Edge {
            flow,
            from,
            microbatch,
        }
    }

    /// The deadlock error: every unfinished rank, its next item and what it waits for.
    fn deadlock(&self, stuck: &[Stuck<Wanted>]) -> ScheduleError {
        let waiting: Vec<(usize, usize, Item)> = stuck
            .iter()
            .map(|w| {
                let needs = match w.wanted {
                    Wanted::Forward(j) => {
                        let (s, k) = self.tables.split(j);
                        Item::One(Action::new(Op::F, s, k))
                    }
                    Wanted::Grad(j) => {
                        let (s, k) = self.tables.split(j);
                        Item::One(Action::new(Op::I, s, k))
                    }
                    Wanted::Sent(flow, j) => Item::Comm(self.edge(flow, j).send()),
                    Wanted::Received(flow, j) => Item::Comm(self.edge(flow, j).recv()),
                };
                (w.rank, w.pos, needs)
            })
            .collect();
        deadlock(self.schedule, &waiting)
    }
}
