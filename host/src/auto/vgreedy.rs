//! A V-shape constructive phase after the zero-bubble authors' V-shape scheduler (Qi et al., ZB-V;
//! the ideas re-derived from their description, the code written anew): origin `zbv-greedy`, for
//! `--placement vshape` (`V = 2`) only.
//!
//! Each rank holds two stages: chunk 0 (stage `r`, on the way down) and chunk 1 (stage `2P-1-r`, on
//! the way back up). A timeline per rank is simulated with an explicit memory counter (`F` adds its
//! stage's activations when it starts, `I` and `W` release theirs), and the rank that is free first
//! chooses its next action greedily:
//!
//! 1. an `I` whose gradient has arrived;
//! 2. else an `F` whose input has arrived (or soon will), if memory allows it and it would not delay
//!    the rank's next `I` (its estimated arrival) by more than the rank's *approved bubble*; before
//!    the rank's first `I` a setting may lift that restriction (fill the warm-up with forwards);
//! 3. else a pending `W` that does not delay that `I` by more than the approved bubble;
//! 4. else it waits for the next event.
//!
//! Memory never deadlocks: a chunk-0 `F` also needs room for one chunk-1 `F` still to come, so the
//! oldest microbatch a rank holds can always pass its turn.
//!
//! [`Setting::grid`] lists what is tried: warm-up fill on or off, chunk-1 or earliest forward first,
//! and approved-bubble vectors (all zero; increasing or decreasing over the ranks up to a few
//! forward times; constant). Every setting's result is a candidate, also built under each smaller
//! limit of the ladder `P/2`, `P`, `2P` ([`candidates`]).

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use crate::schedule::{Action, Placement};

use super::instance::{Instance, MEMORY_EPS};

/// How far past now a gradient whose producer is not placed yet is assumed to arrive at the
/// earliest (it is never taken as arrived).
const MIN_WAIT: f64 = 1e-12;

/// How many unplaced producers up the backward chain [`VGreedy::i_eta`] follows (the cost of a
/// choice stays bounded on deep pipelines).
const ETA_DEPTH: usize = 4;

/// One setting of the construction.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Setting {
    /// Before a rank's first `I`, forwards may delay it without limit (only memory stops them).
    pub(crate) warm_fill: bool,
    /// When both chunks' forwards may run, chunk 1's goes first (else the one that can start first).
    pub(crate) chunk1_first: bool,
    /// Per rank, how long it accepts delaying its next `I` to run an `F` or a `W`.
    pub(crate) approved: Vec<f64>,
}

impl Setting {
    /// The settings tried on `inst`: both switches, times approved-bubble vectors in units of each
    /// rank's forward time: zero, increasing `c * r / (P - 1)` for `c` in 1, 2, decreasing for
    /// `c = 1`, and constant 1 and 2.
    pub(crate) fn grid(inst: &Instance) -> Vec<Setting> {
        let p = inst.p;
        let fwd: Vec<f64> = (0..p)
            .map(|r| {
                inst.stages_of[r]
                    .iter()
                    .map(|&x| inst.dur[x][0])
                    .sum::<f64>()
                    / 2.0
            })
            .collect();
        let step = |r: usize| r as f64 / (p.max(2) - 1) as f64;
        let mut vectors: Vec<Vec<f64>> = vec![vec![0.0; p]];
        for c in [1.0, 2.0] {
            vectors.push((0..p).map(|r| c * step(r) * fwd[r]).collect());
        }
        vectors.push((0..p).map(|r| step(p - 1 - r) * fwd[r]).collect());
        for c in [1.0, 2.0] {
            vectors.push(fwd.iter().map(|f| c * f).collect());
        }
        let mut out = Vec::new();
        for warm_fill in [false, true] {
            for chunk1_first in [true, false] {
                for approved in &vectors {
                    out.push(Setting {
                        warm_fill,
                        chunk1_first,
                        approved: approved.clone(),
                    });
                }
            }
        }
        out
    }
}

