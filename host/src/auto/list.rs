//! The constructive phase: list scheduling.
//!
//! Time moves forward; each rank, when free, picks among its candidate actions (per stage, the next
//! `F`, `I` and `W` in microbatch order: microbatches cost the same, so per-stage microbatch order
//! loses nothing) the one a [`Rule`] prefers among those whose inputs have arrived, or waits for the
//! first to arrive. The rank that can start soonest goes first, so every rank's list is built in time
//! order and the memory it holds is known at each choice.
//!
//! Memory is never exceeded. How a forward is admitted is the rule's [`Admission`]:
//!
//! - `Reserved`: a microbatch enters the pipeline (`F` of stage 0) only when every rank can hold it
//!   whole on top of what it holds and what the microbatches already in have reserved there, so
//!   every microbatch that entered can always finish, all at once.
//! - `Safe` (a banker's check): any forward is admitted when, after it, the microbatches in flight
//!   can still finish one after another in the order they entered: the oldest's remaining needs
//!   fit what is free on every rank, what it holds is then free for the next, and so on. Never
//!   stuck (the oldest microbatch can always move on), and less cautious than `Reserved`: on a
//!   V-shape rank `n` slots can hold `n - 1` first-chunk microbatches, not `n / 2`.
//! - `Lean`: room on the forward's own rank only (and, for a rank's first chunk, for one
//!   second-chunk forward beside it): these rules can get stuck, and then give nothing.
//!
//! A rule may also cap what a rank takes in before its first backward (`soft`, the warm-up count),
//! which the improvement phase tunes; such a cap is lifted when nothing else could move.

use std::cell::RefCell;

use crate::schedule::Action;

use super::instance::{Instance, MEMORY_EPS, OPS};
use super::rng::Rng;

/// When a rank runs a ready `W` (which nothing waits for) rather than waiting for an `F` or `I`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WMode {
    /// Whenever no `F` or `I` can start now (the zero-bubble schedules' filling).
    Eager,
    /// Only when the wait for the next `F` or `I` is at least the `W`'s time.
    FitGap,
    /// Only when the rank has no `F` or `I` to wait for (or memory needs it).
    Late,
}

/// Which of several candidates of the same op (one per chunk) goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// The deepest stage first (finishes microbatches).
    Deep,
    /// The shallowest stage first (fills the pipeline).
    Shallow,
    /// The oldest microbatch first, then the deepest stage.
    Oldest,
}

/// A priority rule.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rule {
    /// When both can start now: `F` before `I` (true) or `I` before `F`.
    pub(crate) prefer_forward: bool,
    /// Among candidates of one op.
    pub(crate) order: Order,
    /// When `W` runs.
    pub(crate) w_mode: WMode,
    /// Per rank, the most microbatches it may have between its first chunk's `F` and that chunk's
    /// `I` (the warm-up count); infinite: only the limit counts.
    pub(crate) soft: Vec<f64>,
    /// Probability of inverting `prefer_forward` at one choice (randomised restarts).
    pub(crate) flip: f64,
    /// Seed of the flips.
    pub(crate) seed: u64,
    /// How a forward is admitted under the memory limit (see the [module docs](self)).
    pub(crate) admission: Admission,
    /// Lookahead: a rank about to start an `F` or `I` waits instead for the forward of a later
    /// stage of its own (a deeper chunk) of a microbatch below this number when that forward
    /// arrives before the action would end (0: never wait). One case of Giffler and Thompson's
    /// conflict set: the schedules built are active, not only non-delay.
    pub(crate) lookahead: usize,
}

/// How a [`Rule`] admits a forward under the memory limit (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// A whole microbatch reserved on every rank from its entry: all in flight can finish at once.
    Reserved,
    /// A banker's check: those in flight can finish one after another, in entry order.
    Safe,
    /// Room on the forward's own rank only (V-shape under a limit); may get stuck.
    Lean,
}

impl Rule {
    /// A rule without caps or flips.
    pub(crate) fn plain(p: usize, prefer_forward: bool, order: Order, w_mode: WMode) -> Self {
        Rule {
            prefer_forward,
            order,
            w_mode,
            soft: vec![f64::INFINITY; p],
            flip: 0.0,
            seed: 0,
            admission: Admission::Reserved,
            lookahead: 0,
        }
    }

