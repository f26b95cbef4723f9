//! Section 9 of the [bound's derivation](super): a microbatch holds two slots of a rank at once.
//!
//! On a rank with two stages `s0 < s1` (`V = 2`, either placement), microbatch `k` holds a slot of
//! `s0` from the start of `F(s0, k)` (`a_k`) to the end of its backward there (`d_k`), and a slot of
//! `s1` from the start of `F(s1, k)` (`b_k`) to the end of its backward there (`c_k`); `b_k` lies
//! inside `[a_k, d_k)`. With the chain's delays (module `chain`): `b_k >= a_k + U` (`U` the forward
//! chain from `s0` to `s1`), `c_k >= b_k + R1` (`R1` the round trip of `s1`) and `d_k >= b_k + D`
//! (`D` what stays of `s0`'s round trip after `F(s1, k)` starts).
//!
//! Number the starts of each stage's forwards in time order, `α_i` for `s0`, `β_j` for `s1`
//! (microbatches are interchangeable: the `j`-th `F(s1, ·)` to start belongs to some microbatch
//! whose `F(s0, ·)` started no later than the `j`-th of those, so `β_j >= α_j + U`). With at most
//! `n` slots:
//!
//! - when the `j`-th `F(s1, ·)` starts, the microbatches of the first `j` of them each still hold
//!   their `s0` slot unless it was freed, and the `i`-th of them (`i < j`) freed it no earlier than
//!   `β_i + D`; the first `j - 1` still hold their `s1` slot while `t < β_i + R1`; with the new slot,
//!   `j - #{i < j: β_i + D <= t} + #{i < j: β_i + R1 > t} + 1 <= n` at `t = β_j`. Both counts only
//!   fall as the earlier `β_i` rise, so the least `t` that satisfies it (and `t >= β_(j-1) + F1`,
//!   `t >= α_j + U`) is a lower bound on `β_j` whenever the earlier ones are;
//! - when the `(n + j)`-th `F(s0, ·)` starts, `j` of the `s0` slots were freed, the `j`-th freeing
//!   no earlier than `β_j + D`: `α_(n + j) >= β_j + D` (and `α_i >= α_(i - 1) + F0`).
//!
//! The first rule is what the single-slot recurrence of section 4 misses: a microbatch at its upper
//! stage needs a second slot while its lower one is still held, so a rank whose `n` slots hold `n`
//! lower-stage microbatches cannot start any upper-stage forward until one comes all the way back.
//!
//! Every action of the rank then gets its own head: `F(s0)`'s `j`-th copy `α_j`, `F(s1)`'s `β_j`,
//! and the backward parts of the `j`-th microbatch to reach `s1` the chain's delays after `β_j`
//! (sorted starts bound sorted starts). Jackson's preemptive schedule of these jobs with their tails
//! (section 3) bounds the makespan.

use super::chain::Chain;
use super::jackson::{self, Job};
use super::stair::Groups;

/// One rank's two stages (`s0 < s1`), the chain's delays between them and its slots.
struct Pair {
    s0: usize,
    s1: usize,
    /// From the start of `F(s0, k)` to the earliest start of `F(s1, k)`.
    climb: f64,
    /// What stays of `s0`'s round trip after `F(s1, k)` starts: the earliest freeing of its slot.
    down: f64,
    /// The round trip of `s1`: the earliest freeing of its slot after `F(s1, k)` starts.
    upper_trip: f64,
    /// Stage-microbatches the rank can hold (more than two per microbatch are cut: never reached).
    held: usize,
}

/// Section 9 of the bound for ranks that each have two stages: the forward heads of every stage
/// (computed once), and per rank the one-machine term built on them.
pub(super) struct Nest<'a> {
    chain: &'a Chain,
    pairs: Vec<Pair>,
    /// `heads[s][j]`: a lower bound on the start of the `j`-th forward of stage `s` (time order);
    /// `None` when some rank cannot hold two stage-microbatches (no microbatch could pass it).
    heads: Option<Vec<Vec<f64>>>,
}

impl<'a> Nest<'a> {
    /// Section 9 under per-rank limits in rank-microbatches (`chunks` stages per rank, each a slot)
    /// for `m` microbatches; `None` unless every rank has two stages.
    pub(super) fn new(
        chain: &'a Chain,
        groups: &Groups,
        limits: &[f64],
        chunks: f64,
        m: usize,
    ) -> Option<Self> {
        let c = chain;
        let mut pairs = Vec::with_capacity(limits.len());
        for (r, &limit) in limits.iter().enumerate() {
            let [s0, s1] = groups.stages_of(r)[..] else {
                return None;
            };
            let climb = c.head_f[s1] - c.head_f[s0];
            let held = (limit * chunks + 1e-9).floor();
            pairs.push(Pair {
                s0,
                s1,
                climb,
                down: (c.round_trip(s0) - climb).max(0.0),
                upper_trip: c.round_trip(s1),
                held: held.min(2.0 * m as f64 + 2.0) as usize,
            });
        }
        let heads = heads(chain, &pairs, m);
        Some(Nest {
            chain,
            pairs,
            heads,
        })
    }