/// The construction's state.
struct VGreedy<'a> {
    inst: &'a Instance,
    set: &'a Setting,
    budget: &'a [f64],
    /// End time per action (infinite until placed).
    end: Vec<f64>,
    /// Per stage, how many F, I, W are placed (each in microbatch order).
    next: Vec<[usize; 3]>,
    free: Vec<f64>,
    mem: Vec<f64>,
    /// Per rank, actions placed.
    done: Vec<usize>,
    /// Per rank, `(stage, microbatch)` whose `I` ended and `W` is pending, in `I` order.
    pending_w: Vec<VecDeque<(usize, usize)>>,
    started_i: Vec<bool>,
    orders: Vec<Vec<Action>>,
}

/// Per-rank lists for `setting` under per-rank `budget`s (the instance's own or a smaller one);
/// `None` unless the instance is V-shape with `V = 2`, or when the construction cannot finish.
pub(crate) fn build(
    inst: &Instance,
    setting: &Setting,
    budget: &[f64],
) -> Option<Vec<Vec<Action>>> {
    if inst.v != 2 || inst.placement != Placement::Vshape || budget.len() != inst.p {
        return None;
    }
    let p = inst.p;
    let mut g = VGreedy {
        inst,
        set: setting,
        budget,
        end: vec![f64::INFINITY; inst.actions()],
        next: vec![[0; 3]; inst.s],
        free: vec![0.0; p],
        mem: vec![0.0; p],
        done: vec![0; p],
        pending_w: vec![VecDeque::new(); p],
        started_i: vec![false; p],
        orders: (0..p).map(|_| Vec::with_capacity(6 * inst.m)).collect(),
    };
    let per_rank = 6 * inst.m;
    let min_dur = inst
        .dur
        .iter()
        .flatten()
        .copied()
        .filter(|&d| d > 0.0)
        .fold(f64::INFINITY, f64::min);
    let min_dur = if min_dur.is_finite() { min_dur } else { 1.0 };
    let mut idles = 0usize;
    let idle_cap = 4 * inst.actions() + 64 * p;
    loop {
        let r = (0..p)
            .filter(|&r| g.done[r] < per_rank)
            .min_by(|&a, &b| g.free[a].total_cmp(&g.free[b]).then(a.cmp(&b)));
        let Some(r) = r else { break };
        let t = g.free[r];
        match g.decide(r, t) {
            Some((op, x, start)) => g.place(op, x, start),
            None => {
                idles += 1;
                if idles > idle_cap {
                    return None;
                }
                let next = g.next_event(r, t, min_dur);
                if !next.is_finite() {
                    return None;
                }
                g.free[r] = next;
            }
        }
    }
    Some(g.orders)
}

