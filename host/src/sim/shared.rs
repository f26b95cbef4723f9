//! The shared-device mode: every rank runs on one device (the ranks are streams of one GPU), so
//! actions of different ranks that run at the same time share it.
//!
//! ## Model
//!
//! Each rank still runs its list in order, one item at a time, and an item still starts when its
//! rank is free and its inputs have arrived (the rules of the [per-rank mode](super)). What changes
//! is how fast a running item progresses: while `k` items run at once (on `k` different ranks),
//! each progresses at rate
//!
//! `rate(k) = 1 / (1 + share * (k - 1))`
//!
//! where `share` is the cost model's `overlap_share`. For two items of lengths `a >= b` that start
//! together this gives `b (1 + share)` for the shorter and `max(a, b) + share * min(a, b)` for the
//! pair, the measured overlap of two kernels on one GPU (`pipefill bench overlap`). For `k` items
//! the device delivers `k / (1 + share (k - 1))` units of work per unit of time: `share = 0` is `k`
//! independent devices (the per-rank mode, exactly), `share = 1` is one device running one thing
//! at a time (every overlapped stretch costs the serial sum), and in between each additional
//! concurrent item costs `share` of its length, as for two. An overlapped F/B pair of one rank
//! counts as one item of length [`CostModel::pair_time`]. Transfers take no device time (they use
//! the copy engines, or are free on one device: set the link to zero to model one GPU).
//!
//! The run is event driven: between two events (an item ends, or an input arrives) the set of
//! running items is fixed, so every remaining length shrinks linearly; the cost is
//! `O(items * P)`.
//!
//! ## Bound
//!
//! Every item runs at rate at most 1, so the per-rank [lower bound](super::lower_bound) still
//! holds; and the device delivers at most `P / (1 + share (P - 1))` units of work per unit of time,
//! so the makespan is also at least the total work times `(1 + share (P - 1)) / P`: the serial sum
//! when `share = 1`. The simulation reports the larger.

use crate::cost::{CostModel, StageCost};
use crate::schedule::deps::{self, Footprint, InFlight, Need};
use crate::schedule::validate::deadlock;
use crate::schedule::walk::{walk, Waker, Walk};
use crate::schedule::{Action, Item, Op, Schedule, ScheduleError};
use crate::timeline::{Source, Timeline, Transfer};

use super::SimError;

/// What a shared-device run produces.
pub(super) struct SharedRun {
    pub timeline: Timeline,
    pub peak: Vec<f64>,
    /// Whether an overlapped pair ran.
    pub overlapped: bool,
    /// Sum of every item's own length (its time alone on the device).
    pub work: f64,
}

/// An item running on a rank.
#[derive(Debug, Clone, Copy)]
struct Running {
    start: f64,
    /// Work left, in units of time alone on the device.
    left: f64,
}

/// The state of one shared-device run.
struct Shared<'a> {
    schedule: &'a Schedule,
    costs: &'a CostModel,
    stage_rank: Vec<usize>,
    footprint: Vec<Footprint>,
    /// Per `(stage, microbatch)` at `s * M + k`: end of the forward and of the input backward.
    forward_end: Vec<Option<f64>>,
    grad_end: Vec<Option<f64>>,
    pos: Vec<usize>,
    running: Vec<Option<Running>>,
    memory: InFlight,
    timeline: Timeline,
    transfers: bool,
    overlapped: bool,
    work: f64,
}

/// Simulates compute-only `schedule` on one shared device; records transfers when `transfers`.
/// The schedule has passed the static checks; a deadlock is reported as the validator does.
pub(super) fn run(
    schedule: &Schedule,
    costs: &CostModel,
    transfers: bool,
) -> Result<SharedRun, SimError> {
    let (p, s, m) = (schedule.ranks, schedule.stages(), schedule.microbatches);
    let mut state = Shared {
        schedule,
        costs,
        stage_rank: (0..s).map(|st| schedule.rank_of(st)).collect(),
        footprint: costs.stages.iter().map(StageCost::footprint).collect(),
        forward_end: vec![None; s * m],
        grad_end: vec![None; s * m],
        pos: vec![0; p],
        running: vec![None; p],
        memory: InFlight::new(p),
        timeline: Timeline::new(schedule.name.clone(), Source::Predicted, p),
        transfers,
        overlapped: false,
        work: 0.0,
    };
    state.run()?;
    Ok(SharedRun {
        timeline: state.timeline,
        peak: state.memory.into_peak(),
        overlapped: state.overlapped,
        work: state.work,
    })
}

