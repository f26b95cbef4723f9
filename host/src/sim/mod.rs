//! The discrete-event simulator: a schedule and a cost model in, a predicted [`Timeline`] out.
//!
//! ## Model
//!
//! Each rank runs its items in order, one at a time. An item starts when its rank is free **and** its
//! inputs have arrived:
//!
//! - `F(s,k)` needs the output of `F(s-1,k)` (nothing for `s = 0`);
//! - `I(s,k)` / `B(s,k)` need `F(s,k)` and the input gradient from `I(s+1,k)` / `B(s+1,k)` (the last
//!   stage's backward needs only its forward, which computed the loss);
//! - `W(s,k)` needs `I(s,k)`.
//!
//! Data produced on one rank and needed on another arrives `latency + bytes / bandwidth` after the
//! producer ends (the boundary's `output_bytes`, both for activations forward and gradients backward);
//! on the same rank it is available at once. Links have no contention: every transfer runs on its own
//! (a good model for NVLink / InfiniBand point-to-point with a few messages in flight, optimistic when
//! many large transfers share one link). An overlapped pair `(F;B)` starts when both halves can start,
//! takes [`CostModel::pair_time`] and both halves end together.
//!
//! The simulation is one pass over the items with a stack of ranks that can progress: a rank runs until
//! it meets an item whose input is missing, records which input, and is woken by the item that produces
//! it. Each item is looked at a constant number of times, so the cost is linear in the number of
//! actions (see `host/benches/sim.rs` and NOTES.md for the measured rate).
//!
//! ## Outputs
//!
//! [`simulate`] returns a [`Simulation`]: the [`Timeline`] (start and end of every item and transfer;
//! makespan, busy, idle and bubble fraction are methods there), the peak activation bytes per rank,
//! the critical path, and the [lower bound](lower_bound) that no schedule can beat with these costs.
//!
//! ```
//! use pipefill_host::cost::{CostModel, LinkCost, StageCost};
//! use pipefill_host::schedule::{Placement, Schedule};
//! use pipefill_host::sim::simulate;
//! // Two ranks, one microbatch, written by hand: rank 0 runs 0F0 then 0B0, rank 1 runs 1F0 then 1B0.
//! let s = Schedule {
//!     name: "tiny".into(), ranks: 2, chunks: 1, microbatches: 1, placement: Placement::Looped,
//!     actions: vec![
//!         vec!["0F0".parse().unwrap(), "0B0".parse().unwrap()],
//!         vec!["1F0".parse().unwrap(), "1B0".parse().unwrap()],
//!     ],
//! };
//! let costs = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 2, LinkCost::default());
//! let sim = simulate(&s, &costs).unwrap();
//! assert_eq!(sim.timeline.makespan(), 6.0); // F, F, B(2), B(2)
//! assert_eq!(sim.critical_path.len(), 4);
//! ```

mod bound;
mod error;
mod memory;

pub use bound::{bound_for, lower_bound};
pub use error::SimError;
pub use memory::{activation_curve, peak_activations};

use crate::cost::CostModel;
use crate::schedule::{Action, Item, Op, Schedule};
use crate::timeline::{Source, Timeline, Transfer};

/// Why an item on the critical path could not start earlier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Via {
    /// It started at time 0 (the first item of the path).
    Start,
    /// Its rank was busy with the previous item of the path until it started.
    Rank,
    /// It waited for data from the previous item of the path, which took `transfer` to arrive
    /// (0 on the same rank).
    Data {
        /// Transfer time on the edge (0 when producer and consumer share a rank).
        transfer: f64,
    },
}

/// One step of the critical path: the item at `spans[rank][index]` of the timeline, and why it could
/// not start earlier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathStep {
    /// The rank.
    pub rank: usize,
    /// Position in the rank's list (and in `timeline.spans[rank]`).
    pub index: usize,
    /// What it waited for.
    pub via: Via,
}

/// Everything the simulator predicts for one schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// Start and end of every item and transfer (`source` is [`Source::Predicted`]).
    pub timeline: Timeline,
    /// Peak activation bytes held on each rank (parameters not included).
    pub peak_activations: Vec<f64>,
    /// The chain of items that determines the makespan, in time order: shortening any of them (or the
    /// transfers between them) is the only way to finish earlier.
    pub critical_path: Vec<PathStep>,
    /// A makespan no schedule can beat with these costs, ranks, chunks and placement ([`lower_bound`]).
    pub lower_bound: f64,
}