impl VGreedy<'_> {
    /// Rank `r`'s two stages: chunk 0, chunk 1.
    fn stages(&self, r: usize) -> (usize, usize) {
        (r, 2 * self.inst.p - 1 - r)
    }

    /// When the input of stage `x`'s next `F` is there, if its producer is placed.
    fn f_ready(&self, x: usize) -> Option<f64> {
        let k = self.next[x][0];
        if k >= self.inst.m {
            return None;
        }
        if x == 0 {
            return Some(0.0);
        }
        let e = self.end[self.inst.id(0, x - 1, k)];
        e.is_finite().then(|| e + self.inst.comm[x - 1])
    }

    /// An estimate (exact once its producers are placed) of when `I` of `(x, k)` can start: a
    /// producer not yet placed is assumed to run as soon as its rank is free and its input is there
    /// (followed [`ETA_DEPTH`] producers up, then assumed there).
    fn i_eta(&self, x: usize, k: usize, depth: usize) -> f64 {
        let inst = self.inst;
        let own = self.end[inst.id(0, x, k)];
        if !own.is_finite() || x + 1 == inst.s {
            return own;
        }
        let y = x + 1;
        let e = self.end[inst.id(1, y, k)];
        let grad = if e.is_finite() {
            e
        } else {
            let r = inst.rank_of[y];
            let input = if depth == 0 {
                0.0
            } else {
                self.i_eta(y, k, depth - 1)
            };
            self.free[r].max(input) + inst.dur[y][1]
        };
        own.max(grad + inst.comm[x])
    }

    /// Whether rank `r` may start the next `F` of stage `x` memory-wise.
    fn f_fits(&self, r: usize, x: usize) -> bool {
        let (lo, hi) = self.stages(r);
        let foot = &self.inst.foot;
        let need = self.mem[r]
            + foot[x].bytes
            + if x == lo && lo != hi {
                foot[hi].bytes
            } else {
                0.0
            };
        need <= self.budget[r] + MEMORY_EPS * need.max(1.0)
    }

    /// Rank `r`'s next action at time `t`: `(op, stage, start)`, or `None` to wait.
    fn decide(&self, r: usize, t: f64) -> Option<(usize, usize, f64)> {
        let inst = self.inst;
        let (lo, hi) = self.stages(r);
        // The next `I`: the one whose gradient comes first (chunk 1 on ties).
        let mut best_i: Option<(f64, usize)> = None;
        for x in [hi, lo] {
            let k = self.next[x][1];
            if k < inst.m && k < self.next[x][0] {
                let known = x + 1 == inst.s || self.end[inst.id(1, x + 1, k)].is_finite();
                let eta = self.i_eta(x, k, ETA_DEPTH);
                let eta = if known { eta } else { eta.max(t + MIN_WAIT) };
                if best_i.is_none_or(|(b, _)| eta < b) {
                    best_i = Some((eta, x));
                }
            }
        }
        let t_b = best_i.map_or(f64::INFINITY, |(e, _)| e);
        if let Some((eta, x)) = best_i {
            if eta <= t {
                return Some((1, x, t));
            }
        }
        let slack = if self.set.warm_fill && !self.started_i[r] {
            f64::INFINITY
        } else {
            self.set.approved[r]
        };
        let w = self.pending_w[r].front().map(|&(x, _)| (inst.dur[x][2], x));
        // Forwards whose input is known, fit in memory and do not delay the `I` too much.
        let mut best_f: Option<(f64, usize)> = None;
        for x in [hi, lo] {
            let Some(ready) = self.f_ready(x) else {
                continue;
            };
            let start = t.max(ready);
            if start + inst.dur[x][0] > t_b + slack || !self.f_fits(r, x) {
                continue;
            }
            let better = match best_f {
                None => true,
                Some((s, _)) => !self.set.chunk1_first && start < s,
            };
            if better {
                best_f = Some((start, x));
            }
        }
        if let Some((start, x)) = best_f {
            // Fill the wait for the forward's input with a `W` that fits in it.
            if let Some((w, wx)) = w {
                if start > t && t + w <= start {
                    return Some((2, wx, t));
                }
            }
            return Some((0, x, start));
        }
        if let Some((w, wx)) = w {
            if t + w <= t_b + self.set.approved[r] || t_b == f64::INFINITY {
                return Some((2, wx, t));
            }
        }
        None
    }

    /// When something may change for rank `r` waiting at `t`.
    fn next_event(&self, r: usize, t: f64, min_dur: f64) -> f64 {
        let inst = self.inst;
        let (lo, hi) = self.stages(r);
        let mut next = f64::INFINITY;
        let mut consider = |v: f64| {
            if v > t && v < next {
                next = v;
            }
        };
        for x in [hi, lo] {
            let k = self.next[x][1];
            if k < inst.m && k < self.next[x][0] {
                consider(self.i_eta(x, k, ETA_DEPTH));
            }
            if let Some(ready) = self.f_ready(x) {
                consider(ready);
            }
        }
        for (q, &f) in self.free.iter().enumerate() {
            if q != r && self.done[q] < 6 * inst.m {
                consider(if f > t { f } else { t + min_dur });
            }
        }
        next
    }

    /// Places `op` of stage `x` (its next microbatch; for `W` the rank's oldest pending) at `start`.
    fn place(&mut self, op: usize, x: usize, start: f64) {
        let inst = self.inst;
        let r = inst.rank_of[x];
        let k = if op == 2 {
            self.pending_w[r].pop_front().map_or(0, |(_, k)| k)
        } else {
            self.next[x][op]
        };
        let id = inst.id(op, x, k);
        let end = start + inst.dur[x][op];
        self.end[id] = end;
        self.free[r] = end;
        self.mem[r] += inst.delta(op, x);
        self.next[x][op] += 1;
        self.done[r] += 1;
        if op == 1 {
            self.started_i[r] = true;
            self.pending_w[r].push_back((x, k));
        }
        self.orders[r].push(inst.action(id));
    }
}

