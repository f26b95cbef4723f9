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

/// Section 9's heads: for every stage `s`, lower bounds on the start of its forwards in time
/// order (`heads[s][j]`, the `j`-th), when rank `r` holds at most `held[r]` stage-microbatches and
/// each rank has two stages (`stages[r] = (s0, s1)`, `s0 < s1`). Besides each rank's two rules
/// (module docs), the `j`-th forward of stage `s + 1` starts no earlier than the `j`-th of stage
/// `s` plus its forward and the transfer (the sorted starts of one stage bound those of the next),
/// so a rank waiting for room holds back every stage above it. `None` when some rank cannot hold
/// two stage-microbatches (no microbatch could pass it).
fn heads(
    chain: &Chain,
    stages: &[(usize, usize)],
    held: &[usize],
    m: usize,
) -> Option<Vec<Vec<f64>>> {
    let c = chain;
    let count = c.forward.len();
    if held.iter().any(|&n| n < 2) {
        return None;
    }
    // Per stage: its rank, and whether it is the rank's upper stage.
    let mut rank_of = vec![(0, false); count];
    for (r, &(s0, s1)) in stages.iter().enumerate() {
        rank_of[s0] = (r, false);
        rank_of[s1] = (r, true);
    }
    let mut phi: Vec<Vec<f64>> = vec![Vec::with_capacity(m); count];
    for j in 0..m {
        for s in 0..count {
            let (r, upper) = rank_of[s];
            let (s0, s1) = stages[r];
            let n = held[r];
            let climb = c.head_f[s1] - c.head_f[s0];
            let down = (c.round_trip(s0) - climb).max(0.0);
            let mut t = c.head_f[s];
            if s > 0 {
                t = t.max(phi[s - 1][j] + (c.head_f[s] - c.head_f[s - 1]));
            }
            if j > 0 {
                t = t.max(phi[s][j - 1] + c.forward[s]);
            }
            if upper {
                t = t.max(phi[s0][j] + climb);
                t = earliest_with_room(&phi[s], t, (down, c.round_trip(s1)), n);
            } else if j >= n {
                t = t.max(phi[s1][j - n] + down);
            }
            phi[s].push(t);
        }
    }
    Some(phi)
}

/// [`terms`] under per-rank limits in rank-microbatches (`chunks` stages per rank, each a slot),
/// where every rank has two stages (`None` elsewhere). The term of the rank that holds stage 0 also
/// bounds that rank's span: its first action is a stage-0 forward, the heads count from it, and
/// every tail ends with the gradient chain's last step or a rest on that rank.
pub(super) fn limited_terms(
    chain: &Chain,
    groups: &Groups,
    limits: &[f64],
    chunks: f64,
    m: usize,
) -> Option<Vec<f64>> {
    let mut pairs = Vec::with_capacity(limits.len());
    let mut slots = Vec::with_capacity(limits.len());
    for (r, &limit) in limits.iter().enumerate() {
        let [s0, s1] = groups.stages_of(r)[..] else {
            return None;
        };
        pairs.push((s0, s1));
        // More than two slots per microbatch never bind (the counts never reach them).
        let held = (limit * chunks + 1e-9).floor();
        slots.push(held.min(2.0 * m as f64 + 2.0) as usize);
    }
    Some(terms(chain, &pairs, &slots, m, |s| groups.forward_work(s)))
}

/// Section 9's term for every rank (each with two stages, `stages[r] = (s0, s1)`), when rank `r`
/// holds at most `held[r]` stage-microbatches and `m` microbatches run; `work(s)` is a forward's
/// machine time. Per rank, Jackson's preemptive schedule of its actions with the heads of
/// [`heads`] and the chain's tails; infinite when some rank cannot hold two stage-microbatches.
pub(super) fn terms(
    chain: &Chain,
    stages: &[(usize, usize)],
    held: &[usize],
    m: usize,
    work: impl Fn(usize) -> f64,
) -> Vec<f64> {
    if m == 0 {
        return vec![0.0; stages.len()];
    }
    let Some(phi) = heads(chain, stages, held, m) else {
        return vec![f64::INFINITY; stages.len()];
    };
    let c = chain;
    let tail_i = |s: usize| c.down[s].max(c.rest[s]);
    stages
        .iter()
        .map(|&(s0, s1)| {
            let climb = c.head_f[s1] - c.head_f[s0];
            let down = (c.round_trip(s0) - climb).max(0.0);
            let reach_i1 = c.forward[s1] + c.up[s1];
            let reach_i0 = down - c.input[s0] - c.rest[s0];
            let mut jobs = Vec::with_capacity(6 * m);
            for (&a, &b) in phi[s0].iter().zip(&phi[s1]) {
                jobs.push(Job {
                    head: a,
                    work: work(s0),
                    tail: c.tail_f(s0),
                });
                jobs.push(Job {
                    head: b,
                    work: work(s1),
                    tail: c.tail_f(s1),
                });
                jobs.push(Job {
                    head: b + reach_i1,
                    work: c.input[s1],
                    tail: tail_i(s1),
                });
                jobs.push(Job {
                    head: b + reach_i1 + c.input[s1],
                    work: c.rest[s1],
                    tail: 0.0,
                });
                jobs.push(Job {
                    head: b + reach_i0,
                    work: c.input[s0],
                    tail: tail_i(s0),
                });
                jobs.push(Job {
                    head: b + reach_i0 + c.input[s0],
                    work: c.rest[s0],
                    tail: 0.0,
                });
            }
            jackson::preemptive(&jobs)
        })
        .collect()
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