    /// The fixed rules the constructive phase always tries: backward-first and forward-first, each
    /// op order, each `W` policy, plus 1F1B-like warm-up caps.
    pub(crate) fn standard(inst: &Instance) -> Vec<Rule> {
        let mut rules = Vec::new();
        for w_mode in [WMode::Eager, WMode::FitGap, WMode::Late] {
            for order in [Order::Deep, Order::Oldest, Order::Shallow] {
                for prefer_forward in [false, true] {
                    rules.push(Rule::plain(inst.p, prefer_forward, order, w_mode));
                }
            }
        }
        // Warm-up caps: rank r takes in at most P - r (1F1B), 2(P - r) - 1 (ZB-H2's shape) or
        // something between before its first backward.
        let shapes = [
            (1.0, 0.0),
            (2.0, -1.0),
            (1.5, 0.0),
            (1.0, 2.0),
            (2.0, 0.0),
            (2.0, 1.0),
            (2.5, 0.0),
        ];
        for (slope, offset) in shapes {
            for w_mode in [WMode::Eager, WMode::FitGap] {
                let mut rule = Rule::plain(inst.p, false, Order::Deep, w_mode);
                rule.soft = warmup_caps(inst.p, slope, offset);
                rules.push(rule);
            }
        }
        rules.extend(Self::under_limit(inst));
        rules
    }

    /// Lean-admission rules for V-shape under a limit of `n` stage-microbatches per rank (below
    /// every microbatch at once): each rank takes in `n/2`, `3n/4` or `n - 1` microbatches before its
    /// first backward, the deepest stage first, `W`s eagerly or where they fit a gap.
    fn under_limit(inst: &Instance) -> Vec<Rule> {
        Self::admitting(
            inst,
            Admission::Lean,
            &[(0.5, 0.0), (0.75, 0.0), (1.0, 0.0)],
        )
    }

    /// Safe-admission rules (a banker's check) for V-shape under a limit of `n` stage-microbatches
    /// per rank: each rank takes in `3n/4`, `7n/8` or `n - 1` microbatches before its first
    /// backward, or the first rank `n - 1` and each later one fewer, down to `n/4` or `3n/8` fewer
    /// at the last (from 1F1B's memory up `3n/4` alone), the deepest stage or the oldest
    /// microbatch first, backward or forward first, `W`s eagerly or where they fit a gap (up to 40
    /// rules). None where an `I` rebuilds activations (recomputation): the check assumes that `I`
    /// allocates nothing.
    pub(crate) fn safe(inst: &Instance) -> Vec<Rule> {
        if safe_slots(inst).is_none() {
            return Vec::new();
        }
        // Below 1F1B's memory (`2P` slots) caps in eighths of the slots (at P = 16, V-Half's 16
        // slots, the fill depth moves the schedule by up to 4 %), the same on every rank or falling
        // with the rank: a later rank's first chunk comes back sooner, so it needs fewer
        // microbatches in flight to stay busy, and each slot it leaves free serves the second
        // chunk, whose forwards the first rank waits for (at P = 16, M = 32, V-Half, the falling
        // caps build schedules up to 10 % shorter than any uniform cap; with them, uniform caps
        // of `n/2` and `5n/8` no longer win a row); from there, where the check rarely binds,
        // `3n/4` alone (each rule is a list build).
        let shares: &[(f64, f64)] = if slots(inst) < 2.0 * inst.p as f64 {
            &[
                (0.75, 0.0),
                (0.875, 0.0),
                (1.0, 0.0),
                (1.0, 0.25),
                (1.0, 0.375),
            ]
        } else {
            &[(0.75, 0.0)]
        };
        let deep = Self::admitting(inst, Admission::Safe, shares);
        let mut rules = Vec::with_capacity(4 * deep.len());
        for order in [Order::Deep, Order::Oldest] {
            for prefer_forward in [false, true] {
                rules.extend(deep.iter().map(|r| Rule {
                    order,
                    prefer_forward,
                    ..r.clone()
                }));
            }
        }
        rules
    }

    /// Waiting rules, wherever a rank holds two or more stages: a rank waits for the deeper chunk's
    /// forward of one of the first 1, 2, 4 or `2P` microbatches ([`Rule::lookahead`]; the chain
    /// that the first rank's span waits on; `2P`: the whole fill under twice 1F1B's memory, only
    /// where a rank holds 1F1B's memory or more), the oldest microbatch or the deepest stage first,
    /// forward or backward first, `W`s eagerly (16 rules, 12 without `2P`). Where transfers put the
    /// chain out of step with the ranks' alternating forwards, a non-delay rule makes every rank up
    /// the way wait part of an action for it; these rules wait for it instead (P = 8, M = 16,
    /// 2:2:1, transfers 0.1 of `F`, twice 1F1B's memory: span 82.2 before any improvement, the
    /// bound 81.8, the best non-delay rule 84.8).
    pub(crate) fn waiting(inst: &Instance) -> Vec<Rule> {
        if inst.v < 2 {
            return Vec::new();
        }
        let mut rules = Vec::new();
        let mut depths = vec![1, 2, 4];
        // The whole fill, where the limit lets a rank hold 1F1B's `P` microbatches or more (below
        // it no fill is that deep, and no waiting rule has won a row of the V-shape grid).
        if 2 * inst.p > 4 && slots(inst) >= 2.0 * inst.p as f64 {
            depths.push(2 * inst.p);
        }
        for k in depths {
            for order in [Order::Oldest, Order::Deep] {
                for prefer_forward in [true, false] {
                    let mut rule = Rule::plain(inst.p, prefer_forward, order, WMode::Eager);
                    rule.lookahead = k;
                    rules.push(rule);
                }
            }
        }
        rules
    }