/// Every setting's lists under the instance's budget and under each smaller budget of the ladder
/// V-Half (`P/2` microbatches in flight), 1F1B (`P`), twice 1F1B (`2P`) (in bytes: that many times
/// what one microbatch holds on the rank), duplicates removed. Lists built under a smaller budget
/// fit the instance's too, so offering them makes the result monotone in the limit over the ladder.
pub(crate) fn candidates(inst: &Instance) -> Vec<Vec<Vec<Action>>> {
    if inst.v != 2 || inst.placement != Placement::Vshape {
        return Vec::new();
    }
    let budgets = ladder(inst);

    let settings = Setting::grid(inst);
    let mut out: Vec<Vec<Vec<Action>>> = Vec::new();
    // Duplicates found by hash first (settings often share most ranks' lists, which makes plain
    // comparisons long).
    let mut seen: HashMap<u64, Vec<usize>> = HashMap::new();
    let jobs: Vec<(&Vec<f64>, &Setting)> = budgets
        .iter()
        .flat_map(|b| settings.iter().map(move |s| (b, s)))
        .collect();
    // Built side by side (module `par`), deduplicated in the sequential order.
    let built = super::par::map_ordered(&jobs, |(budget, set)| build(inst, set, budget));
    for orders in built.into_iter().flatten() {
        let mut h = DefaultHasher::new();
        orders.hash(&mut h);
        let same = seen.entry(h.finish()).or_default();
        if !same.iter().any(|&i| out[i] == orders) {
            same.push(out.len());
            out.push(orders);
        }
    }
    out
}

