//! Section 10 of the [bound's derivation](super): microbatch by microbatch, with each rank's
//! machine and slots.
//!
//! **Microbatches in order.** Microbatches are interchangeable: in any schedule, give the `j`-th
//! `F` of stage `s` to start (in time order) to microbatch `j`, and likewise the `j`-th input
//! gradient and the `j`-th rest (`W`, or what a `B` does beyond its input part). Every dependency
//! still holds (if each `a_k + d <= b_k`, the sorted `a` and `b` keep it), each rank runs the same
//! intervals, and a rank holds as many slots at every moment (starts of `F` less ends of rests).
//! So a bound may assume that every stage runs each op in microbatch order, and then `X(s, k)`
//! starts after `X(s, k - 1)` ends (one machine).
//!
//! **Slots.** On a rank with at most `n` slots (stage-microbatches held, each from its `F`'s
//! start to its rest's end):
//!
//! - one stage `s`: when `F(s, k)` starts, `k + 1` were taken, so the rests of microbatches
//!   `0..=k - n` ended;
//! - two stages `a < b`: when `F(b, k)` starts, `F(a, 0..=k)` and `F(b, 0..=k)` took `2k + 2`
//!   slots, and the freed ones are the first `u` rests of `a` and the first `v` of `b` with
//!   `u + v >= 2k + 2 - n` and `u, v <= k` (a later rest needs this forward first). When `F(a, k)`
//!   starts, the microbatches that hold `a` but have not started `F(b)` can free nothing before
//!   their `F(b)`, so if they filled all `n` slots nothing could move: at most `n - 1` of them, so
//!   `F(b, 0..=k + 1 - n)` ran before it. With `β` upper forwards before it (`β >= k + 2 - n`),
//!   `u + v >= k + 1 + β - n`, `u, v <= β`; more `β` asks no less, so the least `β` is taken.
//!
//! Each way `(u, v)` to free enough is an **option**: the forward starts after the option's rests
//! end. Every option has `u, v >= ` (what it must free) less the cap, so those rests precede the
//! forward whichever option a schedule takes.
//!
//! **Heads with the machine.** In that order each action gets a lower bound on its start: after
//! its producers (with the transfers), after the previous microbatch's same op, after an option's
//! rests (the least over options). And every action that must run before it on its own rank
//! (its **predecessors** there: the dependencies above that stay on the rank, followed back) ran
//! one at a time on that machine, each no earlier than its own bound: with `P` that set,
//! `start >= max_τ (τ + Σ_{j ∈ P, head_j >= τ} work_j)`. Where the slot rule has several options,
//! the least over options of that maximum with the option's rests and their predecessors added.
//! This is what sections 4 and 9 miss: a microbatch that must leave before the next one enters
//! takes its `I` and `W` on the same machine as the forwards that wait for it, so at V-Half's limit
//! the rank's whole cycle (forward, the way up and back, `I`, `W`) repeats every few microbatches.
//!
//! The heads, with each action's tail (module `chain`), go to Jackson's preemptive schedule per
//! rank (section 3). For the rank that holds stage 0 the value also bounds that rank's span: its
//! first action is `F(0, 0)`, which everything follows, and every tail ends on that rank.
//!
//! Predecessors are followed back over every microbatch where that stays cheap, else over the
//! last [`window`] ones (fewer predecessors can only lower a bound), and when the options' unions
//! have cost [`UNION_WORK`] element visits the remaining options count their rests' ends alone;
//! both keep the section under about 0.15 s at P = 16, M = 128. The whole history matters where a
//! rank's early idle must show in its span (P = 4, M = 16, 2:2:1, 1F1B's memory: 80.0 with the last
//! ten microbatches, 82.5 with all, the optimum `auto` finds).

use super::chain::Chain;
use super::jackson::{self, Job};
use super::stair::Groups;

/// Element visits the options' unions may cost in all (then each option counts its rests' ends
/// alone: a weaker but still valid bound).
const UNION_WORK: usize = 20_000_000;