impl Simulation {
    /// `makespan / lower_bound` (1 is optimal); 1 when both are 0.
    pub fn ratio_to_bound(&self) -> f64 {
        let m = self.timeline.makespan();
        if self.lower_bound > 0.0 {
            m / self.lower_bound
        } else {
            1.0
        }
    }

    /// Total transfer time on the critical path.
    pub fn critical_transfer_time(&self) -> f64 {
        self.critical_path
            .iter()
            .map(|p| match p.via {
                Via::Data { transfer } => transfer,
                _ => 0.0,
            })
            .sum()
    }
}

/// What an item is waiting for: a slot in the completion tables (`F` output or input gradient).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Output of `F(s,k)` at index `k * S + s`.
    Forward(usize),
    /// Input gradient of stage `s` from `I(s,k)` / `B(s,k)` at index `k * S + s`.
    Grad(usize),
}

/// Which input of an item arrived last (for the critical path).
#[derive(Debug, Clone, Copy)]
enum Cause {
    Start,
    Data {
        rank: u32,
        index: u32,
        transfer: f64,
    },
}

/// When an item can start, what it waits for, or why it cannot run.
#[derive(Debug, Clone, Copy)]
enum Ready {
    /// All inputs are there at this time; the cause names the last one.
    At(f64, Cause),
    /// This input is missing.
    Wait(Slot),
    /// The item can never run here (the reason).
    Bad(&'static str),
}

/// Sentinel for "not done yet" in the location tables.
const NOT_DONE: u64 = u64::MAX;

/// Packs a span location.
#[inline]
fn loc(rank: usize, index: usize) -> u64 {
    ((rank as u64) << 32) | index as u64
}

/// Completion state of one `(stage, microbatch)`: 32 bytes, so a slot and its neighbour stages share
/// cache lines.
#[derive(Debug, Clone, Copy)]
struct SlotState {
    /// End time of `F(s,k)`.
    f_end: f64,
    /// End time of `I(s,k)` / `B(s,k)`.
    g_end: f64,
    /// Where `F(s,k)` ran, or [`NOT_DONE`].
    f_loc: u64,
    /// Where `I(s,k)` / `B(s,k)` ran, or [`NOT_DONE`].
    g_loc: u64,
}

/// Completion tables, one entry per `(stage, microbatch)` at index `k * S + s`: the stages of one
/// microbatch are adjacent (an action reads its own and a neighbour stage's entry), and only the
/// microbatches in flight are touched at any time.
struct Done {
    stages: usize,
    m: usize,
    slots: Vec<SlotState>,
    /// 0: no backward yet, 1: `I` done, 2: `B` done, 3: `I` and `W` done.
    g_kind: Vec<u8>,
}

impl Done {
    #[inline]
    fn index(&self, stage: usize, microbatch: usize) -> usize {
        microbatch * self.stages + stage
    }

    /// `(stage, microbatch)` of an index.
    fn split(&self, j: usize) -> (usize, usize) {
        (j % self.stages, j / self.stages)
    }
}

/// The simulator's working state for one run.
struct Run<'a> {
    schedule: &'a Schedule,
    costs: &'a CostModel,
    stage_rank: Vec<usize>,
    /// Transfer time across the boundary after stage `s`.
    send: Vec<f64>,
    done: Done,
    free_at: Vec<f64>,
    pos: Vec<usize>,
    blocked: Vec<Option<Slot>>,
    ready: Vec<usize>,
    /// Busy time per rank.
    busy: Vec<f64>,
    /// Whether spans and transfers are recorded (off for [`summarize`]).
    record: bool,
    mem_now: Vec<f64>,
    mem_peak: Vec<f64>,
    /// Whether an overlapped pair ran (the lower bound then allows overlap savings).
    overlapped: bool,
    timeline: Timeline,
}