    /// Rules admitting by `admission` on V-shape under a limit of `n` stage-microbatches per rank,
    /// one pair of rules (`W`s eagerly or where they fit a gap) per warm-up shape `(share, drop)`:
    /// rank `r` of `P` takes in at most `share * n - drop * n * r / (P - 1)` microbatches before its
    /// first backward (`share` `1.0`: from `n - 1`; at least 1), so `drop` 0 caps every rank alike
    /// and a positive `drop` leaves the later ranks, whose first chunk's round trip is shorter,
    /// more room for the second chunk. None elsewhere.
    fn admitting(inst: &Instance, admission: Admission, shapes: &[(f64, f64)]) -> Vec<Rule> {
        let Some(n) = vshape_slots(inst) else {
            return Vec::new();
        };
        let mut caps: Vec<Vec<f64>> = Vec::new();
        for &(share, drop) in shapes {
            let soft = shaped_caps(inst.p, n, share, drop);
            if !caps.contains(&soft) {
                caps.push(soft);
            }
        }
        let mut rules = Vec::new();
        for soft in caps {
            for w_mode in [WMode::Eager, WMode::FitGap] {
                let mut rule = Rule::plain(inst.p, false, Order::Deep, w_mode);
                rule.soft = soft.clone();
                rule.admission = admission;
                rules.push(rule);
            }
        }
        rules
    }
}

/// The slots `n` of [`slots`] where the V-shape rules with warm-up shapes apply: V-shape, `V = 2`,
/// a limit that binds (`2 <= n < 2M`); `None` elsewhere.
fn vshape_slots(inst: &Instance) -> Option<f64> {
    if inst.v != 2 || inst.placement != crate::schedule::Placement::Vshape {
        return None;
    }
    let n = slots(inst);
    (n.is_finite() && n < 2.0 * inst.m as f64 && n >= 2.0).then_some(n)
}

/// [`vshape_slots`] where safe admission applies too: no `I` rebuilds activations (the banker's
/// check assumes that `I` allocates nothing).
pub(crate) fn safe_slots(inst: &Instance) -> Option<f64> {
    if (0..inst.s).any(|x| inst.room(1, x) > 0.0) {
        return None;
    }
    vshape_slots(inst)
}

/// Warm-up caps of shape `(share, drop)` on `p` ranks of `n` slots: rank `r` takes in at most
/// `share * n - drop * n * r / (p - 1)` microbatches before its first backward (`share` `1.0`:
/// from `n - 1`), rounded, at least 1.
fn shaped_caps(p: usize, n: f64, share: f64, drop: f64) -> Vec<f64> {
    let top = if share >= 1.0 {
        n - 1.0
    } else {
        (share * n).floor()
    };
    let last = p.saturating_sub(1).max(1) as f64;
    (0..p)
        .map(|r| (top - drop * n * r as f64 / last).round().max(1.0))
        .collect()
}

/// The stage-microbatches every rank can hold on V-shape (`V = 2`): twice the least number of
/// whole microbatches a rank's budget holds.
fn slots(inst: &Instance) -> f64 {
    (0..inst.p)
        .map(|r| (inst.budget[r] / inst.one_microbatch(r).max(f64::MIN_POSITIVE) * 2.0).floor())
        .fold(f64::INFINITY, f64::min)
}

/// Per rank `r`, `max(1, slope * (P - r) + offset)` microbatches before the first backward.
pub(crate) fn warmup_caps(p: usize, slope: f64, offset: f64) -> Vec<f64> {
    (0..p)
        .map(|r| (slope * (p - r) as f64 + offset).round().max(1.0))
        .collect()
}

/// What one rank would do next.
#[derive(Debug, Clone, Copy)]
struct Choice {
    id: usize,
    start: f64,
}

