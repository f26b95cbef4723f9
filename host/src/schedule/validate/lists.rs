//! Steps 2 and 3 of validation: every item where it sits, in list order, then completeness.

use super::super::deps::{self, Edge, Flow, Footprint, InFlight, Need};
use super::super::format::context_grid;
use super::super::{Action, Comm, Item, Op, ParamAction, ParamOp, Schedule, ScheduleError};

/// What one (stage, microbatch) has seen so far, as bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen(u16);

impl Seen {
    const F: u16 = 1;
    const B: u16 = 2;
    const I: u16 = 4;
    const W: u16 = 8;
    /// `SEND_F` from this stage, `RECV_F` into it, `SEND_B` from it, `RECV_B` into it.
    const SEND_F: u16 = 16;
    const RECV_F: u16 = 32;
    const SEND_B: u16 = 64;
    const RECV_B: u16 = 128;
    /// `WAIT_SEND_F` / `WAIT_SEND_B` of this stage's sends.
    const WAIT_SEND_F: u16 = 256;
    const WAIT_SEND_B: u16 = 512;

    fn op(op: Op) -> u16 {
        match op {
            Op::F => Self::F,
            Op::B => Self::B,
            Op::I => Self::I,
            Op::W => Self::W,
        }
    }

    fn comm(c: &Comm) -> u16 {
        use super::super::CommOp::*;
        match c.op {
            SendF => Self::SEND_F,
            RecvF => Self::RECV_F,
            SendB => Self::SEND_B,
            RecvB => Self::RECV_B,
            WaitSendF => Self::WAIT_SEND_F,
            WaitSendB => Self::WAIT_SEND_B,
        }
    }

    fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }

    /// `F` and `B`, or `F`, `I` and `W`: what [`Lists::missing`] accepts without transfers.
    fn complete(self) -> bool {
        let compute = self.0 & (Self::F | Self::B | Self::I | Self::W);
        compute == Self::F | Self::B || compute == Self::F | Self::I | Self::W
    }
}

/// Where a stage stands with FSDP's `UNSHARD` / `RESHARD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shard {
    /// The stage has no `UNSHARD` / `RESHARD` anywhere: its parameters are always there.
    Unused,
    /// Sharded: it must be unsharded before it computes.
    Sharded,
    /// Unsharded: it may compute.
    Unsharded,
}

/// The state of the list checks.
struct Lists<'s> {
    s: &'s Schedule,
    lowered: bool,
    /// `P * V`.
    stages: usize,
    /// Each stage's rank (the placement, computed once: it is asked for every item).
    home: Vec<usize>,
    seen: Vec<Seen>,
    /// Per stage, the `W`/`B` seen so far (for `REDUCE_GRAD`).
    weight_grads: Vec<usize>,
    reduced: Vec<bool>,
    shard: Vec<Shard>,
    /// The schedule has `WAIT_SEND_*` items: then every send needs its wait (PyTorch 2.15's rule);
    /// without any, sends retire at the end of the step (the earlier PyTorch runtime's).
    waited_sends: bool,
    /// The schedule has `WAIT_REDUCE_GRAD` items: then every `REDUCE_GRAD` starts a reduction that
    /// its wait ends, at most one pending per rank; without any, `REDUCE_GRAD` is the whole
    /// reduction.
    waited_reductions: bool,
    /// On the rank being checked: its sends not yet waited for, with their positions.
    pending_sends: Vec<(Comm, usize)>,
    /// On the rank being checked: the pending reduction's stage and position.
    pending_reduction: Option<(usize, usize)>,
}

/// Per-item checks in list order, then completeness; returns the peak in-flight per rank.
/// `lowered`: the schedule carries transfers ([`super::has_transfers`]).
pub(super) fn check_lists(s: &Schedule, lowered: bool) -> Result<Vec<usize>, ScheduleError> {
    let stages = s.stages();
    let mut shard = vec![Shard::Unused; stages];
    for p in s.actions.iter().flatten().filter_map(param) {
        if matches!(p.op, ParamOp::Unshard | ParamOp::Reshard) && p.stage < stages {
            shard[p.stage] = Shard::Sharded;
        }
    }
    let mut st = Lists::new(s, lowered, shard);
    for it in s.actions.iter().flatten() {
        match it {
            Item::Comm(c) if c.op.is_wait() => st.waited_sends = true,
            Item::Param(p) if p.op == ParamOp::WaitReduceGrad => st.waited_reductions = true,
            _ => {}
        }
    }
    let Pass::Done { peak, .. } = st.pass(false)? else {
        unreachable!("a full pass never stops early")
    };
    st.check_complete()?;
    Ok(peak)
}