/// Simulates `schedule` under `costs`: see the [module docs](self) for the model.
///
/// Errors: the cost model is invalid or has the wrong number of stages; an item names a stage or
/// microbatch out of range, sits on a rank that does not hold its stage, or repeats an action; the
/// schedule deadlocks (the error names every waiting rank, its item and what it waits for).
pub fn simulate(schedule: &Schedule, costs: &CostModel) -> Result<Simulation, SimError> {
    check_shape(schedule, costs)?;
    let mut run = Run::new(schedule, costs, true);
    run.run()?;
    let critical_path = run.critical_path();
    let lower_bound = run.lower_bound();
    Ok(Simulation {
        timeline: run.timeline,
        peak_activations: run.mem_peak,
        critical_path,
        lower_bound,
    })
}

/// The numbers of a simulation without its timeline: what a search over many candidate plans needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Predicted step time.
    pub makespan: f64,
    /// Per rank, time spent computing.
    pub busy: Vec<f64>,
    /// Per rank, peak activation bytes.
    pub peak_activations: Vec<f64>,
    /// The [`lower_bound`].
    pub lower_bound: f64,
}

impl Summary {
    /// `1 - sum(busy) / (P * makespan)`; 0 for an empty schedule.
    pub fn bubble_fraction(&self) -> f64 {
        let p = self.busy.len() as f64;
        if self.makespan <= 0.0 || p == 0.0 {
            0.0
        } else {
            1.0 - self.busy.iter().sum::<f64>() / (p * self.makespan)
        }
    }

    /// `makespan / lower_bound`; 1 when both are 0.
    pub fn ratio_to_bound(&self) -> f64 {
        if self.lower_bound > 0.0 {
            self.makespan / self.lower_bound
        } else {
            1.0
        }
    }
}

/// Like [`simulate`] (same model, same checks, same numbers) but records no timeline: no memory per
/// action, for searches that simulate many candidates and keep only the numbers.
///
/// ```
/// # use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// # use pipefill_host::schedule::{families, Params};
/// use pipefill_host::sim::{simulate, summarize};
/// let s = families::generate("1f1b", &Params::new(4, 8)).unwrap();
/// let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
/// let sum = summarize(&s, &c).unwrap();
/// assert_eq!(sum.makespan, 33.0); // (M + P - 1)(F + B)
/// assert_eq!(sum.makespan, simulate(&s, &c).unwrap().timeline.makespan());
/// ```
pub fn summarize(schedule: &Schedule, costs: &CostModel) -> Result<Summary, SimError> {
    check_shape(schedule, costs)?;
    let mut run = Run::new(schedule, costs, false);
    run.run()?;
    Ok(Summary {
        makespan: run.free_at.iter().copied().fold(0.0, f64::max),
        lower_bound: run.lower_bound(),
        busy: run.busy,
        peak_activations: run.mem_peak,
    })
}

/// Refuses cost models and schedules that do not fit together.
fn check_shape(schedule: &Schedule, costs: &CostModel) -> Result<(), SimError> {
    let shape = |reason: String| SimError::Shape {
        schedule: schedule.name.clone(),
        reason,
    };
    if schedule.ranks == 0 || schedule.chunks == 0 {
        return Err(shape(format!(
            "needs at least one rank and one chunk, has {} ranks and {} chunks",
            schedule.ranks, schedule.chunks
        )));
    }
    if schedule.actions.len() != schedule.ranks {
        return Err(shape(format!(
            "has {} ranks but {} action lists; give one list per rank",
            schedule.ranks,
            schedule.actions.len()
        )));
    }
    if schedule.ranks >= u32::MAX as usize
        || schedule
            .actions
            .iter()
            .any(|a| a.len() >= u32::MAX as usize)
    {
        return Err(shape(
            "is too large to simulate (over 2^32 items on a rank)".into(),
        ));
    }
    if costs.stages.len() != schedule.stages() {
        return Err(SimError::Stages {
            schedule: schedule.name.clone(),
            costs: costs.stages.len(),
            stages: schedule.stages(),
            ranks: schedule.ranks,
            chunks: schedule.chunks,
        });
    }
    costs.check()?;
    Ok(())
}