/// What a rank waits for at one instant of the shared-device run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Waits {
    /// Its current item still runs.
    Busy,
    /// Its next item's inputs arrive later.
    Later,
    /// Its next item needs this action's output (an input backward stands for `I` or `B`).
    Missing(Action),
}

/// The shared-device run at one instant, as a [`Walk`]: start on each free rank what can start.
struct Instant<'r, 'a> {
    run: &'r mut Shared<'a>,
    now: f64,
    /// The earliest later arrival a free rank waits for.
    arrival: Option<f64>,
}

impl Walk for Instant<'_, '_> {
    type Wanted = Waits;

    fn advance(&mut self, r: usize, pos: &mut usize, waker: &mut Waker<Waits>) -> Option<Waits> {
        let run = &mut *self.run;
        let waits = loop {
            if run.running[r].is_some() {
                break Some(Waits::Busy);
            }
            let Some(&item) = run.schedule.actions[r].get(run.pos[r]) else {
                break None;
            };
            match run.ready(r, &item) {
                Ready::At(t) if t <= self.now => run.begin(r, &item, self.now, waker),
                Ready::At(t) => {
                    self.arrival = Some(self.arrival.map_or(t, |a: f64| a.min(t)));
                    break Some(Waits::Later);
                }
                Ready::Missing(a) => break Some(Waits::Missing(a)),
            }
        };
        *pos = run.pos[r];
        waits
    }
}

/// When a waiting rank's next item can start.
enum Ready {
    /// All inputs arrive by this time.
    At(f64),
    /// This input (a forward, or an input backward) has not been produced yet.
    Missing(Action),
}

