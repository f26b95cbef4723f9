//! The zero-bubble authors' ZB-V greedy as they run it (Qi et al., "Zero Bubble Pipeline
//! Parallelism", the V-shape scheduler; the procedure re-derived and written anew): origin
//! `zbv-bubble`, for `--placement vshape` (`V = 2`) only. Module `vgreedy` is an event-driven
//! greedy after the same ideas; this one follows the authors' phases step for step, so that `auto`
//! holds every schedule their scheduler would return at the same memory:
//!
//! 1. **warm-up**: every rank runs one chunk-0 forward; then, from the last rank up, rank `i` keeps
//!    adding chunk-0 forwards on ranks `0..=i` while its memory leaves room for `2 + 2i` more
//!    chunk forwards and the forward ends before the first chunk-1 activation reaches it, then runs
//!    its first chunk-1 forward; then each rank catches up with the one above it, alternating the
//!    chunks, until it has run as many forwards as its upstream neighbour and one more chunk-1;
//! 2. **steady state**, `2M` rounds: each rank runs one input-gradient pass `I` (chunk 1 first where
//!    its gradient is there, processed bottom-up for chunk 1 and top-down for chunk 0, so every
//!    gradient is computed before its use), then at most one forward (chunk 1 when its input is
//!    there, else chunk 0); before each, pending `W`s run while memory needs it, while one fits in
//!    the wait for the input, and one more when the wait is longer than the rank may idle
//!    (its *approved bubble*) and the setting's fill switch for that op is on;
//! 3. the remaining `W`s.
//!
//! The times used for the choices are the request's per-stage times and transfers. The approved
//! bubble of each rank starts as "none" and is then set, run after run, to the idle time per rank
//! of the previous run while that lowers the largest; all four fill settings run. Every run's lists
//! are a candidate (the authors keep the one with the least idle time; `auto` scores them all), also
//! under each smaller limit of the V-shape ladder ([`super::vgreedy::ladder`]). A run that reaches
//! a state their scheduler would refuse (an action whose input is not computed, a forward with no
//! room left and no `W` to free it) is dropped.

use std::collections::VecDeque;

use crate::schedule::{Action, Placement};

use super::instance::{Instance, MEMORY_EPS};

/// Most approved-bubble reruns per fill setting (the authors stop when the largest idle time stops
/// falling; this only bounds a run that keeps lowering it by tiny amounts).
const MAX_RERUNS: usize = 32;

/// Op indices of the instance (`F`, `I`, `W`).
const F: usize = 0;
const I: usize = 1;
const W: usize = 2;

/// One run's state.
struct Run<'a> {
    inst: &'a Instance,
    budget: &'a [f64],
    fill_f: bool,
    fill_b: bool,
    /// Per rank, the approved bubble; `None` on the first run.
    approved: Option<&'a [f64]>,
    end: Vec<f64>,
    /// Per stage, how many of each op are placed.
    next: Vec<[usize; 3]>,
    free: Vec<f64>,
    mem: Vec<f64>,
    bubble: Vec<f64>,
    pending_w: Vec<VecDeque<usize>>,
    orders: Vec<Vec<Action>>,
}