impl<'a> Run<'a> {
    fn new(schedule: &'a Schedule, costs: &'a CostModel, record: bool) -> Self {
        let (p, s, m) = (schedule.ranks, schedule.stages(), schedule.microbatches);
        let slots = s * m;
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
        Run {
            schedule,
            costs,
            stage_rank: (0..s).map(|st| schedule.rank_of(st)).collect(),
            send: (0..s).map(|st| costs.boundary_time(st)).collect(),
            done: Done {
                m,
                stages: s,
                slots: vec![
                    SlotState {
                        f_end: 0.0,
                        g_end: 0.0,
                        f_loc: NOT_DONE,
                        g_loc: NOT_DONE,
                    };
                    slots
                ],
                g_kind: vec![0; slots],
            },
            free_at: vec![0.0; p],
            pos: vec![0; p],
            blocked: vec![None; p],
            ready: (0..p).rev().collect(),
            busy: vec![0.0; p],
            record,
            mem_now: vec![0.0; p],
            mem_peak: vec![0.0; p],
            overlapped: false,
            timeline,
        }
    }

    /// The lower bound for this run's schedule (overlap savings allowed when a pair ran).
    fn lower_bound(&self) -> f64 {
        bound::bound_for(
            self.schedule.ranks,
            self.schedule.microbatches,
            self.schedule.placement,
            self.costs,
            self.overlapped,
        )
    }

    /// Runs ranks from the ready stack until all are done or none can progress.
    fn run(&mut self) -> Result<(), SimError> {
        while let Some(r) = self.ready.pop() {
            self.blocked[r] = None;
            self.advance(r)?;
        }
        if (0..self.schedule.ranks).any(|r| self.pos[r] < self.schedule.actions[r].len()) {
            return Err(self.deadlock());
        }
        Ok(())
    }

    /// Runs rank `r`'s items until it finishes or waits for an input.
    fn advance(&mut self, r: usize) -> Result<(), SimError> {
        let schedule = self.schedule;
        let list = &schedule.actions[r];
        while self.pos[r] < list.len() {
            let index = self.pos[r];
            let item = list[index];
            for a in item.actions() {
                self.check_action(r, index, &item, a)?;
            }
            let ready_at = match self.ready_time(r, &item) {
                Ready::At(t, _) => t,
                Ready::Wait(slot) => {
                    self.blocked[r] = Some(slot);
                    return Ok(());
                }
                Ready::Bad(why) => return Err(self.bad(r, index, &item, why.into())),
            };
            let dur = match item {
                Item::One(a) => self.costs.stages[a.stage].time(a.op),
                Item::Overlap { forward, backward } => {
                    self.overlapped = true;
                    self.costs.pair_time(
                        self.costs.stages[forward.stage].forward,
                        self.costs.stages[backward.stage].time(backward.op),
                    )
                }
            };
            let start = ready_at.max(self.free_at[r]);
            let end = start + dur;
            self.free_at[r] = end;
            self.busy[r] += dur;
            for a in item.actions() {
                self.allocate(r, a);
            }
            for a in item.actions() {
                self.complete(r, index, a, end);
            }
            if self.record {
                self.timeline.push(r, item, start, end);
            }
            self.pos[r] = index + 1;
        }
        Ok(())
    }

    /// When all inputs of `item` (on rank `r`) are available and which input came last, or the slot
    /// it still waits for. For a pair, the later of its halves (the forward's on a tie). Pure: called
    /// again after the run to trace the critical path.
    #[inline]
    fn ready_time(&self, r: usize, item: &Item) -> Ready {
        match *item {
            Item::One(a) => self.inputs(r, a),
            Item::Overlap { forward, backward } => {
                if forward.op != Op::F || !matches!(backward.op, Op::B | Op::I) {
                    return Ready::Bad(
                        "an overlapped pair is a forward (F) with a backward (B or I)",
                    );
                }
                let f = self.inputs(r, forward);
                let Ready::At(ft, _) = f else { return f };
                let b = self.inputs(r, backward);
                match b {
                    Ready::At(bt, _) if bt > ft => b,
                    Ready::At(..) => f,
                    other => other,
                }
            }
        }
    }

    /// Activation memory: `F` allocates at its start, backward ops free at their end (recorded in
    /// item order, which is time order on one rank).
    #[inline]
    fn allocate(&mut self, r: usize, a: Action) {
        let st = &self.costs.stages[a.stage];
        if a.op == Op::F {
            self.mem_now[r] += st.activation_bytes;
            if self.mem_now[r] > self.mem_peak[r] {
                self.mem_peak[r] = self.mem_now[r];
            }
        } else {
            self.mem_now[r] -= st.freed_by(a.op);
        }
    }

