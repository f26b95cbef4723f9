//! The exact method for small instances: a branch and bound over every per-rank order.
//!
//! A schedule is a list per rank; the simulator gives each action the earliest start its rank and
//! its inputs allow. Listing all actions by (start, rank) builds every such schedule exactly once
//! when each new action starts no earlier than the previous one (and on a later rank when at the
//! same time; every time is positive, so an action's inputs always come before it). The search
//! appends actions in that order. Microbatches are interchangeable: sorting the start times of each
//! op of each stage keeps every input (the `j`-th of a stage's ops needs `j` ops of the stage
//! before, the last of which ends no earlier than that stage's `j`-th), every rank's intervals and
//! every rank's memory (which depends only on each rank's order), so each op of each stage takes
//! the microbatches in order, and a schedule's sorted copy is one the search builds.
//! A node is cut when its bound (each rank's remaining work after its free time, and each
//! remaining action's earliest end through its chain of inputs) cannot beat the best schedule so
//! far. Memory is tracked as the lists grow, so the optimum is the optimum under the limit.
//!
//! When the search ends within its node budget the incumbent is optimal (no order of any rank's
//! actions does better); otherwise the root bound is reported.

use crate::schedule::Action;

use super::instance::{Instance, MEMORY_EPS, OPS};

/// Largest instance (`3 * P * V * M` actions) the exact method tries.
pub const EXACT_MAX_ACTIONS: usize = 96;

/// Nodes the search may visit per second of the time budget before it gives up the proof (at
/// least [`MIN_NODES`]).
const NODES_PER_SECOND: f64 = 400_000.0;

/// Nodes the search may always visit.
const MIN_NODES: u64 = 20_000;

/// What the search found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exact {
    /// Whether every order was covered: the best makespan is optimal.
    pub(crate) complete: bool,
    /// A makespan no schedule beats (the root bound, or the optimum when complete).
    pub(crate) lower_bound: f64,
    /// Per-rank lists better than the incumbent, if found.
    pub(crate) improved: Option<Vec<Vec<Action>>>,
    /// Nodes visited.
    pub(crate) nodes: u64,
}

/// Searches `inst` for a makespan below `incumbent`; `None` when the instance is too large or has a
/// zero time (ties would break the one-order-per-schedule rule).
pub(crate) fn solve(inst: &Instance, incumbent: f64, seconds: f64) -> Option<Exact> {
    let n = inst.actions();
    if n > EXACT_MAX_ACTIONS || inst.dur.iter().flatten().any(|&t| t <= 0.0) {
        return None;
    }
    Some(search(inst, incumbent, seconds, true))
}

/// The search itself, on any size (every time positive), with each op of each stage in microbatch
/// order (`sorted`) or only stage 0's forwards (to check that sorting loses nothing).
fn search(inst: &Instance, incumbent: f64, seconds: f64, sorted: bool) -> Exact {
    let n = inst.actions();
    let mut s = Search {
        inst,
        end: vec![f64::INFINITY; n],
        free: vec![0.0; inst.p],
        mem: vec![0.0; inst.p],
        rem: (0..inst.p).map(|r| inst.work(r)).collect(),
        orders: vec![Vec::new(); inst.p],
        placed: 0,
        best: incumbent,
        best_orders: None,
        nodes: 0,
        node_budget: ((seconds * NODES_PER_SECOND) as u64).max(MIN_NODES),
        est: vec![0.0; n],
        sorted,
    };
    let root = s.bound(0.0);
    s.dfs(0.0, 0);
    let complete = s.nodes <= s.node_budget;
    Exact {
        complete,
        lower_bound: if complete { s.best } else { root.min(s.best) },
        improved: s.best_orders,
        nodes: s.nodes,
    }
}

struct Search<'a> {
    inst: &'a Instance,
    end: Vec<f64>,
    free: Vec<f64>,
    mem: Vec<f64>,
    rem: Vec<f64>,
    orders: Vec<Vec<Action>>,
    placed: usize,
    best: f64,
    best_orders: Option<Vec<Vec<Action>>>,
    nodes: u64,
    node_budget: u64,
    est: Vec<f64>,
    sorted: bool,
}