/// [`check_lists`] in one pass over the lists, for the common schedule: compute items only, at
/// least `pairs` compute actions, and valid. `None` for anything else (a transfer or parameter
/// operation, too few actions, any problem): the caller then runs the full checks, which find the
/// same answer or the exact error. Saves the passes that decide beforehand whether the schedule
/// carries transfers or parameter operations and how many actions it has (each a full read of the
/// lists, as long as the checks themselves on a large schedule).
pub(super) fn check_compute_only(s: &Schedule, pairs: usize) -> Option<Vec<usize>> {
    let mut st = Lists::new(s, false, vec![Shard::Unused; s.stages()]);
    match st.pass(true) {
        Ok(Pass::Done { peak, actions }) if actions >= pairs => {
            st.check_complete().ok()?;
            Some(peak)
        }
        _ => None,
    }
}

/// How a pass over the lists ended.
enum Pass {
    /// Every item checked: the peak in-flight per rank and the number of compute actions.
    Done { peak: Vec<usize>, actions: usize },
    /// A compute-only pass met an item that needs the full rules.
    Stopped,
}

fn param(it: &Item) -> Option<ParamAction> {
    match it {
        Item::Param(p) => Some(*p),
        _ => None,
    }
}

impl<'s> Lists<'s> {
    fn new(s: &'s Schedule, lowered: bool, shard: Vec<Shard>) -> Self {
        let stages = s.stages();
        Lists {
            s,
            lowered,
            stages,
            home: (0..stages).map(|st| s.rank_of(st)).collect(),
            seen: vec![Seen::default(); stages * s.microbatches],
            weight_grads: vec![0; stages],
            reduced: vec![false; stages],
            shard,
            waited_sends: false,
            waited_reductions: false,
            pending_sends: Vec::new(),
            pending_reduction: None,
        }
    }

    /// Checks every item in list order; with `compute_only`, stops at the first transfer or
    /// parameter operation.
    fn pass(&mut self, compute_only: bool) -> Result<Pass, ScheduleError> {
        let s = self.s;
        let mut memory = InFlight::new(s.ranks);
        let mut actions = 0;
        for (rank, list) in s.actions.iter().enumerate() {
            for (pos, item) in list.iter().enumerate() {
                actions += match item {
                    Item::One(_) => 1,
                    Item::Overlap { .. } => 2,
                    Item::Comm(_) | Item::Param(_) if compute_only => return Ok(Pass::Stopped),
                    Item::Comm(_) | Item::Param(_) => 0,
                };
                self.check_item(rank, pos, item)
                    .map_err(|problem| bad_action(s, rank, pos, problem))?;
                for a in item.actions() {
                    memory.start(rank, a, &Footprint::UNIT);
                }
                for a in item.actions() {
                    memory.end(rank, a, &Footprint::UNIT);
                }
            }
            self.check_retired(rank)?;
        }
        let peak = memory.peak().iter().map(|&p| p as usize).collect();
        Ok(Pass::Done { peak, actions })
    }

    fn key(&self, stage: usize, microbatch: usize) -> usize {
        stage * self.s.microbatches + microbatch
    }

    fn check_item(&mut self, rank: usize, pos: usize, item: &Item) -> Result<(), String> {
        match item {
            Item::One(a) => self.check_action(rank, *a),
            Item::Overlap { forward, backward } => {
                if (forward.stage, forward.microbatch) == (backward.stage, backward.microbatch) {
                    return Err(
                        "an overlapped pair cannot hold the forward and the backward of the same \
                         (stage, microbatch); put the forward in an earlier position"
                            .into(),
                    );
                }
                self.check_action(rank, *forward)?;
                self.check_action(rank, *backward)
            }
            Item::Comm(c) => self.check_comm(rank, pos, c),
            Item::Param(p) => self.check_param(rank, pos, p),
        }
    }

