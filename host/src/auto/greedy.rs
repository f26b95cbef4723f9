//! The zero-bubble authors' one-pass greedy heuristic (Qi et al., arXiv:2401.10241, section 3.1),
//! re-derived from its description (written anew) and used as a seed family of `auto` on `V = 1`.
//!
//! It builds the schedule wave by wave. Wave 0 runs microbatch 0's forward down the pipeline, then
//! lets each stage (from the last up) take as many extra forwards as fit, in memory and in the time
//! before microbatch 0's gradient comes back, with strictly fewer extra forwards on each deeper
//! stage, then runs microbatch 0's `I` back up. Every later wave `i` gives each stage at most one
//! more forward and then runs `I` of microbatch `i` back up; before each `F` or `I` a stage fills
//! the wait for its input with `W`s (those that fit in the wait, then possibly one that overruns
//! it), and runs `W`s first when memory needs them. The per-stage idle time so far ("bubble") is
//! tracked so a stage may accept a wait when it is still below the worst stage's bubble (the span
//! objective only sees the worst stage).
//!
//! Three switches give the eight variants the authors try ([`Flags::all`]): whether warm-up
//! forwards may leave a wait before the first `I`, whether a stage that is two forwards ahead of
//! the next one may skip its forward to run `I` sooner, and whether a tolerable wait is still
//! filled with a `W`.

use crate::schedule::Action;

use super::instance::{Instance, MEMORY_EPS};

/// The three switches of the heuristic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flags {
    /// Warm-up forwards must end before the first gradient arrives (true) or may start until then.
    pub(crate) bubble_before_first_i: bool,
    /// A stage two forwards ahead of the next may skip a forward to run `I` sooner.
    pub(crate) prioritize_i: bool,
    /// A wait the stage could afford is still filled with one `W` that overruns it.
    pub(crate) fill_tolerable: bool,
}

impl Flags {
    /// The eight combinations.
    pub(crate) fn all() -> Vec<Flags> {
        let mut out = Vec::with_capacity(8);
        for bubble_before_first_i in [true, false] {
            for prioritize_i in [true, false] {
                for fill_tolerable in [true, false] {
                    out.push(Flags {
                        bubble_before_first_i,
                        prioritize_i,
                        fill_tolerable,
                    });
                }
            }
        }
        out
    }
}

/// The construction's state; with `V = 1` a stage is a rank.
struct Greedy<'a> {
    inst: &'a Instance,
    flags: Flags,
    /// End time per action (infinite until placed).
    end: Vec<f64>,
    /// Per stage, how many F, I, W are placed.
    count: Vec<[usize; 3]>,
    /// Per stage, when it is free.
    free: Vec<f64>,
    mem: Vec<f64>,
    /// Per stage, idle time after its first forward.
    bubble: Vec<f64>,
    orders: Vec<Vec<Action>>,
}

/// Per-rank lists from the heuristic with `flags`; `None` when the instance is not `V = 1`, or
/// when memory cannot be met this way.
pub(crate) fn build(inst: &Instance, flags: Flags) -> Option<Vec<Vec<Action>>> {
    let g = run(inst, flags)?;
    let mut orders = vec![Vec::new(); inst.p];
    for (j, list) in g.orders.into_iter().enumerate() {
        orders[inst.rank_of[j]] = list;
    }
    Some(orders)
}

/// The whole construction (see [`build`]).
fn run(inst: &Instance, flags: Flags) -> Option<Greedy<'_>> {
    if inst.v != 1 {
        return None;
    }
    let p = inst.p;
    let mut g = Greedy {
        inst,
        flags,
        end: vec![f64::INFINITY; inst.actions()],
        count: vec![[0; 3]; p],
        free: vec![0.0; p],
        mem: vec![0.0; p],
        bubble: vec![0.0; p],
        orders: (0..p).map(|_| Vec::with_capacity(3 * inst.m)).collect(),
    };
    g.first_wave()?;
    for i in 1..inst.m {
        g.wave(i)?;
    }
    for j in 0..p {
        while g.count[j][2] < g.count[j][1] {
            g.put(j, 2)?;
        }
    }
    Some(g)
}