impl Run<'_> {
    fn lo(&self, r: usize) -> usize {
        r
    }

    fn hi(&self, r: usize) -> usize {
        2 * self.inst.p - 1 - r
    }

    /// End of `op` of stage `x`, microbatch `k`, if placed.
    fn placed(&self, op: usize, x: usize, k: usize) -> Option<f64> {
        let e = self.end[self.inst.id(op, x, k)];
        e.is_finite().then_some(e)
    }

    /// The action producing the input of the next `op` (F or I) of stage `x` on another stage, with
    /// the transfer time after it: `(stage, microbatch, transfer)`.
    fn producer(&self, op: usize, x: usize) -> Option<(usize, usize, f64)> {
        let inst = self.inst;
        let k = self.next[x][op];
        match op {
            F if x > 0 => Some((x - 1, k, inst.comm[x - 1])),
            I if x + 1 < inst.s => Some((x + 1, k, inst.comm[x])),
            _ => None,
        }
    }

    /// The largest idle time the rank may accept: the largest idle time so far, or what its
    /// approved bubble lacks to the largest approved one.
    fn max_bubble(&self, r: usize) -> f64 {
        let most = self.bubble.iter().copied().fold(0.0, f64::max);
        match self.approved {
            Some(a) => most.max(a.iter().copied().fold(f64::MIN, f64::max) - a[r]),
            None => most,
        }
    }

    /// Places the next `op` of stage `x`; `None` when its microbatches are done, it does not fit,
    /// or an input it needs is not computed.
    fn put(&mut self, op: usize, x: usize) -> Option<()> {
        let inst = self.inst;
        let r = inst.rank_of[x];
        let k = if op == W {
            let front = *self.pending_w[r].front()?;
            if front != x {
                return None;
            }
            self.next[x][W]
        } else {
            self.next[x][op]
        };
        if k >= inst.m {
            return None;
        }
        let delta = inst.delta(op, x);
        let need = self.mem[r] + delta;
        if delta > 0.0 && need > self.budget[r] + MEMORY_EPS * need.max(1.0) {
            return None;
        }
        let mut start = self.free[r];
        match op {
            F => {
                if x > 0 {
                    start = start.max(self.placed(F, x - 1, k)? + inst.comm[x - 1]);
                }
            }
            I => {
                start = start.max(self.placed(F, x, k)?);
                if x + 1 < inst.s {
                    start = start.max(self.placed(I, x + 1, k)? + inst.comm[x]);
                }
            }
            _ => {
                self.placed(I, x, k)?;
                self.pending_w[r].pop_front();
            }
        }
        let id = inst.id(op, x, k);
        self.end[id] = start + inst.dur[x][op];
        if self.next[self.lo(r)][F] > 0 {
            // As the authors count it (end less the end without waiting), so that ties in the
            // comparisons below fall the same way.
            self.bubble[r] += self.end[id] - (self.free[r] + inst.dur[x][op]);
        }
        self.free[r] = self.end[id];
        self.mem[r] += delta;
        self.next[x][op] += 1;
        if op == I {
            self.pending_w[r].push_back(x);
        }
        self.orders[r].push(inst.action(id));
        Some(())
    }

    /// The rank's oldest pending `W`.
    fn put_w(&mut self, r: usize) -> Option<()> {
        let x = *self.pending_w[r].front()?;
        self.put(W, x)
    }

    /// Before the next `op` of stage `x` on rank `r`: `W`s while memory needs room, while one fits
    /// in the wait for the input, then one more when the wait is longer than the rank may idle and
    /// `fill` is on.
    fn fill(&mut self, r: usize, op: usize, x: usize, fill: bool) -> Option<()> {
        let inst = self.inst;
        if op == F {
            let delta = inst.delta(F, x);
            while self.mem[r] + delta > self.budget[r] + MEMORY_EPS * (self.mem[r] + delta).max(1.0)
            {
                self.put_w(r)?;
            }
        }
        let Some((y, k, comm)) = self.producer(op, x) else {
            return Some(());
        };
        let arrival = self.placed(op, y, k).map(|e| e + comm);
        while let (Some(&wx), Some(a)) = (self.pending_w[r].front(), arrival) {
            if a < self.free[r] + inst.dur[wx][W] {
                break;
            }
            self.put_w(r)?;
        }
        if let (Some(_), Some(a)) = (self.pending_w[r].front(), arrival) {
            if fill && a - self.free[r] > self.max_bubble(r) - self.bubble[r] {
                self.put_w(r)?;
            }
        }
        Some(())
    }

    /// The warm-up (phase 1 of the module docs).
    fn warm_up(&mut self) -> Option<()> {
        let (p, m) = (self.inst.p, self.inst.m);
        for r in 0..p {
            self.put(F, self.lo(r))?;
        }
        for r in (0..p).rev() {
            if r + 1 < p {
                let y = self.hi(r + 1);
                let arrival = self.placed(F, y, 0)? + self.inst.comm[y];
                let room = self.inst.delta(F, self.lo(r)) * (2 + 2 * r) as f64;
                while self.mem[r] + room <= self.budget[r] + MEMORY_EPS * room.max(1.0)
                    && self.free[r] + self.inst.dur[self.lo(r)][F] <= arrival
                    && self.next[self.lo(r)][F] < m
                {
                    for j in 0..=r {
                        self.put(F, self.lo(j))?;
                    }
                }
            }
            self.put(F, self.hi(r))?;
        }
        let mut chunk = 0;
        for r in 1..p {
            let count = |run: &Self, q: usize| {
                (
                    run.next[run.lo(q)][F] + run.next[run.hi(q)][F],
                    run.next[run.hi(q)][F],
                )
            };
            loop {
                let (mine, mine_hi) = count(self, r);
                let (up, up_hi) = count(self, r - 1);
                if !(mine < up || (mine_hi <= up_hi && up_hi < m)) {
                    break;
                }
                for j in (r..p).rev() {
                    let x = if chunk == 0 { self.lo(j) } else { self.hi(j) };
                    if self.next[x][F] < m {
                        self.put(F, x)?;
                    }
                }
                chunk = 1 - chunk;
            }
        }
        Some(())
    }

    /// The steady state and the drain (phases 2 and 3 of the module docs).
    fn steady(&mut self) -> Option<()> {
        let (p, m) = (self.inst.p, self.inst.m);
        for _ in 0..2 * m {
            let mut up = Vec::new();
            let mut down = Vec::new();
            for r in 0..p {
                let (lo, hi) = (self.lo(r), self.hi(r));
                let (ilo, ihi) = (self.next[lo][I], self.next[hi][I]);
                if ilo >= ihi {
                    down.push(r);
                } else if r + 1 == p || self.placed(I, self.lo(r + 1), ilo).is_some() || ihi >= m {
                    up.push(r);
                } else {
                    down.push(r);
                }
            }
            let order = up
                .iter()
                .rev()
                .map(|&r| (r, self.lo(r)))
                .chain(down.iter().map(|&r| (r, self.hi(r))));
            for (r, x) in order.collect::<Vec<_>>() {
                let fill = x == self.lo(r) || self.fill_b;
                self.fill(r, I, x, fill)?;
                self.put(I, x)?;
            }
            for r in 0..p {
                let (lo, hi) = (self.lo(r), self.hi(r));
                let (flo, fhi) = (self.next[lo][F], self.next[hi][F]);
                if fhi >= m {
                    continue;
                }
                let x = if fhi >= flo || r + 1 == p || self.placed(F, self.hi(r + 1), fhi).is_some()
                {
                    if fhi >= flo {
                        lo
                    } else {
                        hi
                    }
                } else if flo < m && (r == 0 || self.placed(F, self.lo(r - 1), flo).is_some()) {
                    lo
                } else {
                    continue;
                };
                self.fill(r, F, x, self.fill_f)?;
                self.put(F, x)?;
            }
        }
        for r in 0..p {
            while !self.pending_w[r].is_empty() {
                self.put_w(r)?;
            }
        }
        Some(())
    }
}