/// For [`Admission::Safe`], per rank `r`: for the microbatches `k` in flight from the oldest
/// (`from`), the least over the first `i` of them of `k`'s margin, what the microbatches older than
/// `k` hold on `r` less what `k` may still need there. It changes only when an action of `r` is
/// placed (`version`), so the builder computes it once per placement on `r`, not at every look.
struct Margins {
    /// The rank's placement count it was computed at (`u64::MAX`: never).
    version: u64,
    /// The oldest microbatch counted.
    from: usize,
    /// `mins[i]`: the least margin of microbatches `from..from + i` (`mins[0]` infinite).
    mins: Vec<f64>,
}

/// The state of one construction.
struct Builder<'a> {
    inst: &'a Instance,
    rule: &'a Rule,
    rng: Rng,
    /// End time per action (infinite until placed).
    end: Vec<f64>,
    /// Per stage, the next microbatch of F, I and W.
    next: Vec<[usize; 3]>,
    free: Vec<f64>,
    mem: Vec<f64>,
    /// Per rank, memory reserved by microbatches that entered but have not reached the rank.
    pending: Vec<f64>,
    /// Per rank, microbatches between its first chunk's `F` and `I`.
    open: Vec<f64>,
    orders: Vec<Vec<Action>>,
    relax: bool,
    /// Per rank, actions placed (invalidates its [`Margins`]).
    versions: Vec<u64>,
    /// Per rank, for [`Admission::Safe`].
    margins: RefCell<Vec<Margins>>,
    /// Per rank, its last choice while nothing it depends on changed (`None`: to be made again);
    /// only for rules that draw no random flips, whose choices are a function of the state.
    choices: Vec<Option<Option<Choice>>>,
    /// Whether `choices` are kept.
    keep: bool,
}

/// Builds per-rank action lists with `rule`; `None` only if the rule cannot finish (a bug).
pub(crate) fn build(inst: &Instance, rule: &Rule) -> Option<Vec<Vec<Action>>> {
    build_with(inst, rule, true)
}

/// [`build`], keeping each rank's choice between the placements that can change it when `keep`
/// (the same lists, about a fifth of the time at P = 16), or making every choice afresh.
fn build_with(inst: &Instance, rule: &Rule, keep: bool) -> Option<Vec<Vec<Action>>> {
    let mut b = Builder {
        inst,
        rule,
        rng: Rng::new(rule.seed),
        end: vec![f64::INFINITY; inst.actions()],
        next: vec![[0; 3]; inst.s],
        free: vec![0.0; inst.p],
        mem: vec![0.0; inst.p],
        pending: vec![0.0; inst.p],
        open: vec![0.0; inst.p],
        orders: (0..inst.p)
            .map(|_| Vec::with_capacity(3 * inst.v * inst.m))
            .collect(),
        relax: false,
        versions: vec![0; inst.p],
        margins: RefCell::new(
            (0..inst.p)
                .map(|_| Margins {
                    version: u64::MAX,
                    from: 0,
                    mins: Vec::new(),
                })
                .collect(),
        ),
        choices: vec![None; inst.p],
        keep: keep && rule.flip == 0.0,
    };
    for _ in 0..inst.actions() {
        let (r, c) = match b.pick() {
            Some(x) => x,
            None if !b.relax => {
                b.relax = true;
                b.pick()?
            }
            None => return None,
        };
        b.relax = false;
        b.place(r, c);
    }
    Some(b.orders)
}