impl Search<'_> {
    /// The ids `id` waits for, with the transfer time after each.
    fn preds(&self, id: usize) -> [(usize, f64); 2] {
        let inst = self.inst;
        let none = (usize::MAX, 0.0);
        let a = inst.action(id);
        let (x, k) = (a.stage, a.microbatch);
        match id % 3 {
            0 if x == 0 => [none, none],
            0 => [(inst.id(0, x - 1, k), inst.comm[x - 1]), none],
            1 if x + 1 == inst.s => [(inst.id(0, x, k), 0.0), none],
            1 => [
                (inst.id(0, x, k), 0.0),
                (inst.id(1, x + 1, k), inst.comm[x]),
            ],
            _ => [(inst.id(1, x, k), 0.0), none],
        }
    }

    /// A makespan bound for every completion of the current node.
    fn bound(&mut self, last: f64) -> f64 {
        let inst = self.inst;
        let mut lb = self.free.iter().copied().fold(0.0, f64::max);
        for r in 0..inst.p {
            if self.rem[r] > 0.0 {
                lb = lb.max(self.free[r].max(last) + self.rem[r]);
            }
        }
        // Earliest end of every remaining action through its inputs: F by stage up, I by stage
        // down, then W (ids in this order respect every input).
        let order = (0..inst.s)
            .map(|x| (0, x))
            .chain((0..inst.s).rev().map(|x| (1, x)))
            .chain((0..inst.s).map(|x| (2, x)));
        for (op, x) in order {
            for k in 0..inst.m {
                let id = inst.id(op, x, k);
                if self.end[id] < f64::INFINITY {
                    self.est[id] = self.end[id];
                    continue;
                }
                let mut start = last.max(self.free[inst.rank_of[x]]);
                for (p, c) in self.preds(id) {
                    if p != usize::MAX {
                        start = start.max(self.est[p] + c);
                    }
                }
                self.est[id] = start + inst.dur[x][op];
                lb = lb.max(self.est[id]);
            }
        }
        lb
    }

    /// Start of `id` on its rank now, if its inputs are placed and memory allows.
    fn start_of(&self, id: usize) -> Option<f64> {
        let inst = self.inst;
        let a = inst.action(id);
        let r = inst.rank_of[a.stage];
        let mut t = self.free[r];
        for (p, c) in self.preds(id) {
            if p != usize::MAX {
                if self.end[p] == f64::INFINITY {
                    return None;
                }
                t = t.max(self.end[p] + c);
            }
        }
        // Microbatches are interchangeable: each op of each stage runs in microbatch order (see
        // the module's docs).
        if a.microbatch > 0
            && (self.sorted || (id % 3 == 0 && a.stage == 0))
            && self.end[id - 3] == f64::INFINITY
        {
            return None;
        }
        // Exact: every start within the budget, as the simulator counts it (F keeps its input
        // only under recomputation, I rebuilds the rest at its start).
        if id % 3 < 2 {
            let need = self.mem[r] + inst.foot[a.stage].allocated_by(OPS[id % 3]);
            if need > inst.budget[r] + MEMORY_EPS * need.max(1.0) {
                return None;
            }
        }
        Some(t)
    }

    fn dfs(&mut self, last: f64, last_rank: usize) {
        self.nodes += 1;
        if self.nodes > self.node_budget {
            return;
        }
        let inst = self.inst;
        if self.placed == inst.actions() {
            let makespan = self.free.iter().copied().fold(0.0, f64::max);
            if makespan < self.best * (1.0 - 1e-12) {
                self.best = makespan;
                self.best_orders = Some(self.orders.clone());
            }
            return;
        }
        if self.bound(last) >= self.best * (1.0 - 1e-12) {
            return;
        }
        let mut cands: Vec<(f64, usize)> = (0..inst.actions())
            .filter(|&id| self.end[id] == f64::INFINITY)
            .filter_map(|id| Some((self.start_of(id)?, id)))
            .filter(|&(t, id)| {
                let r = inst.rank_of[inst.action(id).stage];
                t > last || (t == last && r > last_rank) || self.placed == 0
            })
            .collect();
        cands.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (t, id) in cands {
            self.apply(id, t, true);
            let r = inst.rank_of[inst.action(id).stage];
            self.dfs(t, r);
            self.apply(id, t, false);
            if self.nodes > self.node_budget {
                return;
            }
        }
    }

    /// Places (`on`) or removes `id` started at `t`.
    fn apply(&mut self, id: usize, t: f64, on: bool) {
        let inst = self.inst;
        let a = inst.action(id);
        let op = id % 3;
        let r = inst.rank_of[a.stage];
        let d = inst.dur[a.stage][op];
        let sign = if on { 1.0 } else { -1.0 };
        self.mem[r] += sign * inst.delta(op, a.stage);
        self.rem[r] -= sign * d;
        if on {
            self.end[id] = t + d;
            self.orders[r].push(a);
            self.free[r] = t + d;
            self.placed += 1;
        } else {
            self.end[id] = f64::INFINITY;
            self.orders[r].pop();
            self.free[r] = self.orders[r].last().map_or(0.0, |&b| {
                self.end[inst.id(op_index(b), b.stage, b.microbatch)]
            });
            self.placed -= 1;
        }
    }
}