/// The instance's budgets, then each smaller one of the ladder V-Half (`P/2` microbatches in
/// flight), 1F1B (`P`), twice 1F1B (`2P`) (in bytes: that many times what one microbatch holds on
/// the rank, at least one microbatch), duplicates removed. Lists built under a smaller budget fit
/// the instance's too.
pub(crate) fn ladder(inst: &Instance) -> Vec<Vec<f64>> {
    let mut budgets = vec![inst.budget.clone()];
    let pf = inst.p as f64;
    for n in [pf / 2.0, pf, 2.0 * pf] {
        let b: Vec<f64> = (0..inst.p)
            .map(|r| {
                let one = inst.one_microbatch(r);
                inst.budget[r].min((n * one).max(one))
            })
            .collect();
        if b.iter().zip(&inst.budget).any(|(x, y)| x < y) && !budgets.contains(&b) {
            budgets.push(b);
        }
    }
    budgets
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::auto::score::schedule_of;
    use crate::auto::{AutoRequest, MemoryLimit};
    use crate::cost::{CostModel, LinkCost, StageCost};
    use crate::schedule::validate::validate;
    use crate::sim::simulate;

    /// A V-shape instance: `P` ranks, one rank's `F:I:W` split over two chunks, the first and last
    /// stage 1.5x when `uneven`, a latency per hop.
    pub(crate) fn instance(
        p: usize,
        m: usize,
        fiw: [f64; 3],
        latency: f64,
        uneven: bool,
        limit: f64,
    ) -> Instance {
        let link = LinkCost {
            latency,
            bandwidth: f64::INFINITY,
        };
        let one = StageCost::uniform(fiw[0], fiw[1], fiw[2]).split(2);
        let mut c = CostModel::uniform(one, 2 * p, link);
        if uneven {
            for s in [0, 2 * p - 1] {
                c.stages[s] = StageCost::uniform(
                    1.5 * one.forward,
                    1.5 * one.backward_input,
                    one.backward_weight,
                );
            }
        }
        let req = AutoRequest::new(p, m, c)
            .with_chunks(2, Placement::Vshape)
            .with_limit(MemoryLimit::InFlight(limit));
        Instance::new(&req).unwrap()
    }

    /// Checks that `orders` validate and that their simulated peak keeps `limit` (`what` names the
    /// case); returns the peak.
    pub(crate) fn fits(inst: &Instance, orders: &[Vec<Action>], limit: f64, what: &str) -> f64 {
        let s = schedule_of(inst, "auto", orders);
        validate(&s).unwrap_or_else(|e| panic!("{what}: {e}"));
        let sim = simulate(&s, &inst.scoring).unwrap();
        let peak = sim.peak_activations.iter().copied().fold(0.0, f64::max);
        assert!(peak <= limit + 1e-9, "{what} limit {limit}: peak {peak}");
        peak
    }

    /// Every setting, at V-Half's, 1F1B's and twice 1F1B's memory, finishes with a valid schedule
    /// whose simulated peak stays within the limit.
    #[test]
    fn every_setting_validates_and_keeps_the_limit() {
        for (inst, limit, what) in cases() {
            for set in Setting::grid(&inst) {
                let orders = build(&inst, &set, &inst.budget)
                    .unwrap_or_else(|| panic!("{what} limit {limit} {set:?}"));
                fits(&inst, &orders, limit, &format!("{what} {set:?}"));
            }
        }
    }

    /// The V-shape seeds' test instances: `(P, M)` from 1 to 8 ranks, equal stages with and without
    /// transfers and uneven ones, at V-Half's, 1F1B's and twice 1F1B's memory (at least one
    /// microbatch): each instance, its limit and its name.
    pub(crate) fn cases() -> Vec<(Instance, f64, String)> {
        let mut out = Vec::new();
        for (p, m) in [(1, 3), (2, 4), (4, 4), (4, 8), (4, 16), (8, 16)] {
            for (fiw, latency, uneven) in [
                ([1.0, 1.0, 1.0], 0.0, false),
                ([2.0, 2.0, 1.0], 0.2, false),
                ([1.0, 1.2, 0.8], 0.1, true),
            ] {
                let pf = p as f64;
                for limit in [(pf / 2.0).max(1.0), pf, 2.0 * pf] {
                    let inst = instance(p, m, fiw, latency, uneven, limit);
                    out.push((inst, limit, format!("P={p} M={m} {fiw:?} uneven={uneven}")));
                }
            }
        }
        out
    }

    /// The candidates at a limit include every candidate built at the smaller limits of the ladder
    /// (which is what makes `auto` monotone in the limit over it).
    #[test]
    fn a_larger_limit_keeps_the_smaller_limits_candidates() {
        for (p, m) in [(2, 4), (4, 8), (4, 16)] {
            let pf = p as f64;
            let ladder = [pf / 2.0, pf, 2.0 * pf];
            for (i, &small) in ladder.iter().enumerate() {
                let lo = candidates(&instance(p, m, [1.0, 1.2, 0.8], 0.1, false, small));
                assert!(!lo.is_empty());
                for &big in &ladder[i + 1..] {
                    let hi = candidates(&instance(p, m, [1.0, 1.2, 0.8], 0.1, false, big));
                    assert!(
                        lo.iter().all(|c| hi.contains(c)),
                        "P={p} M={m} {small} -> {big}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_v_shape_with_two_chunks() {
        let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
        let inst = Instance::new(&AutoRequest::new(4, 8, c)).unwrap();
        assert!(candidates(&inst).is_empty());
        assert!(build(&inst, &Setting::grid(&inst)[0], &inst.budget).is_none());
    }
}