    /// At the end of `rank`'s list: every send has had its wait (where the schedule waits for
    /// sends) and no reduction is pending.
    fn check_retired(&mut self, rank: usize) -> Result<(), ScheduleError> {
        let s = self.s;
        if let Some((send, pos)) = self.pending_sends.first().copied() {
            let wait = Comm {
                op: send.op.partner().unwrap_or(send.op),
                ..send
            };
            let problem = format!(
                "`{send}` has no matching `{wait}`: this schedule waits for its sends, so every \
                 send needs one wait after it on its rank; add `{wait}` after the point where rank \
                 {} posts the matching receive",
                Edge::of(send, self.stages).map_or(rank, |e| s.rank_of(e.to()))
            );
            return Err(bad_action(s, rank, pos, problem));
        }
        if let Some((stage, pos)) = self.pending_reduction {
            let problem = format!(
                "`{stage}REDUCE_GRAD` has no matching `{stage}WAIT_REDUCE_GRAD`; add it after it \
                 on rank {rank}"
            );
            return Err(bad_action(s, rank, pos, problem));
        }
        self.pending_sends.clear();
        Ok(())
    }

    /// `stage` and `microbatch` in range and the stage on `rank`.
    fn check_place(
        &self,
        rank: usize,
        stage: usize,
        microbatch: Option<usize>,
    ) -> Result<(), String> {
        let s = self.s;
        let stages = self.stages;
        if stage >= stages {
            return Err(format!(
                "stage {stage} is out of range: P*V = {stages} stages, so stages are 0..={}",
                stages - 1
            ));
        }
        if let Some(k) = microbatch.filter(|&k| k >= s.microbatches) {
            return Err(format!(
                "microbatch {k} is out of range: M = {}, so microbatches are 0..={}",
                s.microbatches,
                s.microbatches - 1
            ));
        }
        let home = self.home[stage];
        if home != rank {
            return Err(format!(
                "stage {stage} belongs on rank {home} under {} placement (P = {}); move it to rank \
                 {home}'s list",
                s.placement, s.ranks
            ));
        }
        Ok(())
    }

    /// One compute action against the header, its placement, and what its rank has already run.
    fn check_action(&mut self, rank: usize, a: Action) -> Result<(), String> {
        self.check_place(rank, a.stage, Some(a.microbatch))?;
        let key = self.key(a.stage, a.microbatch);
        let st = self.seen[key];
        let (f, g) = (a.stage, a.microbatch);
        if st.has(Seen::op(a.op)) {
            return Err(format!(
                "duplicate: `{a}` already appears earlier in rank {rank}'s list; keep only one"
            ));
        }
        let split = st.has(Seen::I) || st.has(Seen::W);
        match a.op {
            Op::B if split => {
                return Err(format!(
                "stage {f} microbatch {g} already has a split backward (I/W); use either B or I and W"
            ))
            }
            Op::I | Op::W if st.has(Seen::B) => {
                return Err(format!(
                "stage {f} microbatch {g} already has a full backward (B); use either B or I and W"
            ))
            }
            _ => {}
        }
        for need in deps::needs(a, self.stages) {
            self.check_need(a, need, st)?;
        }
        if self.shard[a.stage] == Shard::Sharded {
            return Err(format!(
                "stage {f} computes while sharded; add `{f}UNSHARD` before it (or remove its \
                 RESHARD)"
            ));
        }
        self.seen[key].0 |= Seen::op(a.op);
        if matches!(a.op, Op::W | Op::B) {
            self.weight_grads[a.stage] += 1;
        }
        Ok(())
    }

    /// A need of `a` that must sit earlier in the same rank's list.
    fn check_need(&self, a: Action, need: Need, st: Seen) -> Result<(), String> {
        let (f, g) = (a.stage, a.microbatch);
        match need {
            Need::Stash(x) if x.op == Op::F && !st.has(Seen::F) => Err(format!(
                "the backward runs before its forward `{f}F{g}`; move `{f}F{g}` to an earlier position"
            )),
            Need::Stash(x) if x.op == Op::I && !st.has(Seen::I) => Err(format!(
                "the weight backward runs before its input backward `{f}I{g}`; move `{f}I{g}` earlier"
            )),
            Need::Data(e) if self.lowered && self.crosses(&e) && !st.has(recv_bit(&e)) => {
                Err(format!(
                    "`{a}` uses data from stage {} on rank {}, but `{}` is not before it; this \
                     schedule has transfers, so add `{}` before `{a}`",
                    e.from,
                    self.s.rank_of(e.from),
                    e.recv(),
                    e.recv()
                ))
            }
            _ => Ok(()),
        }
    }