    /// Range, placement and repetition checks for one action.
    #[inline]
    fn check_action(&self, r: usize, index: usize, item: &Item, a: Action) -> Result<(), SimError> {
        let (s, m) = (self.stage_rank.len(), self.done.m);
        if a.stage >= s {
            return Err(self.bad(
                r,
                index,
                item,
                format!("stage {} is out of range (0..{s})", a.stage),
            ));
        }
        if a.microbatch >= m {
            return Err(self.bad(
                r,
                index,
                item,
                format!("microbatch {} is out of range (0..{m})", a.microbatch),
            ));
        }
        if self.stage_rank[a.stage] != r {
            return Err(self.bad(
                r,
                index,
                item,
                format!(
                    "stage {} sits on rank {} ({} placement), not on rank {r}",
                    a.stage, self.stage_rank[a.stage], self.schedule.placement
                ),
            ));
        }
        let i = self.done.index(a.stage, a.microbatch);
        let repeated = match a.op {
            Op::F => self.done.slots[i].f_loc != NOT_DONE,
            Op::I | Op::B => self.done.g_kind[i] != 0,
            Op::W => self.done.g_kind[i] >= 2,
        };
        if repeated {
            let why = match (a.op, self.done.g_kind[i]) {
                (Op::W, 2) => "its backward already ran as a full B (which includes W)",
                (Op::I | Op::B, _) => {
                    "the backward of this stage and microbatch already ran (I or B)"
                }
                _ => "this action already ran",
            };
            return Err(self.bad(r, index, item, why.into()));
        }
        Ok(())
    }

    /// When the inputs of `a` (to run on rank `r`) are available and which came last, or the slot it
    /// waits for. Small by design: this is the hot path.
    #[inline]
    fn inputs(&self, r: usize, a: Action) -> Ready {
        let d = &self.done;
        let i = d.index(a.stage, a.microbatch);
        let data = |end: f64, at: u64, transfer: f64| {
            Ready::At(
                end + transfer,
                Cause::Data {
                    rank: (at >> 32) as u32,
                    index: at as u32,
                    transfer,
                },
            )
        };
        match a.op {
            Op::F if a.stage == 0 => Ready::At(0.0, Cause::Start),
            Op::F => {
                let j = i - 1;
                let prev = &d.slots[j];
                if prev.f_loc == NOT_DONE {
                    return Ready::Wait(Slot::Forward(j));
                }
                let t = self.hop(a.stage - 1, r, a.stage - 1);
                data(prev.f_end, prev.f_loc, t)
            }
            Op::I | Op::B => {
                let mine = &d.slots[i];
                if mine.f_loc == NOT_DONE {
                    return Ready::Wait(Slot::Forward(i));
                }
                let own = mine.f_end;
                if a.stage + 1 == self.stage_rank.len() {
                    return data(own, mine.f_loc, 0.0);
                }
                let j = i + 1;
                let next = &d.slots[j];
                if next.g_loc == NOT_DONE {
                    return Ready::Wait(Slot::Grad(j));
                }
                let t = self.hop(a.stage + 1, r, a.stage);
                if next.g_end + t > own {
                    data(next.g_end, next.g_loc, t)
                } else {
                    data(own, mine.f_loc, 0.0)
                }
            }
            Op::W => {
                let mine = &d.slots[i];
                if mine.g_loc == NOT_DONE {
                    return Ready::Wait(Slot::Grad(i));
                }
                if d.g_kind[i] == 2 {
                    return Ready::Bad(
                        "W needs the I of the same stage and microbatch, but it ran as a full B",
                    );
                }
                data(mine.g_end, mine.g_loc, 0.0)
            }
        }
    }

    /// Transfer time from stage `from` to rank `r` over the boundary after stage `boundary`
    /// (0 when `from` sits on `r`).
    #[inline]
    fn hop(&self, from: usize, r: usize, boundary: usize) -> f64 {
        if self.stage_rank[from] == r {
            0.0
        } else {
            self.send[boundary]
        }
    }