impl Shared<'_> {
    /// The event loop: start what can start, advance to the next end or arrival, repeat.
    fn run(&mut self) -> Result<(), ScheduleError> {
        let mut now = 0.0;
        loop {
            let arrival = self.start_ready(now);
            let k = self.running.iter().flatten().count();
            if k == 0 && arrival.is_none() {
                break;
            }
            let rate = 1.0 / (1.0 + self.costs.overlap_share * (k as f64 - 1.0).max(0.0));
            let first_end = self
                .running
                .iter()
                .flatten()
                .map(|x| now + x.left / rate)
                .fold(f64::INFINITY, f64::min);
            let next = first_end.min(arrival.unwrap_or(f64::INFINITY));
            let step = next - now;
            for r in 0..self.running.len() {
                let Some(mut x) = self.running[r] else {
                    continue;
                };
                if now + x.left / rate <= next {
                    self.finish(r, x.start, next);
                } else {
                    x.left -= step * rate;
                    self.running[r] = Some(x);
                }
            }
            now = next;
        }
        if (0..self.schedule.ranks).any(|r| self.pos[r] < self.schedule.actions[r].len()) {
            return Err(self.deadlock());
        }
        Ok(())
    }

    /// Starts, on every free rank, the next item if its inputs are there at `now` (items that take
    /// no time end at once, which may let more start: the one [walk](crate::schedule::walk));
    /// returns the earliest later arrival that a free rank waits for.
    fn start_ready(&mut self, now: f64) -> Option<f64> {
        let mut pos = self.pos.clone();
        let mut at = Instant {
            run: self,
            now,
            arrival: None,
        };
        walk(&mut at, &mut pos);
        at.arrival
    }

    /// Starts `item` on rank `r` at `now` (ends it at once when it takes no time, waking the
    /// ranks that wait for what it produced).
    fn begin(&mut self, r: usize, item: &Item, now: f64, waker: &mut Waker<Waits>) {
        let length = match *item {
            Item::One(a) => self.costs.stages[a.stage].time(a.op),
            Item::Overlap { forward, backward } => {
                self.overlapped = true;
                self.costs.pair_time(
                    self.costs.stages[forward.stage].forward,
                    self.costs.stages[backward.stage].time(backward.op),
                )
            }
            Item::Comm(_) | Item::Param(_) => 0.0,
        };
        self.work += length;
        for a in item.actions() {
            self.memory.start(r, a, &self.footprint[a.stage]);
        }
        if length > 0.0 {
            self.running[r] = Some(Running {
                start: now,
                left: length,
            });
        } else {
            self.finish(r, now, now);
            for a in item.actions() {
                if let Some(e) = deps::output(a, self.stage_rank.len()) {
                    let made = Action::new(
                        if a.op == Op::F { Op::F } else { Op::I },
                        a.stage,
                        a.microbatch,
                    );
                    waker.wake(self.stage_rank[e.to()], Waits::Missing(made));
                }
            }
        }
    }

    /// Ends rank `r`'s current item (started at `start`) at `end`.
    fn finish(&mut self, r: usize, start: f64, end: f64) {
        let item = self.schedule.actions[r][self.pos[r]];
        self.running[r] = None;
        self.pos[r] += 1;
        self.timeline.push(r, item, start, end);
        let m = self.schedule.microbatches;
        for a in item.actions() {
            self.memory.end(r, a, &self.footprint[a.stage]);
            let j = a.stage * m + a.microbatch;
            match a.op {
                Op::F => self.forward_end[j] = Some(end),
                Op::I | Op::B => self.grad_end[j] = Some(end),
                Op::W => {}
            }
            if self.transfers {
                self.record_transfer(r, a, end);
            }
        }
    }

    /// Records the transfer of `a`'s output when it leaves rank `r`.
    fn record_transfer(&mut self, r: usize, a: Action, end: f64) {
        let Some(e) = deps::output(a, self.stage_rank.len()) else {
            return;
        };
        let to = self.stage_rank[e.to()];
        if to == r {
            return;
        }
        let time = self.costs.boundary_time(e.boundary());
        self.timeline.push_transfer(Transfer::new(
            r,
            to,
            a,
            Action::new(a.op, e.to(), e.microbatch),
            end,
            end + time,
            self.costs.stages[e.boundary()].output_bytes,
        ));
    }

    /// When the inputs of rank `r`'s `item` are all there.
    fn ready(&self, r: usize, item: &Item) -> Ready {
        let mut at = 0.0_f64;
        for a in item.actions() {
            for need in deps::needs(a, self.stage_rank.len()) {
                let (end, transfer) = match need {
                    Need::Stash(x) => (self.end_of(x.stage, x.microbatch, x.op != Op::F), 0.0),
                    Need::Data(e) => {
                        let grad = e.flow == deps::Flow::Gradient;
                        let crosses = self.stage_rank[e.from] != r;
                        let t = if crosses {
                            self.costs.boundary_time(e.boundary())
                        } else {
                            0.0
                        };
                        (self.end_of(e.from, e.microbatch, grad), t)
                    }
                };
                match end {
                    Some(end) => at = at.max(end + transfer),
                    None => return Ready::Missing(wanted(need)),
                }
            }
        }
        Ready::At(at)
    }

    /// End of the forward (or, with `grad`, the input backward) of `(stage, microbatch)`.
    fn end_of(&self, stage: usize, microbatch: usize, grad: bool) -> Option<f64> {
        let j = stage * self.schedule.microbatches + microbatch;
        if grad {
            self.grad_end[j]
        } else {
            self.forward_end[j]
        }
    }

    /// The deadlock error: every unfinished rank, its next item's position and what it waits for.
    fn deadlock(&self) -> ScheduleError {
        let waiting: Vec<(usize, usize, Item)> = (0..self.schedule.ranks)
            .filter_map(|r| {
                let item = *self.schedule.actions[r].get(self.pos[r])?;
                match self.ready(r, &item) {
                    Ready::Missing(a) => Some((r, self.pos[r], Item::One(a))),
                    Ready::At(_) => None,
                }
            })
            .collect();
        deadlock(self.schedule, &waiting)
    }
}

/// The action whose completion `need` waits for (an input backward stands for `I` or `B`).
fn wanted(need: Need) -> Action {
    match need {
        Need::Stash(x) => x,
        Need::Data(e) => {
            let op = match e.flow {
                deps::Flow::Activation => Op::F,
                deps::Flow::Gradient => Op::I,
            };
            Action::new(op, e.from, e.microbatch)
        }
    }
}

/// The shared-device bound: the per-rank `bound`, or the total `work` at the device's best
/// throughput with `ranks` streams, whichever is larger (see the module docs).
pub(super) fn bound(bound: f64, work: f64, ranks: usize, share: f64) -> f64 {
    let p = ranks.max(1) as f64;
    bound.max(work * (1.0 + share * (p - 1.0)) / p)
}