    fn crosses(&self, e: &Edge) -> bool {
        self.home[e.from] != self.home[e.to()]
    }

    fn check_comm(&mut self, rank: usize, pos: usize, c: &Comm) -> Result<(), String> {
        let stages = self.stages;
        self.check_place(rank, c.stage, Some(c.microbatch))?;
        let e = Edge::of(*c, stages).ok_or_else(|| {
            format!("`{c}` names no boundary between stages (there are {stages}); remove it")
        })?;
        if !self.crosses(&e) {
            return Err(format!(
                "stages {} and {} both sit on rank {}: data between them needs no transfer; remove \
                 `{c}`",
                e.from,
                e.to(),
                self.s.rank_of(e.from)
            ));
        }
        let key = self.key(c.stage, c.microbatch);
        let st = self.seen[key];
        if st.has(Seen::comm(c)) {
            return Err(format!(
                "duplicate: `{c}` already appears earlier; keep only one"
            ));
        }
        if c.op.is_send() {
            let produced = match e.flow {
                Flow::Activation => st.has(Seen::F),
                Flow::Gradient => st.has(Seen::I) || st.has(Seen::B),
            };
            if !produced {
                let p = e.producer();
                return Err(format!(
                    "`{c}` sends before `{p}` computed the data; move it after `{p}`"
                ));
            }
            if self.waited_sends {
                self.pending_sends.push((*c, pos));
            }
        }
        if c.op.is_wait() {
            let send = e.send();
            let Some(at) = self.pending_sends.iter().position(|(p, _)| *p == send) else {
                return Err(format!(
                    "`{c}` waits for `{send}`, which is not before it on rank {rank}; move the \
                     wait after `{send}`"
                ));
            };
            self.pending_sends.swap_remove(at);
        }
        self.seen[key].0 |= Seen::comm(c);
        Ok(())
    }

    fn check_param(&mut self, rank: usize, pos: usize, p: &ParamAction) -> Result<(), String> {
        self.check_place(rank, p.stage, None)?;
        let s = p.stage;
        match p.op {
            ParamOp::ReduceGrad if self.waited_reductions => {
                if let Some((other, _)) = self.pending_reduction {
                    return Err(format!(
                        "stage {s}'s reduction would start while stage {other}'s is pending (at \
                         most one per rank); add `{other}WAIT_REDUCE_GRAD` before it"
                    ));
                }
                self.check_reduce(p)?;
                self.pending_reduction = Some((s, pos));
                Ok(())
            }
            ParamOp::WaitReduceGrad => match self.pending_reduction {
                Some((pending, _)) if pending == s => {
                    self.pending_reduction = None;
                    Ok(())
                }
                Some((pending, _)) => Err(format!(
                    "stage {pending}'s reduction is the one pending on rank {rank}, not stage \
                     {s}'s; wait for `{pending}WAIT_REDUCE_GRAD` here or start `{s}REDUCE_GRAD` \
                     before this wait"
                )),
                None => Err(format!(
                    "no reduction of stage {s} is pending here; add `{s}REDUCE_GRAD` before this \
                     `{p}` (or remove it)"
                )),
            },
            ParamOp::ReduceGrad => self.check_reduce(p),
            ParamOp::Unshard if self.shard[s] == Shard::Unsharded => Err(format!(
                "stage {s} is already unsharded; remove this `{p}` or add `{s}RESHARD` before it"
            )),
            ParamOp::Unshard => {
                self.shard[s] = Shard::Unsharded;
                Ok(())
            }
            ParamOp::Reshard if self.shard[s] != Shard::Unsharded => Err(format!(
                "stage {s} is not unsharded here; add `{s}UNSHARD` before this `{p}` or remove it"
            )),
            ParamOp::Reshard => {
                self.shard[s] = Shard::Sharded;
                Ok(())
            }
        }
    }

