//! Exact search for layouts with several stages per rank (`V > 1`).
//!
//! A rank's load is the sum of its `V` stages, which lie far apart in the model (stages `r, r + P, ...`
//! looped; `r` and `2P - 1 - r` in a V shape), so the chain dynamic programme of `V = 1` does not
//! apply. This is a depth-first branch and bound over the stage ends, in increasing order:
//!
//! - the incumbent starts as the `V = 1` chain optimum over the `S` stages, evaluated per rank;
//! - a branch is cut when a rank's load reaches the incumbent, or when the average bound
//!   `(sum of loads + remaining compute) / P` does, or when a rank's memory passes the limit (its
//!   placed stages' parameters plus the most they hold at one moment of the schedule, which only
//!   grows as stages are placed and as a stage takes more layers);
//! - the first split found with a given value is the lexicographically smallest one with that value,
//!   and only strictly better splits replace the incumbent, so ties are deterministic.
//!
//! The search is exact when it finishes; it stops after a node budget, and the result then says
//! `exact: false`.

use super::holds::held;
use super::{
    chain_optimum, min_peak_memory, Layout, MemoryLimit, Partition, PartitionError, Problem,
};

/// Nodes (tried stage ends) the search may visit before it gives up on proving optimality.
pub const DEFAULT_NODE_BUDGET: u64 = 20_000_000;

struct Search<'a> {
    problem: &'a Problem,
    layout: &'a Layout,
    limit: Option<&'a MemoryLimit>,
    loads: Vec<u64>,
    /// Per rank: the parameter bytes of its placed stages.
    params: Vec<u64>,
    /// Per rank, per moment of the schedule ([`super::Holds::moments`]): what its placed stages hold.
    held: Vec<Vec<f64>>,
    current: Vec<usize>,
    best_value: u64,
    best: Option<Vec<usize>>,
    nodes: u64,
    budget: u64,
    /// Stop at the first split that fits (feasibility only).
    first_only: bool,
}

impl<'a> Search<'a> {
    fn new(
        problem: &'a Problem,
        layout: &'a Layout,
        limit: Option<&'a MemoryLimit>,
        budget: u64,
    ) -> Self {
        let held = (0..layout.ranks)
            .map(|r| vec![0.0; limit.map_or(0, |l| l.holds.moments(r).len())])
            .collect();
        Search {
            problem,
            layout,
            limit,
            loads: vec![0; layout.ranks],
            params: vec![0; layout.ranks],
            held,
            current: vec![0],
            best_value: u64::MAX,
            best: None,
            nodes: 0,
            budget,
            first_only: false,
        }
    }

    /// Rank `r`'s parameters and per-moment holds with stage `s` on layers `a..b` placed too.
    fn with_stage(
        &self,
        l: &MemoryLimit,
        r: usize,
        s: usize,
        a: usize,
        b: usize,
    ) -> (u64, Vec<f64>) {
        let local = l.holds.rank_stages(r).iter().position(|&x| x == s);
        let f = self.problem.footprint(s, a, b);
        let held = (self.held[r].iter().zip(l.holds.moments(r)))
            .map(|(h, m)| h + local.map_or(0.0, |i| held(&m[i], &f)))
            .collect();
        let p = self.problem.parameter_sum(a, b);
        (self.params[r].saturating_add(p), held)
    }

    fn lower_bound(&self, end: usize) -> u64 {
        let p = self.layout.ranks as u64;
        let total: u64 =
            self.loads.iter().sum::<u64>() + self.problem.compute(end, self.problem.layers());
        let avg = total.div_ceil(p);
        avg.max(self.loads.iter().copied().max().unwrap_or(0))
    }