/// Predecessor entries over all actions below which the window is every microbatch.
const FULL_WORK: f64 = 4e6;

/// Above this many actions the section is skipped.
const MAX_ACTIONS: usize = 300_000;

/// The ops in index order.
const F: usize = 0;
const I: usize = 1;
const W: usize = 2;

/// Section 10's two values.
pub(super) struct Flow {
    /// A lower bound on the makespan.
    pub makespan: f64,
    /// A lower bound on the span of the rank that holds stage 0.
    pub first_span: f64,
}

/// Microbatches the predecessor sets reach back: all of them where that stays cheap (at most
/// [`FULL_WORK`] predecessor entries over all actions: a rank's whole history then counts, which
/// the rank-0 span needs), else twice the microbatches a rank's slots hold, plus two, at least 8 and
/// at most 32.
fn window(n: usize, chunks: usize, m: usize, actions: usize) -> usize {
    if (actions as f64) * (3 * chunks.max(1) * m) as f64 <= FULL_WORK {
        return m;
    }
    (2 * n.div_ceil(chunks.max(1)) + 2).clamp(8, 32).min(m)
}

/// The state of one run: per action its start bound and its predecessors on its rank.
struct Run {
    stages: usize,
    m: usize,
    /// Per action (`(op * stages + s) * m + k`): a lower bound on its start (NaN until set).
    start: Vec<f64>,
    /// Per action: its predecessors on its rank within the window (ids), latest start first.
    preds: Vec<Vec<u32>>,
    /// Per action, its machine time.
    work: Vec<f64>,
    /// Per action, the pass in which a union last took it (deduplication).
    stamp: Vec<u32>,
    pass: u32,
    /// Element visits of option unions so far.
    union_work: usize,
    window: usize,
}

impl Run {
    fn id(&self, op: usize, s: usize, k: usize) -> usize {
        (op * self.stages + s) * self.m + k
    }

    fn end(&self, id: usize) -> f64 {
        self.start[id] + self.work[id]
    }

    fn microbatch(&self, id: usize) -> usize {
        id % self.m
    }

    /// The union of `base` (already deduplicated) and, for each of `ids`, the action and its
    /// predecessors, kept within the window of microbatch `k`, latest start first.
    fn union(&mut self, base: &[u32], ids: &[usize], k: usize) -> Vec<u32> {
        self.pass += 1;
        let low = k.saturating_sub(self.window);
        let mut out: Vec<u32> = Vec::with_capacity(base.len() + 64);
        for &z in base {
            self.stamp[z as usize] = self.pass;
            out.push(z);
        }
        for &y in ids {
            self.union_work += self.preds[y].len() + 1;
            for z in std::iter::once(y as u32).chain(self.preds[y].iter().copied()) {
                let zi = z as usize;
                if self.stamp[zi] != self.pass && zi % self.m >= low {
                    self.stamp[zi] = self.pass;
                    out.push(z);
                }
            }
        }
        // Starts are finite and at least 0, so their bits sort as the numbers do.
        let start = &self.start;
        out.sort_unstable_by_key(|&z| std::cmp::Reverse(start[z as usize].to_bits()));
        out
    }

    /// On a rank with stages `(a, b)`, the ways to free `free` slots with at most `cap` rests of
    /// each stage (module docs, "Slots"): the rests every way needs go to `direct`, each way's last
    /// rest of either stage to `options`.
    fn ways_to_free(
        &self,
        (a, b): (usize, usize),
        free: usize,
        cap: usize,
        direct: &mut Vec<usize>,
        options: &mut Vec<Vec<usize>>,
    ) {
        if free == 0 {
            return;
        }
        let must = free.saturating_sub(cap);
        if must > 0 {
            direct.push(self.id(W, a, must - 1));
            direct.push(self.id(W, b, must - 1));
        }
        for u in must..=free.min(cap) {
            let mut o = Vec::with_capacity(2);
            if u > 0 {
                o.push(self.id(W, a, u - 1));
            }
            if free - u > 0 {
                o.push(self.id(W, b, free - u - 1));
            }
            options.push(o);
        }
    }