impl Builder<'_> {
    /// The rank that can start soonest, and its choice.
    fn pick(&mut self) -> Option<(usize, Choice)> {
        let mut best: Option<(usize, Choice)> = None;
        let kept = self.keep && !self.relax;
        for r in 0..self.inst.p {
            let choice = match self.choices[r] {
                Some(c) if kept => c,
                _ => {
                    let c = self.choose(r);
                    if kept {
                        self.choices[r] = Some(c);
                    }
                    c
                }
            };
            if let Some(c) = choice {
                if best.is_none_or(|(_, b)| c.start < b.start) {
                    best = Some((r, c));
                }
            }
        }
        best
    }

    /// When `id`'s inputs are there (infinite if a producer is not placed yet).
    fn ready(&self, op: usize, x: usize, k: usize) -> f64 {
        let inst = self.inst;
        match op {
            0 if x == 0 => 0.0,
            0 => self.end[inst.id(0, x - 1, k)] + inst.comm[x - 1],
            1 => {
                let own = self.end[inst.id(0, x, k)];
                if x + 1 == inst.s {
                    own
                } else {
                    own.max(self.end[inst.id(1, x + 1, k)] + inst.comm[x])
                }
            }
            _ => self.end[inst.id(1, x, k)],
        }
    }

    /// Whether memory lets `F(x, k)` start on rank `r` now.
    fn may_forward(&self, r: usize, x: usize) -> bool {
        let inst = self.inst;
        match self.rule.admission {
            Admission::Lean => return self.lean_fits(r, x),
            Admission::Safe => return self.safe_fits(r, x),
            Admission::Reserved => {}
        }
        if x == 0 {
            let fits = (0..inst.p)
                .all(|q| self.fits(q, self.mem[q] + self.pending[q] + inst.one_microbatch(q)));
            if !fits {
                return false;
            }
        }
        self.under_cap(r, x)
    }

    /// Whether rank `r` can hold `need` within its budget.
    fn fits(&self, r: usize, need: f64) -> bool {
        need <= self.inst.budget[r] + MEMORY_EPS * need.max(1.0)
    }

    /// Whether `F` of stage `x` keeps rank `r` within the rule's warm-up cap (only the rank's first
    /// chunk counts; lifted while relaxing).
    fn under_cap(&self, r: usize, x: usize) -> bool {
        self.relax || self.inst.stages_of[r][0] != x || self.open[r] + 1.0 <= self.rule.soft[r]
    }

    /// [`Admission::Lean`]'s test for `F` of stage `x` on rank `r`: room on the rank for it (and, for the
    /// rank's chunk 0, for one chunk-1 forward beside it), within the warm-up cap.
    fn lean_fits(&self, r: usize, x: usize) -> bool {
        let inst = self.inst;
        let stages = &inst.stages_of[r];
        let mut need = self.mem[r] + inst.foot[x].allocated_by(OPS[0]);
        if stages[0] == x {
            if let Some(&hi) = stages.get(1) {
                need += inst.foot[hi].allocated_by(OPS[0]);
            }
        }
        self.fits(r, need) && self.under_cap(r, x)
    }

    /// [`Admission::Safe`]'s test for `F` of stage `x` on rank `r`: room on the rank for what the
    /// stage may hold, within the warm-up cap, and after it the microbatches in flight can finish
    /// one after another in entry order (a banker's check).
    ///
    /// Every state the builder reaches is safe (a forward is placed only after this test; `W` only
    /// frees; `I` allocates nothing where these rules are offered), so only rank `r` and the
    /// microbatches older than the forward's need checking: for the forward's own microbatch and
    /// the younger ones, what the forward takes from the free room it adds to what is freed before
    /// them, and it lowers its own microbatch's remaining need by as much. An older microbatch `k`
    /// can still finish when its remaining need on `r` fits the room free now, less the forward's,
    /// plus what the microbatches older than `k` hold there: when its margin ([`Margins`]) is at
    /// least minus that free room.
    fn safe_fits(&self, r: usize, x: usize) -> bool {
        let inst = self.inst;
        if !(self.fits(r, self.mem[r] + inst.room(0, x)) && self.under_cap(r, x)) {
            return false;
        }
        let new = self.next[x][0];
        let free = inst.budget[r] - self.mem[r] - inst.delta(0, x);
        let mut margins = self.margins.borrow_mut();
        let m = &mut margins[r];
        if m.version != self.versions[r] || new < m.from || new >= m.from + m.mins.len() {
            *m = self.margins_of(r, new.max(self.next[0][0]));
        }
        m.mins[new - m.from] >= -free
    }

    /// [`Margins`] of rank `r` for the microbatches older than `upto`.
    fn margins_of(&self, r: usize, upto: usize) -> Margins {
        let inst = self.inst;
        let from = self.next.iter().map(|n| n[2]).min().unwrap_or(0);
        let mut mins = Vec::with_capacity(upto.saturating_sub(from) + 1);
        mins.push(f64::INFINITY);
        let mut freed = 0.0;
        for k in from..upto {
            // What `k` holds on `r`, and may still need there on top.
            let (mut held, mut need) = (0.0, 0.0);
            for &y in &inst.stages_of[r] {
                let n = self.next[y];
                if k < n[2] {
                    continue;
                }
                let h = if k < n[1] {
                    inst.delta(0, y) + inst.delta(1, y)
                } else if k < n[0] {
                    inst.delta(0, y)
                } else {
                    0.0
                };
                held += h;
                need += (inst.foot[y].bytes - h).max(0.0);
            }
            let margin = freed - need + MEMORY_EPS * f64::max(need, 1.0);
            let last = mins[mins.len() - 1];
            mins.push(f64::min(last, margin));
            freed += held;
        }
        Margins {
            version: self.versions[r],
            from,
            mins,
        }
    }

    /// Rank `r`'s next action under the rule.
    fn choose(&mut self, r: usize) -> Option<Choice> {
        let inst = self.inst;
        let t0 = self.free[r];
        // Per op, the best candidate that can start now: (id, key).
        let mut now_best: [Option<(usize, usize)>; 3] = [None; 3];
        // The first F or I to arrive later: (ready, key, id).
        let mut first_later: Option<(f64, usize, usize)> = None;
        // With lookahead: the earliest deeper forward of a young microbatch, (ready, key, id).
        let mut wait_for: Option<(f64, usize, usize)> = None;
        let mut first_w_later: Option<(f64, usize)> = None;
        for &x in &inst.stages_of[r] {
            let n = self.next[x];
            for op in 0..3 {
                let k = n[op];
                let open = match op {
                    0 => k < inst.m && self.may_forward(r, x),
                    _ => k < n[op - 1],
                };
                if !open {
                    continue;
                }
                let ready = self.ready(op, x, k);
                if ready == f64::INFINITY {
                    continue;
                }
                let id = inst.id(op, x, k);
                let key = self.key(x, k);
                if ready <= t0 {
                    if now_best[op].is_none_or(|(_, kk)| key < kk) {
                        now_best[op] = Some((id, key));
                    }
                } else if op < 2 {
                    if op == 0
                        && k < self.rule.lookahead
                        && x != inst.stages_of[r][0]
                        && wait_for.is_none_or(|w| (ready, key) < (w.0, w.1))
                    {
                        wait_for = Some((ready, key, id));
                    }
                    let cand = (ready, key, id);
                    if first_later.is_none_or(|f| (cand.0, cand.1) < (f.0, f.1)) {
                        first_later = Some(cand);
                    }
                } else if first_w_later.is_none_or(|f| ready < f.0) {
                    first_w_later = Some((ready, id));
                }
            }
        }
        let now = |id: usize| Some(Choice { id, start: t0 });
        let forward_first =
            self.rule.prefer_forward != (self.rule.flip > 0.0 && self.rng.unit() < self.rule.flip);
        let [fwd_now, back_now, w_now] = now_best;
        let picked = match (fwd_now, back_now) {
            (Some((f, _)), Some((b, _))) => Some(if forward_first { f } else { b }),
            (Some((f, _)), None) => Some(f),
            (None, Some((b, _))) => Some(b),
            (None, None) => None,
        };
        if let Some(id) = picked {
            let a = inst.action(id);
            let ends = t0 + inst.dur[a.stage][id % 3];
            if let Some((ready, _, w)) = wait_for {
                if ready < ends {
                    return Some(Choice {
                        id: w,
                        start: ready,
                    });
                }
            }
            return now(id);
        }
        if let Some((w, _)) = w_now {
            let w_time = inst.dur[inst.action(w).stage][2];
            let run_w = match (self.rule.w_mode, first_later) {
                (_, None) => true,
                (WMode::Eager, _) => true,
                (WMode::FitGap, Some((ready, _, _))) => ready - t0 >= w_time,
                (WMode::Late, Some(_)) => false,
            };
            if run_w {
                return now(w);
            }
        }
        match (first_later, first_w_later) {
            (Some((ready, _, id)), _) => Some(Choice { id, start: ready }),
            (None, Some((ready, id))) => Some(Choice { id, start: ready }),
            (None, None) => None,
        }
    }

    /// Sort key of `(x, k)` among candidates of one op (smaller first).
    fn key(&self, x: usize, k: usize) -> usize {
        let s = self.inst.s;
        match self.rule.order {
            Order::Deep => s - x,
            Order::Shallow => x,
            Order::Oldest => k * s + (s - x),
        }
    }

    /// Places choice `c` on rank `r`.
    fn place(&mut self, r: usize, c: Choice) {
        let inst = self.inst;
        let a = self.inst.action(c.id);
        let op = c.id % 3;
        let x = a.stage;
        let t = inst.dur[x][op];
        self.end[c.id] = c.start + t;
        self.free[r] = c.start + t;
        self.next[x][op] += 1;
        if op == 0 && x == 0 {
            for q in 0..inst.p {
                self.pending[q] += inst.one_microbatch(q);
            }
        }
        // The reservation covers what `F` keeps and what `I` rebuilds (recomputation).
        self.pending[r] -= inst.foot[x].allocated_by(OPS[op]);
        self.mem[r] += inst.delta(op, x);
        if inst.stages_of[r][0] == x && op < 2 {
            self.open[r] += if op == 0 { 1.0 } else { -1.0 };
        }
        self.orders[r].push(a);
        self.versions[r] += 1;
        self.forget(r, op, x);
    }

    /// Drops the kept choices that placing `op` of stage `x` on rank `r` can change: rank `r`'s
    /// (its time, lists, memory), those of the ranks whose next action it feeds, the rank of stage
    /// 0's under [`Admission::Reserved`] (its forward looks at every rank's memory and
    /// reservations), and every rank's under [`Admission::Safe`] when the oldest microbatch in
    /// flight or the newest to enter can change (a `W`, or a forward of stage 0).
    fn forget(&mut self, r: usize, op: usize, x: usize) {
        let inst = self.inst;
        self.choices[r] = None;
        match op {
            0 if x + 1 < inst.s => self.choices[inst.rank_of[x + 1]] = None,
            1 if x > 0 => self.choices[inst.rank_of[x - 1]] = None,
            _ => {}
        }
        match self.rule.admission {
            Admission::Reserved => self.choices[inst.rank_of[0]] = None,
            // A rank's banker's check reads its own stages, the newest microbatch to enter and
            // the oldest in flight anywhere; a `W` moved the oldest when it was its last, that is
            // when no stage's next `W` is now older than this stage's.
            Admission::Safe if op == 0 && x == 0 => self.choices.fill(None),
            Admission::Safe if op == 2 && self.next.iter().all(|n| n[2] >= self.next[x][2]) => {
                self.choices.fill(None)
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::vgreedy::tests::{fits, instance};

    /// Keeping each rank's choice between placements changes nothing: every standard, lean and
    /// safe rule builds the same lists either way (V-shape, limits from V-Half's to twice 1F1B's,
    /// uneven stages and transfers).
    #[test]
    fn kept_choices_build_the_same_lists() {
        let mut rules_seen = 0;
        for p in [2, 4, 8] {
            for m in [p, 2 * p + 1] {
                for (fiw, latency, uneven) in
                    [([1.0, 1.0, 1.0], 0.0, false), ([2.0, 2.0, 1.0], 0.2, true)]
                {
                    let pf = p as f64;
                    for limit in [pf / 2.0, pf, 2.0 * pf] {
                        let inst = instance(p, m, fiw, latency, uneven, limit.max(1.0));
                        let mut rules = Rule::standard(&inst);
                        rules.extend(Rule::safe(&inst));
                        for rule in &rules {
                            rules_seen += 1;
                            assert_eq!(
                                build_with(&inst, rule, true),
                                build_with(&inst, rule, false),
                                "P={p} M={m} {fiw:?} limit {limit}: {rule:?}"
                            );
                        }
                    }
                }
            }
        }
        assert!(rules_seen > 300, "{rules_seen}");
    }

    /// Safe admission never gets stuck and keeps the limit: V-shape, 1 to 8 ranks, equal and
    /// uneven stages, with and without transfers, every limit from one microbatch to twice
    /// 1F1B's, warm-up caps from one microbatch to none, both `W` policies.
    #[test]
    fn safe_admission_finishes_within_the_limit() {
        for p in 1..=8 {
            let pf = p as f64;
            for m in [p, 2 * p + 1, 4 * p] {
                for (fiw, latency, uneven) in [
                    ([1.0, 1.0, 1.0], 0.0, false),
                    ([2.0, 2.0, 1.0], 0.2, true),
                    ([1.0, 1.2, 0.8], 0.1, false),
                ] {
                    for limit in [1.0, 1.5, pf / 2.0, pf / 2.0 + 0.5, pf, 2.0 * pf] {
                        let inst = instance(p, m, fiw, latency, uneven, limit.max(1.0));
                        for cap in [1.0, pf / 2.0, 1.5 * pf, f64::INFINITY] {
                            for w_mode in [WMode::Eager, WMode::FitGap] {
                                let mut rule = Rule::plain(p, false, Order::Deep, w_mode);
                                rule.soft = vec![cap.max(1.0); p];
                                rule.admission = Admission::Safe;
                                let what = format!(
                                    "P={p} M={m} {fiw:?} uneven={uneven} limit {limit} cap {cap} \
                                     {w_mode:?}"
                                );
                                let orders =
                                    build(&inst, &rule).unwrap_or_else(|| panic!("{what}: stuck"));
                                fits(&inst, &orders, limit.max(1.0), &what);
                            }
                        }
                    }
                }
            }
        }
    }

    /// At V-Half's limit the banker's check lets rank 0 hold `n - 1` first-chunk microbatches
    /// where reserving whole microbatches holds `n / 2`: with the same warm-up cap, P = 8, M = 16,
    /// 2:2:1, safe admission builds a shorter schedule than reserved admission.
    #[test]
    fn safe_admission_takes_in_more_than_reserving() {
        let inst = instance(8, 16, [2.0, 2.0, 1.0], 0.0, false, 4.0);
        let makespan = |admission: Admission| {
            let mut rule = Rule::plain(8, false, Order::Deep, WMode::Eager);
            rule.soft = vec![6.0; 8];
            rule.admission = admission;
            let orders = build(&inst, &rule).expect("builds");
            fits(&inst, &orders, 4.0, &format!("{admission:?}"));
            let s = crate::auto::score::schedule_of(&inst, "auto", &orders);
            crate::sim::simulate(&s, &inst.scoring)
                .unwrap()
                .timeline
                .makespan()
        };
        let (safe, reserved) = (makespan(Admission::Safe), makespan(Admission::Reserved));
        assert!(safe < reserved - 1e-9, "safe {safe}, reserved {reserved}");
    }

    /// At V-Half's limit the caps that fall with the rank build shorter schedules than any cap
    /// alike on every rank: P = 16, M = 32, 2:2:1, transfers 0.2, each rank holds 16 stage-
    /// microbatches; the best falling-cap rule's makespan is at most 95 % of the best uniform
    /// one's (about 255 against 283 when this was written), and every safe rule keeps the limit.
    #[test]
    fn caps_falling_with_the_rank_fill_v_half_better() {
        let inst = instance(16, 32, [2.0, 2.0, 1.0], 0.2, false, 8.0);
        let rules = Rule::safe(&inst);
        assert_eq!(rules.len(), 40);
        let (mut uniform, mut falling) = (f64::INFINITY, f64::INFINITY);
        for rule in &rules {
            let orders = build(&inst, rule).expect("builds");
            fits(&inst, &orders, 8.0, &format!("{rule:?}"));
            let s = crate::auto::score::schedule_of(&inst, "auto", &orders);
            let makespan = crate::sim::simulate(&s, &inst.scoring)
                .unwrap()
                .timeline
                .makespan();
            if rule.soft.windows(2).all(|w| w[0] == w[1]) {
                uniform = uniform.min(makespan);
            } else {
                assert!(
                    rule.soft.windows(2).all(|w| w[0] >= w[1]),
                    "{:?}",
                    rule.soft
                );
                falling = falling.min(makespan);
            }
        }
        assert!(
            falling <= 0.95 * uniform,
            "falling {falling}, uniform {uniform}"
        );
    }

    /// With transfers the first microbatch's second-chunk forwards reach each rank mid-forward of
    /// the rank's own alternation, and a non-delay rule makes every rank up the way wait for it:
    /// P = 8, M = 16, 2:2:1, transfers 0.2, twice 1F1B's memory, every standard rule's longest span
    /// is at least 84.8, a waiting rule's at most 82.2 (the bound: 81.8). Every waiting rule's
    /// schedule validates and keeps the limit, with and without transfers, at each limit.
    #[test]
    fn waiting_rules_wait_for_the_chain_the_first_rank_needs() {
        let span = |inst: &Instance, orders: &[Vec<Action>]| {
            let s = crate::auto::score::schedule_of(inst, "auto", orders);
            let sim = crate::sim::simulate(&s, &inst.scoring).unwrap();
            sim.timeline
                .spans
                .iter()
                .map(|l| l[l.len() - 1].end - l[0].start)
                .fold(0.0, f64::max)
        };
        let inst = instance(8, 16, [2.0, 2.0, 1.0], 0.2, false, 16.0);
        let best = |rules: Vec<Rule>| {
            rules
                .iter()
                .filter_map(|rule| build(&inst, rule))
                .map(|o| span(&inst, &o))
                .fold(f64::INFINITY, f64::min)
        };
        let (plain, waiting) = (best(Rule::standard(&inst)), best(Rule::waiting(&inst)));
        assert!(plain >= 84.8 - 1e-9, "standard {plain}");
        assert!(waiting <= 82.2 + 1e-9, "waiting {waiting}");
        for latency in [0.0, 0.2] {
            for limit in [4.0, 8.0, 16.0] {
                let inst = instance(8, 16, [2.0, 2.0, 1.0], latency, false, limit);
                // `2P` from 1F1B's memory (P microbatches) up.
                let rules = if limit >= 8.0 { 16 } else { 12 };
                assert_eq!(Rule::waiting(&inst).len(), rules);
                for rule in Rule::waiting(&inst) {
                    let orders = build(&inst, &rule).expect("builds");
                    fits(&inst, &orders, limit, &format!("{rule:?}"));
                }
            }
        }
        // One stage per rank: nothing to wait for, no rules.
        let req = crate::auto::AutoRequest::new(
            4,
            8,
            crate::cost::CostModel::uniform(
                crate::cost::StageCost::uniform(1.0, 1.0, 1.0),
                4,
                crate::cost::LinkCost::default(),
            ),
        );
        assert!(Rule::waiting(&Instance::new(&req).unwrap()).is_empty());
    }
}