    /// Records the completion of `a` at `end` on rank `r`, its outgoing transfer, and wakes the rank
    /// waiting for it.
    #[inline]
    fn complete(&mut self, r: usize, index: usize, a: Action, end: f64) {
        let i = self.done.index(a.stage, a.microbatch);
        let here = loc(r, index);
        let (slot, consumer) = match a.op {
            Op::F => {
                self.done.slots[i].f_end = end;
                self.done.slots[i].f_loc = here;
                (
                    Slot::Forward(i),
                    (a.stage + 1 < self.stage_rank.len()).then(|| (a.stage + 1, a.stage)),
                )
            }
            Op::I | Op::B => {
                self.done.slots[i].g_end = end;
                self.done.slots[i].g_loc = here;
                self.done.g_kind[i] = if a.op == Op::I { 1 } else { 2 };
                (
                    Slot::Grad(i),
                    a.stage.checked_sub(1).map(|prev| (prev, prev)),
                )
            }
            Op::W => {
                self.done.g_kind[i] = 3;
                return;
            }
        };
        let Some((to_stage, boundary)) = consumer else {
            return;
        };
        let c = self.stage_rank[to_stage];
        if c == r {
            return;
        }
        if self.record {
            self.timeline.push_transfer(Transfer {
                from_rank: r,
                to_rank: c,
                producer: a,
                consumer: Action::new(a.op, to_stage, a.microbatch),
                start: end,
                end: end + self.send[boundary],
                bytes: self.costs.stages[boundary].output_bytes,
            });
        }
        if self.blocked[c] == Some(slot) {
            self.blocked[c] = None;
            self.ready.push(c);
        }
    }

    /// An item error at `spans[r][index]`.
    fn bad(&self, r: usize, index: usize, item: &Item, reason: String) -> SimError {
        SimError::BadItem {
            schedule: self.schedule.name.clone(),
            rank: r,
            index,
            item: item.to_string(),
            reason,
        }
    }

    /// The deadlock error: every unfinished rank, its next item, and what that item waits for.
    fn deadlock(&self) -> SimError {
        let waiting = (0..self.schedule.ranks)
            .filter(|&r| self.pos[r] < self.schedule.actions[r].len())
            .map(|r| {
                let index = self.pos[r];
                let item = self.schedule.actions[r][index];
                let wants = match self.blocked[r] {
                    Some(Slot::Forward(j)) => {
                        let (s, k) = self.done.split(j);
                        format!("{s}F{k}")
                    }
                    Some(Slot::Grad(j)) => {
                        let (s, k) = self.done.split(j);
                        format!("{s}I{k} or {s}B{k}")
                    }
                    None => "its turn".into(),
                };
                let owner = self.blocked[r].map(|slot| {
                    let j = match slot {
                        Slot::Forward(j) | Slot::Grad(j) => j,
                    };
                    let (stage, k) = self.done.split(j);
                    let hit = |a: &Action| {
                        a.stage == stage
                            && a.microbatch == k
                            && match slot {
                                Slot::Forward(_) => a.op == Op::F,
                                Slot::Grad(_) => matches!(a.op, Op::I | Op::B),
                            }
                    };
                    let owner_rank = self.stage_rank[stage];
                    match self.schedule.actions[owner_rank]
                        .iter()
                        .position(|it| it.actions().any(|a| hit(&a)))
                    {
                        Some(p) => format!("which rank {owner_rank} runs at position {p}"),
                        None => format!("which rank {owner_rank} never runs"),
                    }
                });
                format!(
                    "rank {r} at position {index} runs `{item}` and waits for {wants}{}",
                    owner.map(|o| format!(" ({o})")).unwrap_or_default()
                )
            })
            .collect();
        SimError::Deadlock {
            schedule: self.schedule.name.clone(),
            waiting,
        }
    }

    /// Walks back from the item that ends last. An item's start was fixed by its rank (the previous
    /// item ended exactly then; preferred on a tie, as the rank was the limit) or else by its last
    /// input, recomputed from the completion tables exactly as during the run.
    fn critical_path(&self) -> Vec<PathStep> {
        let spans = &self.timeline.spans;
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
        let mut path = Vec::new();
        let mut at = last;
        while let Some((r, i)) = at {
            let span = spans[r][i];
            let (via, next) = if i > 0 && spans[r][i - 1].end >= span.start {
                (Via::Rank, Some((r, i - 1)))
            } else {
                match self.ready_time(r, &span.item) {
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
}