impl Greedy<'_> {
    fn dur(&self, j: usize, op: usize) -> f64 {
        self.inst.dur[j][op]
    }

    /// When the input of stage `j`'s next `op` is there (infinite when not placed).
    fn input(&self, j: usize, op: usize) -> f64 {
        let inst = self.inst;
        let k = self.count[j][op];
        match op {
            0 if j == 0 => 0.0,
            0 => self.end[inst.id(0, j - 1, k)] + inst.comm[j - 1],
            1 => {
                let own = self.end[inst.id(0, j, k)];
                if j + 1 == inst.s {
                    own
                } else {
                    own.max(self.end[inst.id(1, j + 1, k)] + inst.comm[j])
                }
            }
            _ => self.end[inst.id(1, j, k)],
        }
    }

    /// Whether stage `j` can hold `extra` more on top of what it holds.
    fn fits(&self, j: usize, now: f64, extra: f64) -> bool {
        let need = now + extra;
        need <= self.inst.budget[j] + MEMORY_EPS * need.max(1.0)
    }

    /// Places stage `j`'s next `op` as early as its order and input allow.
    fn put(&mut self, j: usize, op: usize) -> Option<()> {
        let inst = self.inst;
        let k = self.count[j][op];
        if k >= inst.m {
            return None;
        }
        let ready = self.input(j, op);
        if ready == f64::INFINITY {
            return None;
        }
        if op < 2 && !self.fits(j, self.mem[j], inst.room(op, j)) {
            return None;
        }
        let start = self.free[j].max(ready);
        if self.count[j][0] > 0 {
            self.bubble[j] += start - self.free[j];
        }
        let id = inst.id(op, j, k);
        self.end[id] = start + self.dur(j, op);
        self.free[j] = self.end[id];
        self.mem[j] += inst.delta(op, j);
        self.count[j][op] += 1;
        self.orders[j].push(inst.action(id));
        Some(())
    }

    fn max_bubble(&self) -> f64 {
        self.bubble.iter().copied().fold(0.0, f64::max)
    }

    /// Microbatch 0 down, the warm-up forwards, microbatch 0's `I` up.
    fn first_wave(&mut self) -> Option<()> {
        let (p, m) = (self.inst.p, self.inst.m);
        for j in 0..p {
            self.put(j, 0)?;
        }
        let mut extra = vec![0usize; p];
        // When microbatch 0's gradient leaves the stage below (deeper) the one considered.
        let mut back = self.end[self.inst.id(0, p - 1, 0)] + self.dur(p - 1, 1);
        for j in (0..p.saturating_sub(1)).rev() {
            let arrive = back + self.inst.comm[j];
            let (mut mem, mut clock) = (self.mem[j], self.free[j]);
            let bytes = self.inst.foot[j].bytes;
            while self.count[j][0] + extra[j] < m && self.fits(j, mem, bytes) {
                let f = self.dur(j, 0);
                let late = if self.flags.bubble_before_first_i {
                    clock + f > arrive
                } else {
                    clock >= arrive
                };
                if late {
                    break;
                }
                mem += bytes;
                clock += f;
                extra[j] += 1;
            }
            back = clock.max(arrive) + self.dur(j, 1);
        }
        // Each deeper stage takes strictly fewer (it needs the shallower stage's forwards).
        for j in 1..p {
            while extra[j] > 0
                && extra[j] >= extra[j - 1]
                && (self.count[j][0] + extra[j] < m || extra[j] > extra[j - 1])
            {
                extra[j] -= 1;
            }
        }
        for (j, &n) in extra.iter().enumerate() {
            for _ in 0..n {
                self.put(j, 0)?;
            }
        }
        for j in (0..p).rev() {
            self.put(j, 1)?;
        }
        Some(())
    }

    /// Wave `i >= 1`: at most one forward per stage, then `I` of microbatch `i` up the pipeline.
    fn wave(&mut self, i: usize) -> Option<()> {
        let p = self.inst.p;
        let mut want: Vec<bool> = (0..p).map(|j| self.wants_forward(j)).collect();
        for j in (0..p.saturating_sub(1)).rev() {
            want[j] = want[j] && want[j + 1];
        }
        for (j, &w) in want.iter().enumerate() {
            if !w {
                continue;
            }
            let bytes = self.inst.foot[j].bytes;
            while !self.fits(j, self.mem[j], bytes) {
                if self.count[j][2] >= self.count[j][1] {
                    return None;
                }
                self.put(j, 2)?;
            }
            if j > 0 {
                let arrive = self.input(j, 0);
                self.fill(j, arrive)?;
            }
            self.put(j, 0)?;
        }
        for j in (0..p).rev() {
            if self.count[j][1] != i {
                return None;
            }
            if j + 1 < p {
                let arrive = self.input(j, 1);
                self.fill(j, arrive)?;
            }
            if j == 0 && self.count[j][0] == self.inst.m {
                while self.count[j][2] < self.count[j][1] {
                    self.put(j, 2)?;
                }
            }
            self.put(j, 1)?;
        }
        Some(())
    }

    /// Whether stage `j` runs one more forward in this wave.
    fn wants_forward(&self, j: usize) -> bool {
        let inst = self.inst;
        let c = self.count[j];
        if c[0] >= inst.m {
            return false;
        }
        if !(self.flags.prioritize_i && j + 1 < inst.p && c[0] >= self.count[j + 1][0] + 2) {
            return true;
        }
        // When the next stage, after its own next forward and backward, sends the gradient here.
        let next = self.free[j + 1] + self.dur(j + 1, 0) + self.dur(j + 1, 1) + inst.comm[j];
        let now = self.free[j];
        if now >= next {
            return false;
        }
        // The `W`s memory would need before the forward.
        let mut held = self.mem[j] + inst.foot[j].bytes;
        let (mut w_time, mut w_left) = (0.0, c[1] - c[2]);
        while !self.fits(j, held, 0.0) && w_left > 0 {
            w_time += self.dur(j, 2);
            held -= inst.foot[j].released_by(crate::schedule::Op::W);
            w_left -= 1;
        }
        if now + self.dur(j, 0) + w_time <= next {
            return true;
        }
        next - now > self.max_bubble() - self.bubble[j]
    }

    /// `W`s while the wait for an input arriving at `arrive` lasts: those that fit, then one that
    /// overruns it unless the stage can afford the wait (and the flag says leave it).
    fn fill(&mut self, j: usize, arrive: f64) -> Option<()> {
        let w = self.dur(j, 2);
        while self.count[j][2] < self.count[j][1] && self.free[j] + w <= arrive {
            self.put(j, 2)?;
        }
        if self.count[j][2] < self.count[j][1] && self.free[j] < arrive {
            let affordable = arrive - self.free[j] <= self.max_bubble() - self.bubble[j];
            if !affordable || self.flags.fill_tolerable {
                self.put(j, 2)?;
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::score::schedule_of;
    use crate::auto::{AutoRequest, MemoryLimit};
    use crate::cost::{CostModel, LinkCost, StageCost};
    use crate::schedule::validate::validate;
    use crate::sim::simulate;

    fn instance(stages: &[(f64, f64, f64)], latency: f64, limit: f64, m: usize) -> Instance {
        let link = LinkCost {
            latency,
            bandwidth: f64::INFINITY,
        };
        let mut c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), stages.len(), link);
        for (st, &(f, i, w)) in c.stages.iter_mut().zip(stages) {
            *st = StageCost::uniform(f, i, w);
        }
        let req = AutoRequest::new(stages.len(), m, c).with_limit(MemoryLimit::InFlight(limit));
        Instance::new(&req).unwrap()
    }

    /// Every variant gives a valid schedule within the limit, and the times the heuristic computed
    /// are the simulator's (the same transfer model: a delay per hop).
    #[test]
    fn every_variant_validates_and_its_times_are_the_simulators() {
        let stages = [
            (1.5, 1.4, 0.9),
            (1.0, 1.1, 0.7),
            (1.0, 1.0, 0.8),
            (1.6, 1.3, 1.0),
        ];
        for limit in [4.0, 6.0, 8.0] {
            let inst = instance(&stages, 0.1, limit, 12);
            for flags in Flags::all() {
                let orders = build(&inst, flags).unwrap();
                let s = schedule_of(&inst, "auto", &orders);
                validate(&s).unwrap();
                let sim = simulate(&s, &inst.scoring).unwrap();
                assert!(sim.peak_activations.iter().all(|&x| x <= limit + 1e-9));
                // The heuristic's own end time of every action is the simulated one.
                let g = run(&inst, flags).unwrap();
                for lane in &sim.timeline.spans {
                    for span in lane {
                        for a in span.item().actions() {
                            let op = crate::auto::instance::OPS
                                .iter()
                                .position(|&o| o == a.op)
                                .unwrap();
                            let id = inst.id(op, a.stage, a.microbatch);
                            assert!((g.end[id] - span.end).abs() < 1e-9, "{flags:?} {a:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn only_one_chunk_per_rank() {
        let mut inst = instance(&[(1.0, 1.0, 1.0); 4], 0.0, 4.0, 4);
        inst.v = 2;
        assert!(build(&inst, Flags::all()[0]).is_none());
    }
}