    /// `max_τ (τ + Σ_{start_j >= τ} work_j)` over `set` (latest start first).
    fn machine(&self, set: &[u32]) -> f64 {
        let (mut best, mut acc) = (0.0f64, 0.0);
        for &j in set {
            acc += self.work[j as usize];
            best = best.max(self.start[j as usize] + acc);
        }
        best
    }

    /// Sets action `x`'s start: at least `release` and the ends of `direct`, after its predecessors
    /// `direct` on its rank
    /// (and theirs) on one machine, and, when `options` is not empty, after the least over
    /// options of the same with the option's actions (and theirs) added.
    fn place(&mut self, x: usize, release: f64, direct: &[usize], options: &[Vec<usize>]) {
        let k = self.microbatch(x);
        let release = direct.iter().fold(release, |t, &y| t.max(self.end(y)));
        let set = self.union(&[], direct, k);
        let mut start = release.max(self.machine(&set));
        if !options.is_empty() {
            // Cheapest options first: an option's value is at least its rests' ends.
            let mut order: Vec<(f64, usize)> = options
                .iter()
                .enumerate()
                .map(|(i, o)| (o.iter().map(|&y| self.end(y)).fold(0.0, f64::max), i))
                .collect();
            order.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            let mut best = f64::INFINITY;
            for (cheap, i) in order {
                if cheap >= best {
                    break;
                }
                if self.union_work > UNION_WORK {
                    best = best.min(cheap);
                    continue;
                }
                let with = self.union(&set, &options[i], k);
                best = best.min(cheap.max(self.machine(&with)));
            }
            start = start.max(best);
        }
        // `+ 0.0` turns a -0.0 into 0.0, whose bits sort first (`union`).
        self.start[x] = start + 0.0;
        self.preds[x] = set;
    }
}