    /// Places stage `s` starting at layer `a`; returns `false` when the budget ran out.
    fn visit(&mut self, s: usize, a: usize) -> bool {
        let n = self.problem.layers();
        let stages = self.layout.stages();
        if s == stages {
            let value = self.loads.iter().copied().max().unwrap_or(0);
            if value < self.best_value {
                self.best_value = value;
                self.best = Some(self.current.clone());
            }
            return true;
        }
        if self.first_only && self.best.is_some() {
            return true;
        }
        let r = self.layout.rank_of(s);
        let last_end = n - (stages - s - 1);
        let range: Vec<usize> = if s + 1 == stages {
            vec![n]
        } else {
            ((a + 1)..=last_end).collect()
        };
        for b in range {
            self.nodes += 1;
            if self.nodes > self.budget {
                return false;
            }
            if self.loads[r] + self.problem.compute(a, b) >= self.best_value {
                break; // compute only grows with b, transfers are >= 0
            }
            let mem = self.limit.map(|l| self.with_stage(l, r, s, a, b));
            if let (Some((p, h)), Some(l)) = (&mem, self.limit) {
                let peak = h.iter().copied().fold(0.0, f64::max).round() as u64;
                if p.saturating_add(peak) > l.bytes_per_rank {
                    break; // memory only grows with b
                }
            }
            let c = self.problem.stage_cost(self.layout, s, a, b);
            if self.loads[r] + c >= self.best_value {
                continue;
            }
            let old_load = self.loads[r];
            self.loads[r] += c;
            let old_mem = mem.map(|(p, mut h)| {
                std::mem::swap(&mut self.held[r], &mut h);
                (std::mem::replace(&mut self.params[r], p), h)
            });
            let mut finished = true;
            if self.lower_bound(b) < self.best_value {
                self.current.push(b);
                finished = self.visit(s + 1, b);
                self.current.pop();
            }
            self.loads[r] = old_load;
            if let Some((p, h)) = old_mem {
                (self.params[r], self.held[r]) = (p, h);
            }
            if !finished {
                return false;
            }
        }
        true
    }
}

/// Exact (within `budget` nodes) minimum of the largest rank load for any layout.
pub(super) fn branch_and_bound(
    problem: &Problem,
    layout: &Layout,
    limit: Option<&MemoryLimit>,
    budget: u64,
) -> Result<Partition, PartitionError> {
    // Seed: the best split stage by stage, kept only if it fits the memory limit.
    let seed = chain_optimum(problem, layout, None)?;
    let seed_fits = match limit {
        None => true,
        Some(l) => problem
            .rank_memory(layout, &seed, &l.holds)?
            .iter()
            .all(|&m| m <= l.bytes_per_rank),
    };
    let seed_value = problem.evaluate(layout, &seed)?.bottleneck;
    let mut search = Search::new(problem, layout, limit, budget);
    if seed_fits {
        search.best_value = seed_value.saturating_add(1);
    }
    let finished = search.visit(0, 0);
    let chosen = match (search.best, seed_fits) {
        (Some(b), _) => b,
        (None, true) => seed,
        (None, false) => {
            return Err(match limit {
                Some(l) if finished => PartitionError::MemoryInfeasible {
                    stages: layout.stages(),
                    limit: l.bytes_per_rank,
                    needed: min_rank_memory(problem, layout, l, budget),
                },
                _ => PartitionError::SearchBudget { nodes: budget },
            })
        }
    };
    let mut p = problem.evaluate(layout, &chosen)?;
    p.exact = finished;
    Ok(p)
}

/// Whether some split fits `limit` (`None` when the budget ran out before deciding).
fn fits(problem: &Problem, layout: &Layout, limit: &MemoryLimit, budget: u64) -> Option<bool> {
    let mut search = Search::new(problem, layout, Some(limit), budget);
    search.first_only = true;
    let finished = search.visit(0, 0);
    if search.best.is_some() {
        Some(true)
    } else if finished {
        Some(false)
    } else {
        None
    }
}

/// The smallest per-rank memory limit any split fits: bisection on the limit between the per-stage
/// bound (every rank holds at least its largest stage) and the memory of the seed split. Returns the
/// lower end reached if the budget runs out, so it is never more than the true need.
pub(super) fn min_rank_memory(
    problem: &Problem,
    layout: &Layout,
    limit: &MemoryLimit,
    budget: u64,
) -> u64 {
    let mut lo = min_peak_memory(problem, limit);
    let hi_split = match chain_optimum(problem, layout, None) {
        Ok(b) => b,
        Err(_) => return lo,
    };
    let mut hi = match problem.rank_memory(layout, &hi_split, &limit.holds) {
        Ok(m) => m.into_iter().max().unwrap_or(0),
        Err(_) => return lo,
    };
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let probe = MemoryLimit {
            bytes_per_rank: mid,
            holds: limit.holds.clone(),
        };
        match fits(problem, layout, &probe, budget) {
            Some(true) => hi = mid,
            Some(false) => lo = mid + 1,
            None => return lo,
        }
    }
    lo
}