    /// Rank `r`'s term: Jackson's preemptive schedule of its actions with one head per copy from
    /// the forward heads and the chain's tails (`work(s)`: a forward's machine time). It bounds
    /// the makespan; for the rank that holds stage 0 also that rank's span (its first action is a
    /// stage-0 forward, from which the heads count, and every tail ends on that rank: the gradient
    /// chain's last step or a rest of its own). Infinite when some rank cannot hold two
    /// stage-microbatches.
    pub(super) fn term(&self, r: usize, work: impl Fn(usize) -> f64) -> f64 {
        let Some(phi) = &self.heads else {
            return f64::INFINITY;
        };
        let c = self.chain;
        let p = &self.pairs[r];
        let (s0, s1) = (p.s0, p.s1);
        let reach_i1 = c.forward[s1] + c.up[s1];
        let reach_i0 = p.down - c.input[s0] - c.rest[s0];
        // Per copy: `F(s0)` from its own head, the rest from the head of `F(s1)` plus a delay.
        let upper = [
            (0.0, work(s1), c.tail_f(s1)),
            (reach_i1, c.input[s1], c.down[s1].max(c.rest[s1])),
            (reach_i1 + c.input[s1], c.rest[s1], 0.0),
            (reach_i0, c.input[s0], c.down[s0].max(c.rest[s0])),
            (reach_i0 + c.input[s0], c.rest[s0], 0.0),
        ];
        let (lower_work, lower_tail) = (work(s0), c.tail_f(s0));
        let mut jobs = Vec::with_capacity(6 * phi[s0].len());
        for (&a, &b) in phi[s0].iter().zip(&phi[s1]) {
            jobs.push(Job {
                head: a,
                work: lower_work,
                tail: lower_tail,
            });
            jobs.extend(upper.iter().map(|&(delay, work, tail)| Job {
                head: b + delay,
                work,
                tail,
            }));
        }
        jackson::preemptive(&jobs)
    }
}

/// Section 9's heads: for every stage `s`, lower bounds on the start of its forwards in time
/// order (`heads[s][j]`, the `j`-th), when every rank has two stages (`pairs`). Besides each
/// rank's two rules (module docs), the `j`-th forward of stage `s + 1` starts no earlier than the
/// `j`-th of stage `s` plus its forward and the transfer (the sorted starts of one stage bound those
/// of the next), so a rank waiting for room holds back every stage above it. `None` when some rank
/// cannot hold two stage-microbatches (no microbatch could pass it).
fn heads(chain: &Chain, pairs: &[Pair], m: usize) -> Option<Vec<Vec<f64>>> {
    let c = chain;
    let count = c.forward.len();
    if pairs.iter().any(|p| p.held < 2) {
        return None;
    }
    // Per stage: its rank's pair, and whether it is the rank's upper stage.
    let mut pair_of = vec![(0, false); count];
    for (r, p) in pairs.iter().enumerate() {
        pair_of[p.s0] = (r, false);
        pair_of[p.s1] = (r, true);
    }
    let mut phi: Vec<Vec<f64>> = (0..count).map(|_| Vec::with_capacity(m)).collect();
    for j in 0..m {
        for s in 0..count {
            let (r, upper) = pair_of[s];
            let p = &pairs[r];
            let mut t = c.head_f[s];
            if s > 0 {
                t = t.max(phi[s - 1][j] + (c.head_f[s] - c.head_f[s - 1]));
            }
            if j > 0 {
                t = t.max(phi[s][j - 1] + c.forward[s]);
            }
            if upper {
                t = t.max(phi[p.s0][j] + p.climb);
                t = earliest_with_room(&phi[s], t, (p.down, p.upper_trip), p.held);
            } else if j >= p.held {
                t = t.max(phi[p.s1][j - p.held] + p.down);
            }
            phi[s].push(t);
        }
    }
    Some(phi)
}

/// The least `t >= from` at which the next upper-stage forward (after those starting at `beta`)
/// finds a slot: `j - #{i: beta_i + down <= t} + #{i: beta_i + r1 > t} + 1 <= n` with `j` the
/// forwards so far plus this one (infinite if never: cannot happen for `n >= 2`).
fn earliest_with_room(beta: &[f64], from: f64, (down, r1): (f64, f64), n: usize) -> f64 {
    // `beta` is sorted, so both counts are partition points (of predicates monotone in `beta_i`).
    let j = beta.len() + 1;
    let fits = |t: f64| {
        let freed = beta.partition_point(|&b| b + down <= t);
        let upper = beta.len() - beta.partition_point(|&b| b + r1 <= t);
        j - freed + upper < n
    };
    if fits(from) {
        return from;
    }
    // The counts change only at `beta_i + down` and `beta_i + r1`: try those above `from` in order.
    let mut p = beta.partition_point(|&b| b + down <= from);
    let mut q = beta.partition_point(|&b| b + r1 <= from);
    loop {
        let next_p = beta.get(p).map(|&b| b + down);
        let next_q = beta.get(q).map(|&b| b + r1);
        let t = match (next_p, next_q) {
            (None, None) => return f64::INFINITY,
            (Some(x), None) => {
                p += 1;
                x
            }
            (None, Some(y)) => {
                q += 1;
                y
            }
            (Some(x), Some(y)) if x <= y => {
                p += 1;
                x
            }
            (Some(_), Some(y)) => {
                q += 1;
                y
            }
        };
        if fits(t) {
            return t;
        }
    }
}