/// Section 10 under per-rank limits in rank-microbatches (`chunks` stages per rank, each a slot)
/// for `m` microbatches. `None` where it does not apply: a rank with more than two stages,
/// overlapped pairs, no limit that binds, or more than [`MAX_ACTIONS`] actions. The makespan is
/// infinite when a two-stage rank holds fewer than two slots, or a one-stage rank none.
pub(super) fn flow(
    chain: &Chain,
    groups: &Groups,
    limits: &[f64],
    chunks: f64,
    m: usize,
    overlap: bool,
) -> Option<Flow> {
    let stages = chain.forward.len();
    let ranks = limits.len();
    if overlap || m == 0 || stages == 0 || 3 * stages * m > MAX_ACTIONS {
        return None;
    }
    let mine: Vec<Vec<usize>> = (0..ranks).map(|r| groups.stages_of(r)).collect();
    if mine.iter().any(|s| s.is_empty() || s.len() > 2) {
        return None;
    }
    let mut rank_of = vec![0; stages];
    for (r, list) in mine.iter().enumerate() {
        for &s in list {
            rank_of[s] = r;
        }
    }
    let slots: Vec<usize> = limits
        .iter()
        .map(|&l| (l * chunks + 1e-9).floor().clamp(0.0, (4 * m) as f64) as usize)
        .collect();
    if (0..ranks).all(|r| slots[r] >= mine[r].len() * m) {
        return None;
    }
    if (0..ranks).any(|r| slots[r] < mine[r].len()) {
        return Some(Flow {
            makespan: f64::INFINITY,
            first_span: f64::INFINITY,
        });
    }
    let n_max = (0..ranks).map(|r| slots[r]).max().unwrap_or(0);
    let v = mine.iter().map(Vec::len).max().unwrap_or(1);
    let actions = 3 * stages * m;
    let mut run = Run {
        stages,
        m,
        start: vec![f64::NAN; actions],
        preds: vec![Vec::new(); actions],
        work: (0..actions)
            .map(|id| {
                let s = (id / m) % stages;
                match id / (m * stages) {
                    F => chain.forward[s],
                    I => chain.input[s],
                    _ => chain.rest[s],
                }
            })
            .collect(),
        stamp: vec![0; actions],
        pass: 0,
        union_work: 0,
        window: window(n_max, v, m, actions),
    };
    // The forward chain's delay from stage s to s + 1 (its transfer).
    let comm = |s: usize| chain.forward_gap(s, s + 1).max(0.0);
    for k in 0..m {
        // Predecessor lists of microbatches past every later window are never read again.
        if let Some(old) = k.checked_sub(run.window + 1) {
            for op in [F, I, W] {
                for s in 0..stages {
                    let id = run.id(op, s, old);
                    run.preds[id] = Vec::new();
                }
            }
        }
        for s in 0..stages {
            let r = rank_of[s];
            let x = run.id(F, s, k);
            let mut release = 0.0f64;
            let mut direct = Vec::with_capacity(4);
            let mut options: Vec<Vec<usize>> = Vec::new();
            if s > 0 {
                let y = run.id(F, s - 1, k);
                release = release.max(run.end(y) + comm(s - 1));
                if rank_of[s - 1] == r {
                    direct.push(y);
                }
            }
            if k > 0 {
                direct.push(run.id(F, s, k - 1));
            }
            let n = slots[r];
            match mine[r][..] {
                [_] => {
                    if k >= n {
                        direct.push(run.id(W, s, k - n));
                    }
                }
                [a, b] if s == a => {
                    // Upper forwards before this one: at least k + 2 - n (else nothing moves).
                    let beta = (k + 2).saturating_sub(n);
                    if beta > 0 {
                        direct.push(run.id(F, b, beta - 1));
                    }
                    let free = (k + 1 + beta).saturating_sub(n);
                    run.ways_to_free((a, b), free, beta, &mut direct, &mut options);
                }
                [a, b] => {
                    debug_assert_eq!(s, b);
                    // At least two slots (checked above), so at most 2k rests to free, k per stage.
                    let free = (2 * k + 2).saturating_sub(n);
                    run.ways_to_free((a, b), free, k, &mut direct, &mut options);
                }
                _ => return None,
            }
            // One option is no choice: its actions are direct predecessors.
            if options.len() == 1 {
                direct.append(&mut options[0]);
                options.clear();
            }
            run.place(x, release, &direct, &options);
        }
        for s in (0..stages).rev() {
            let r = rank_of[s];
            let x = run.id(I, s, k);
            let mut release = 0.0f64;
            let mut direct = vec![run.id(F, s, k)];
            if s + 1 < stages {
                let y = run.id(I, s + 1, k);
                release = release.max(run.end(y) + comm(s));
                if rank_of[s + 1] == r {
                    direct.push(y);
                }
            }
            if k > 0 {
                direct.push(run.id(I, s, k - 1));
            }
            run.place(x, release, &direct, &[]);
        }
        for s in 0..stages {
            let x = run.id(W, s, k);
            let mut direct = vec![run.id(I, s, k)];
            if k > 0 {
                direct.push(run.id(W, s, k - 1));
            }
            run.place(x, 0.0, &direct, &[]);
        }
    }
    // Jackson's preemptive schedule per rank with these heads and the chain's tails.
    let tail = |op: usize, s: usize| match op {
        F => chain.tail_f(s),
        I => chain.down[s].max(chain.rest[s]),
        _ => 0.0,
    };
    let first = rank_of[0];
    let mut makespan = 0.0f64;
    let mut first_span = 0.0;
    for (r, list) in mine.iter().enumerate() {
        let mut jobs = Vec::with_capacity(3 * list.len() * m);
        for &s in list {
            for op in [F, I, W] {
                for k in 0..m {
                    let id = run.id(op, s, k);
                    jobs.push(Job {
                        head: run.start[id],
                        work: run.work[id],
                        tail: tail(op, s),
                    });
                }
            }
        }
        let value = jackson::preemptive(&jobs);
        makespan = makespan.max(value);
        if r == first {
            first_span = value;
        }
    }
    Some(Flow {
        makespan,
        first_span,
    })
}