/// One run: the per-rank lists and each rank's idle time after its first forward.
fn run(
    inst: &Instance,
    budget: &[f64],
    fill_f: bool,
    fill_b: bool,
    approved: Option<&[f64]>,
) -> Option<(Vec<Vec<Action>>, Vec<f64>)> {
    let p = inst.p;
    let mut g = Run {
        inst,
        budget,
        fill_f,
        fill_b,
        approved,
        end: vec![f64::INFINITY; inst.actions()],
        next: vec![[0; 3]; inst.s],
        free: vec![0.0; p],
        mem: vec![0.0; p],
        bubble: vec![0.0; p],
        pending_w: vec![VecDeque::new(); p],
        orders: (0..p).map(|_| Vec::with_capacity(6 * inst.m)).collect(),
    };
    g.warm_up()?;
    g.steady()?;
    Some((g.orders, g.bubble))
}

/// Every run's lists under `budget`: the four fill settings, each with its approved-bubble reruns.
pub(crate) fn runs(inst: &Instance, budget: &[f64]) -> Vec<Vec<Vec<Action>>> {
    if inst.v != 2 || inst.placement != Placement::Vshape || budget.len() != inst.p {
        return Vec::new();
    }
    let most = |b: &[f64]| b.iter().copied().fold(f64::MIN, f64::max);
    let mut out = Vec::new();
    for fill_b in [true, false] {
        for fill_f in [true, false] {
            let mut approved: Option<Vec<f64>> = None;
            for _ in 0..MAX_RERUNS {
                let Some((orders, bubble)) = run(inst, budget, fill_f, fill_b, approved.as_deref())
                else {
                    break;
                };
                out.push(orders);
                let lower = approved.as_deref().is_none_or(|a| most(&bubble) < most(a));
                if !lower {
                    break;
                }
                approved = Some(bubble);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::vgreedy::tests::{cases, fits, instance};

    /// Every run, under every budget of the ladder, is a valid schedule whose simulated peak keeps
    /// the instance's limit; from 1F1B's memory up, on equal stages, the greedy always finishes.
    #[test]
    fn every_run_validates_and_keeps_the_limit() {
        for (inst, limit, what) in cases() {
            let mut built = 0;
            for budget in crate::auto::vgreedy::ladder(&inst) {
                for orders in runs(&inst, &budget) {
                    built += 1;
                    fits(&inst, &orders, limit, &what);
                }
            }
            // Uneven costs can lead it to a forward whose input is not there (the authors'
            // scheduler assumes equal stages), so only equal ones must finish.
            let uneven = inst.dur[0] != inst.dur[1];
            assert!(
                built > 0 || limit < inst.p as f64 || uneven,
                "{what} limit {limit}: no run"
            );
        }
    }

    /// More memory never loses a run: the budgets tried at a limit of the ladder include every
    /// smaller limit's, so `auto`'s seeds at `2P` include those at `P` and at `P/2`.
    #[test]
    fn a_larger_limit_keeps_the_smaller_limits_runs() {
        for (p, m) in [(2, 4), (4, 8), (8, 16)] {
            let pf = p as f64;
            let ladder = [pf / 2.0, pf, 2.0 * pf];
            for (i, &small) in ladder.iter().enumerate() {
                let lo = instance(p, m, [1.0, 1.2, 0.8], 0.1, false, small);
                for &big in &ladder[i + 1..] {
                    let hi = crate::auto::vgreedy::ladder(&instance(
                        p,
                        m,
                        [1.0, 1.2, 0.8],
                        0.1,
                        false,
                        big,
                    ));
                    assert!(hi.contains(&lo.budget), "P={p} M={m} {small} -> {big}");
                    assert!(!runs(&lo, &lo.budget).is_empty() || small < pf);
                }
            }
        }
    }

    #[test]
    fn only_v_shape_with_two_chunks() {
        use crate::auto::AutoRequest;
        use crate::cost::{CostModel, LinkCost, StageCost};
        let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
        let inst = Instance::new(&AutoRequest::new(4, 8, c)).unwrap();
        assert!(runs(&inst, &inst.budget).is_empty());
    }
}