/// 0, 1, 2 for F, I, W.
fn op_index(a: Action) -> usize {
    match a.op {
        crate::schedule::Op::F => 0,
        crate::schedule::Op::I => 1,
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::{AutoRequest, MemoryLimit};
    use crate::cost::{CostModel, LinkCost, StageCost};
    use crate::schedule::Placement;
    use crate::sim::{bound_for, bound_with_limit};

    /// `p * v` stages of uniform costs (one rank's `F:I:W` split over its `v` chunks) and a link of
    /// `latency`.
    fn uniform_costs(p: usize, v: usize, fiw: [f64; 3], latency: f64) -> CostModel {
        let link = LinkCost {
            latency,
            bandwidth: f64::INFINITY,
        };
        let one = StageCost::uniform(fiw[0], fiw[1], fiw[2]).split(v);
        CostModel::uniform(one, p * v, link)
    }

    /// The instance of `m` microbatches on `costs` under an in-flight `limit` (or none).
    fn instance(
        p: usize,
        v: usize,
        m: usize,
        placement: Placement,
        costs: &CostModel,
        limit: Option<f64>,
    ) -> Instance {
        let mut req = AutoRequest::new(p, m, costs.clone()).with_chunks(v, placement);
        if let Some(l) = limit {
            req = req.with_limit(MemoryLimit::InFlight(l));
        }
        Instance::new(&req).unwrap()
    }

    /// The simulator's makespan bound under `limit` (or without one).
    fn bound_of(
        p: usize,
        m: usize,
        placement: Placement,
        costs: &CostModel,
        limit: Option<f64>,
    ) -> f64 {
        match limit {
            None => bound_for(p, m, placement, costs, false),
            Some(l) => bound_with_limit(p, m, placement, costs, false, &vec![l; p]).unwrap(),
        }
    }

    /// Proves `inst`'s optimum with the sorted search, checks that `bound` is not above it, and
    /// says whether it reaches it.
    fn bound_reaches_optimum(inst: &Instance, bound: f64, case: &str) -> bool {
        let found = search(inst, f64::INFINITY, 60.0, true);
        assert!(found.complete, "{case}: not proven");
        let optimum = found.lower_bound;
        assert!(
            bound <= optimum + 1e-9,
            "{case}: bound {bound} > optimum {optimum}"
        );
        bound >= optimum - 1e-9
    }

    /// Taking each op of each stage in microbatch order loses nothing: the optimum equals the one
    /// found with only stage 0's forwards in order, under limits and transfers, on every case both
    /// prove; it never visits more nodes, and fewer in most cases.
    #[test]
    fn sorted_search_keeps_the_optimum() {
        let (mut cases, mut fewer) = (0, 0);
        for (p, v, m, placement) in [
            (2, 2, 2, Placement::Vshape),
            (2, 2, 3, Placement::Vshape),
            (3, 1, 3, Placement::Looped),
            (2, 1, 4, Placement::Looped),
        ] {
            for (fiw, latency) in [([1.0, 1.0, 1.0], 0.0), ([2.0, 1.5, 1.0], 0.3)] {
                let costs = uniform_costs(p, v, fiw, latency);
                for limit in [None, Some(1.0), Some(1.5)] {
                    let inst = instance(p, v, m, placement, &costs, limit);
                    let case = format!("P={p} V={v} M={m} {fiw:?} latency {latency} {limit:?}");
                    let sorted = search(&inst, f64::INFINITY, 600.0, true);
                    let plain = search(&inst, f64::INFINITY, 600.0, false);
                    assert!(sorted.complete && plain.complete, "{case}: not proven");
                    assert!(
                        (sorted.lower_bound - plain.lower_bound).abs() <= 1e-9,
                        "{case}: sorted {} against {}",
                        sorted.lower_bound,
                        plain.lower_bound
                    );
                    assert!(sorted.nodes <= plain.nodes, "{case}: more nodes");
                    cases += 1;
                    fewer += usize::from(sorted.nodes < plain.nodes);
                }
            }
        }
        assert_eq!(cases, 24);
        assert!(
            fewer >= cases / 2,
            "sorting prunes in only {fewer} of {cases}"
        );
    }

    /// The simulator's makespan bounds (the staircases and the spans of sections 7 and 8
    /// included) are never above the optimum this search proves, with more microbatches than the
    /// enumeration of `host/tests/sim_span_bound.rs` can reach (and equal to it somewhere).
    #[test]
    fn bounds_never_above_proven_optima() {
        let (mut cases, mut equal) = (0, 0);
        for (p, v, m, placement) in [
            (2, 2, 3, Placement::Vshape),
            (2, 2, 2, Placement::Vshape),
            (3, 1, 4, Placement::Looped),
            (2, 1, 5, Placement::Looped),
            (4, 1, 3, Placement::Looped),
        ] {
            for (fiw, latency) in [
                ([1.0, 1.0, 1.0], 0.0),
                ([2.0, 1.5, 1.0], 0.3),
                ([1.0, 2.0, 0.5], 0.1),
                ([2.0, 2.0, 1.0], 0.2),
            ] {
                let costs = uniform_costs(p, v, fiw, latency);
                for limit in [None, Some(1.0), Some(1.5), Some(2.0)] {
                    let inst = instance(p, v, m, placement, &costs, limit);
                    let case = format!("P={p} V={v} M={m} {fiw:?} latency {latency} {limit:?}");
                    let bound = bound_of(p, m, placement, &costs, limit);
                    cases += 1;
                    equal += usize::from(bound_reaches_optimum(&inst, bound, &case));
                }
            }
        }
        assert_eq!(cases, 80);
        assert!(equal > 0);
    }

    /// The makespan bounds against optima that only the sorted search proves: V-shape with 48 to
    /// 96 actions (P = 2, M = 4; P = 3, M = 3; P = 4, M = 4), the grid's ratios with transfers,
    /// under limits from one microbatch to none (the unsorted search proves none of the P = 3 or
    /// P = 4 cases with transfers within its budget).
    #[test]
    fn bounds_never_above_larger_proven_optima() {
        let (mut cases, mut equal) = (0, 0);
        for (p, m) in [(2, 4), (3, 3), (4, 4)] {
            let ratios: &[([f64; 3], f64)] = if p == 4 {
                &[([1.0, 1.0, 1.0], 0.0)]
            } else {
                &[
                    ([1.0, 1.0, 1.0], 0.0),
                    ([2.0, 1.5, 1.0], 0.3),
                    ([2.0, 2.0, 1.0], 0.2),
                    ([1.0, 1.2, 0.8], 0.1),
                ]
            };
            for &(fiw, latency) in ratios {
                let costs = uniform_costs(p, 2, fiw, latency);
                let limits: &[Option<f64>] = if p == 4 {
                    &[None, Some(4.0)]
                } else {
                    &[None, Some(1.0), Some(1.5), Some(p as f64)]
                };
                for &limit in limits {
                    let inst = instance(p, 2, m, Placement::Vshape, &costs, limit);
                    let case = format!("P={p} M={m} {fiw:?} latency {latency} {limit:?}");
                    let bound = bound_of(p, m, Placement::Vshape, &costs, limit);
                    cases += 1;
                    equal += usize::from(bound_reaches_optimum(&inst, bound, &case));
                }
            }
        }
        assert_eq!(cases, 34);
        assert!(
            equal >= cases / 2,
            "the bound reaches only {equal} of {cases} optima"
        );
    }

    /// Section 11 of the bound (two levels of holding, with the jobs that must precede each
    /// forward packed on its rank) is never above the exact method's proven optimum under byte
    /// limits where `I` releases part of a stage, as the zero-bubble authors' model does; and it
    /// reaches the optimum somewhere (ZB-H1's at 1F1B's memory: p = 2, m = 6 and p = 3, m = 4).
    #[test]
    fn two_level_bounds_never_above_proven_optima() {
        use crate::sim::{bound_with_limit_until_input, span_bound_until_input};
        let (mut cases, mut equal) = (0, 0);
        for (p, v, m, placement) in [
            (2, 1, 6, Placement::Looped),
            (3, 1, 4, Placement::Looped),
            (4, 1, 3, Placement::Looped),
            (2, 2, 3, Placement::Vshape),
        ] {
            for (fiw, latency) in [
                ([1.0, 1.0, 0.5], 0.03),
                ([2.0, 1.5, 1.0], 0.3),
                ([1.0, 1.0, 1.0], 0.0),
            ] {
                for kept in [0.366, 0.6] {
                    let link = LinkCost {
                        latency,
                        bandwidth: f64::INFINITY,
                    };
                    let mut one = StageCost::uniform(fiw[0], fiw[1], fiw[2]);
                    one.activation_bytes = 1.0;
                    one.released_at_input = 1.0 - kept;
                    let costs = CostModel::uniform(one.split(v), p * v, link);
                    for limit in [1.0, 1.5, p as f64, 1.5 * p as f64] {
                        let req = AutoRequest::new(p, m, costs.clone())
                            .with_chunks(v, placement)
                            .with_limit(MemoryLimit::Bytes(limit));
                        let inst = Instance::new(&req).unwrap();
                        let case =
                            format!("P={p} V={v} M={m} {fiw:?} {latency} kept {kept} {limit}");
                        let found = solve(&inst, f64::INFINITY, 60.0).unwrap();
                        assert!(found.complete, "{case}: not proven");
                        let optimum = found.lower_bound;
                        let (limits, after) = crate::auto::until_input_limits(&inst).unwrap();
                        let b = bound_with_limit_until_input(
                            p, m, placement, &costs, false, &limits, &after,
                        )
                        .unwrap();
                        assert!(b <= optimum + 1e-9, "{case}: bound {b} > optimum {optimum}");
                        let s =
                            span_bound_until_input(p, m, placement, &costs, false, &limits, &after)
                                .unwrap();
                        assert!(
                            s <= optimum + 1e-9,
                            "{case}: span bound {s} > optimum {optimum}"
                        );
                        cases += 1;
                        equal += usize::from(b >= optimum - 1e-9);
                    }
                }
            }
        }
        assert_eq!(cases, 96);
        assert!(equal > 0, "never reaches an optimum");
    }
}