    /// A `REDUCE_GRAD`: once per stage, after the stage's last `W`/`B`.
    fn check_reduce(&mut self, p: &ParamAction) -> Result<(), String> {
        let s = p.stage;
        if self.reduced[s] {
            return Err(format!(
                "duplicate: `{p}` already appears earlier; keep only one"
            ));
        }
        if self.weight_grads[s] < self.s.microbatches {
            return Err(format!(
                "`{p}` reduces the gradients of stage {s} after {} of its {} weight backwards \
                 (W or B); move it after the last one",
                self.weight_grads[s], self.s.microbatches
            ));
        }
        self.reduced[s] = true;
        Ok(())
    }

    /// Every (stage, microbatch) has `F` and `B`, or `F`, `I` and `W`; with transfers, every crossing
    /// has both ends.
    fn check_complete(&self) -> Result<(), ScheduleError> {
        let m = self.s.microbatches;
        for (key, st) in self.seen.iter().enumerate() {
            if !self.lowered && st.complete() {
                // The common case, decided from the bits alone.
                continue;
            }
            let (stage, microbatch) = (key / m, key % m);
            if let Some(problem) = self.missing(stage, microbatch, *st) {
                return Err(ScheduleError::Incomplete {
                    stage,
                    microbatch,
                    problem,
                });
            }
        }
        Ok(())
    }

    fn missing(&self, stage: usize, microbatch: usize, st: Seen) -> Option<String> {
        let rank = self.s.rank_of(stage);
        let (s, k) = (stage, microbatch);
        if !st.has(Seen::F) {
            return Some(format!("no forward; add `{s}F{k}` to rank {rank}"));
        }
        if st.has(Seen::I) && !st.has(Seen::W) {
            return Some(format!(
                "`{s}I{k}` has no weight backward; add `{s}W{k}` after it on rank {rank}"
            ));
        }
        if !st.has(Seen::B) && !st.has(Seen::I) {
            return Some(format!(
                "no backward; add `{s}B{k}` (or `{s}I{k}` and `{s}W{k}`) to rank {rank}"
            ));
        }
        if !self.lowered {
            return None;
        }
        let outputs = [Op::F, Op::I].map(|op| deps::output(Action::new(op, s, k), self.s.stages()));
        for e in outputs.into_iter().flatten().filter(|e| self.crosses(e)) {
            let (send, recv) = (e.send(), e.recv());
            if !st.has(Seen::comm(&send)) {
                return Some(format!(
                    "no `{send}`; add it to rank {rank} after `{}`",
                    e.producer()
                ));
            }
            let to = self.seen[self.key(e.to(), k)];
            if !to.has(Seen::comm(&recv)) {
                return Some(format!(
                    "`{send}` has no receive; add `{recv}` to rank {}",
                    self.s.rank_of(e.to())
                ));
            }
        }
        None
    }
}

/// The bit of the receive of `e` on its consuming stage.
fn recv_bit(e: &Edge) -> u16 {
    Seen::comm(&e.recv())
}

/// Builds a [`ScheduleError::BadAction`] with the grid around the action.
fn bad_action(s: &Schedule, rank: usize, position: usize, problem: String) -> ScheduleError {
    ScheduleError::BadAction {
        rank,
        position,
        item: s.actions[rank][position].to_string(),
        problem,
        grid: context_grid(s, &[(rank, position)]),
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::{families, Params};
    use super::*;

    /// The one-pass check accepts exactly what the full checks accept on compute-only schedules,
    /// with the same peaks, and leaves the rest (problems, transfers) to them.
    #[test]
    fn one_pass_agrees_with_the_full_checks() {
        for family in families::FAMILIES {
            let params = Params::new(4, 8);
            let Ok(s) = families::generate(family.name, &params) else {
                continue;
            };
            let pairs = s.stages() * s.microbatches;
            let full = check_lists(&s, false).unwrap();
            assert_eq!(check_compute_only(&s, pairs), Some(full), "{}", family.name);
            // Too few actions for the header, a missing action, a transfer: not decided here.
            assert_eq!(check_compute_only(&s, s.action_count() + 1), None);
            let mut short = s.clone();
            short.actions[0].pop();
            assert!(check_lists(&short, false).is_err());
            assert_eq!(check_compute_only(&short, 1), None);
            let lowered = crate::schedule::lower::lower(&s).unwrap();
            assert_eq!(check_compute_only(&lowered, 1), None);
        }
    }
}
