//! The request checked and turned into what the phases read: per-stage times, transfer times per
//! boundary, footprints and each rank's activation budget.

use crate::cost::{CostModel, Recompute, StageCost};
use crate::schedule::deps::Footprint;
use crate::schedule::{Action, Op, Params, Placement, MAX_PAIRS};

use super::{AutoError, AutoRequest, MemoryLimit};

/// Slack when comparing memory against a budget (footprints are sums of fractions).
pub(crate) const MEMORY_EPS: f64 = 1e-9;

/// The three ops the solver places (it always splits the backward into `I` and `W`).
pub(crate) const OPS: [Op; 3] = [Op::F, Op::I, Op::W];

/// One instance: everything the constructive, improvement and exact phases need.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    /// `P`.
    pub(crate) p: usize,
    /// `V`.
    pub(crate) v: usize,
    /// `M`.
    pub(crate) m: usize,
    /// `S = P * V`.
    pub(crate) s: usize,
    /// Where the stages sit.
    pub(crate) placement: Placement,
    /// Per stage, the time of F, I, W.
    pub(crate) dur: Vec<[f64; 3]>,
    /// Per stage `s`, the transfer time from `s` to `s + 1` (0 on the same rank or for the last).
    pub(crate) comm: Vec<f64>,
    /// Per stage, its rank.
    pub(crate) rank_of: Vec<usize>,
    /// Per rank, its stages in increasing order.
    pub(crate) stages_of: Vec<Vec<usize>>,
    /// Per stage, what F allocates and I releases, in the limit's unit.
    pub(crate) foot: Vec<Footprint>,
    /// Per rank, the activation memory it may hold (infinite without a limit).
    pub(crate) budget: Vec<f64>,
    /// The costs the simulator scores with (footprints in the limit's unit).
    pub(crate) scoring: CostModel,
    /// Whether memory is counted in microbatches in flight rather than bytes.
    pub(crate) unit: bool,
}

impl Instance {
    /// Checks `req` and builds its instance.
    pub(crate) fn new(req: &AutoRequest) -> Result<Self, AutoError> {
        check_shape(req)?;
        let (p, v, m) = (req.ranks, req.chunks, req.microbatches);
        let s = p * v;
        if req.costs.stages.len() != s {
            return Err(AutoError::Stages {
                costs: req.costs.stages.len(),
                stages: s,
            });
        }
        req.costs.check()?;
        if !(req.time_budget.is_finite() && req.time_budget >= 0.0) {
            return Err(AutoError::BadBudget {
                value: req.time_budget,
            });
        }
        let rank_of: Vec<usize> = (0..s).map(|x| req.placement.rank_of(x, p)).collect();
        let mut stages_of = vec![Vec::new(); p];
        for (x, &r) in rank_of.iter().enumerate() {
            stages_of[r].push(x);
        }
        let comm = (0..s)
            .map(|x| {
                if x + 1 < s && rank_of[x] != rank_of[x + 1] {
                    req.costs.boundary_time(x)
                } else {
                    0.0
                }
            })
            .collect();
        let dur = req
            .costs
            .stages
            .iter()
            .map(|c| [c.forward, c.time(Op::I), c.time(Op::W)])
            .collect();
        let mut inst = Instance {
            p,
            v,
            m,
            s,
            placement: req.placement,
            dur,
            comm,
            rank_of,
            stages_of,
            foot: Vec::new(),
            budget: vec![f64::INFINITY; p],
            scoring: req.costs.clone(),
            unit: !matches!(req.limit, Some(MemoryLimit::Bytes(_))),
        };
        inst.set_memory(req)?;
        Ok(inst)
    }

    /// Footprints, the scoring costs' activation sizes and the budgets, from the limit.
    fn set_memory(&mut self, req: &AutoRequest) -> Result<(), AutoError> {
        if let Some(limit) = req.limit {
            let value = limit.value();
            if !(value.is_finite() && value > 0.0) {
                return Err(AutoError::BadLimit { value });
            }
        }
        if self.unit {
            // A count of microbatches in flight: a fully recomputing stage's microbatch is in
            // flight all the same (it rebuilds nothing in this unit; its backward still takes
            // longer). A selective stage keeps its share of the unit: what it drops after F is
            // the same share of its stash as in bytes (and stays within it, as the cost model
            // checks); a stage not run selectively declares nothing in this unit.
            let unit = 1.0 / self.v as f64;
            for st in &mut self.scoring.stages {
                st.selective_bytes = match st.recompute {
                    Recompute::Selective if st.activation_bytes > 0.0 => {
                        (st.selective_bytes / st.activation_bytes).min(1.0) * unit
                    }
                    _ => 0.0,
                };
                st.activation_bytes = unit;
                st.released_at_input = 0.0;
                st.input_bytes = st.activation_bytes;
            }
        } else if req.costs.stages.iter().all(|c| c.activation_bytes == 0.0) {
            return Err(AutoError::NoActivationSizes);
        }
        self.foot = self
            .scoring
            .stages
            .iter()
            .map(StageCost::footprint)
            .collect();
        let mut params = vec![0.0; self.p];
        for (x, c) in req.costs.stages.iter().enumerate() {
            params[self.rank_of[x]] += c.parameter_bytes;
        }
        match req.limit {
            None => {}
            Some(MemoryLimit::InFlight(n)) => self.budget = vec![n; self.p],
            Some(MemoryLimit::Bytes(b)) => self.budget = params.iter().map(|q| b - q).collect(),
        }
        // A rank never holds more than every microbatch through all its chunks at once, so a limit
        // at or above that does not bind: it is read as that amount, which makes every such limit
        // the same request (the same run, the same schedule). Without it the phases that size
        // their settings from the budget (the V-shape ladder, warm-up depths, admission slots)
        // ran differently at 2P than at P where M = P, and the larger limit could end worse. No
        // limit at all stays unlimited (its bound and phases differ from a limit's).
        for r in 0..self.p {
            let all = self.m as f64 * self.one_microbatch(r);
            if all > 0.0 && self.budget[r].is_finite() && self.budget[r] > all {
                self.budget[r] = all;
            }
        }
        for (r, &param) in params.iter().enumerate() {
            let needed = self.one_microbatch(r);
            if needed > self.budget[r] + MEMORY_EPS * needed.max(1.0) {
                let (needed, limit, unit) = if self.unit {
                    (needed, self.budget[r], "microbatches in flight")
                } else {
                    (needed + param, self.budget[r] + param, "bytes")
                };
                return Err(AutoError::LimitTooLow {
                    rank: r,
                    needed,
                    limit,
                    unit,
                });
            }
        }
        Ok(())
    }

    /// What rank `r` holds while one microbatch passes through all its chunks (the first chunk's
    /// activations wait for the backward, which comes after the last chunk's forward).
    pub(crate) fn one_microbatch(&self, r: usize) -> f64 {
        self.stages_of[r].iter().map(|&x| self.foot[x].bytes).sum()
    }

    /// Number of actions (`3 * S * M`).
    pub(crate) fn actions(&self) -> usize {
        3 * self.s * self.m
    }

    /// Dense index of `(op, stage, microbatch)`; `op` is 0 (F), 1 (I) or 2 (W).
    #[inline]
    pub(crate) fn id(&self, op: usize, stage: usize, k: usize) -> usize {
        (stage * self.m + k) * 3 + op
    }

    /// The action of a dense index.
    #[inline]
    pub(crate) fn action(&self, id: usize) -> Action {
        let op = id % 3;
        let sk = id / 3;
        Action::new(OPS[op], sk / self.m, sk % self.m)
    }

    /// What `op` leaves its rank holding more (or less) once it has ended, as the simulator counts
    /// it: `F` allocates what its stage keeps (its input only under full recomputation), `I`
    /// allocates the rebuilt rest at its start and releases its part at its end, `W` releases the
    /// remainder.
    #[inline]
    pub(crate) fn delta(&self, op: usize, stage: usize) -> f64 {
        self.delta_of(OPS[op], stage)
    }

    /// [`Instance::delta`] of any op (`B` too: it allocates what it rebuilds, releases all).
    #[inline]
    pub(crate) fn delta_of(&self, op: Op, stage: usize) -> f64 {
        let f = &self.foot[stage];
        f.allocated_by(op) - f.released_by(op)
    }

    /// The room `op` on `stage` needs free when it starts: for `F` the most one microbatch of the
    /// stage ever holds (so its own backward can rebuild), for `I` what it rebuilds (0 without
    /// recomputation), nothing for `W`. The constructive phases check it before placing an op.
    #[inline]
    pub(crate) fn room(&self, op: usize, stage: usize) -> f64 {
        let f = &self.foot[stage];
        match op {
            0 => f.bytes,
            _ => f.allocated_by(OPS[op]),
        }
    }

    /// Total work of rank `r` (`M * sum(F + I + W)` over its stages).
    pub(crate) fn work(&self, r: usize) -> f64 {
        self.stages_of[r]
            .iter()
            .map(|&x| self.dur[x].iter().sum::<f64>())
            .sum::<f64>()
            * self.m as f64
    }
}

/// `P`, `V`, `M` and the placement: the checks every generator makes, plus `vshape` needs `V = 2`.
fn check_shape(req: &AutoRequest) -> Result<(), AutoError> {
    let params = Params::new(req.ranks, req.microbatches).with_chunks(req.chunks);
    let allowed = match req.placement {
        Placement::Looped => 1..=usize::MAX,
        Placement::Vshape => 2..=2,
    };
    params.checked("auto", 1, allowed)?;
    if 3 * req.ranks * req.chunks * req.microbatches > MAX_PAIRS {
        return Err(AutoError::Shape(format!(
            "auto: P*V*M = {} is too large to search; use fewer ranks, chunks or microbatches",
            req.ranks * req.chunks * req.microbatches
        )));
    }
    Ok(())
}
