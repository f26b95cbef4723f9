//! Section 13 of the [simulator's docs](crate::sim#lower-bound): the tip rank's own problem,
//! solved exactly within a budget (past it, still a lower bound).
//!
//! A rank holding a lower stage `s >= 1` and an upper stage `u` runs, per microbatch, `F(s)`,
//! `F(u)`, `I(u)`, `I(s)` and the two rests, one at a time, with the chain's delays between them
//! (the forwards above `u` and the backwards back down to it between `F(u)` and `I(u)`; at the tip
//! of the V, `u = s + 1`, none between `F(s)` and `F(u)` or between `I(u)` and `I(s)`), and holds a
//! slot per stage-microbatch from its forward's start to its rest's end, at most `cap` at once.
//! Every other rank is relaxed away: its actions become the chain's delays, and the `k`-th forward
//! of `s` starts no earlier than `head_F(s) + k` times the longest forward below `s` (each stage
//! below runs its forwards one at a time). Each op kind runs in microbatch order (the sorting
//! argument of section 10) and as early as the machine and its inputs allow (both values below are
//! regular objectives), so a schedule is a sequence of op kinds; the search goes layer by layer over
//! them and keeps, per count of each kind done, only the states no other state beats in every time
//! that matters (the machine's free time, the last `I(s)`'s end, and the times the pending ops
//! become ready, each raised to the machine's free time: a time the machine has passed no longer
//! tells two states apart). Equal rests are one kind (only how many ran matters). Where a layer
//! would hold more than its share of [`MAX_TRIES`], each count's states are cut into runs and each
//! run becomes the state with the least of its times ([`thin`]): the value is then still a lower
//! bound, no longer always the least. Its least `max(machine end, last I(s) end + down(s))` bounds
//! the makespan, and its least `last I(s) end + down(s)` the span of the rank that holds stage 0
//! (the gradient chain ends there, and every time counts from that rank's first action, the
//! step's start).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::chain::Chain;

/// The search's budget of tries (states made, each compared with the kept states of its counts):
/// each of the `6 M` layers keeps at most `MAX_TRIES / (36 M)` states (one per count at least),
/// more being merged by [`thin`]. On the V-shape grid's V-Half and 1F1B rows its values equal the
/// unbudgeted search's (at most 130 ms per search at P = 16, M = 64; 140 ms at M = 128).
const MAX_TRIES: usize = 2_000_000;

/// Most stage-microbatches held at once for which the bound runs the search (V-Half's limit at
/// P = 16, 1F1B's at P = 8); with more, the counts per layer grow past the budget.
pub(super) const MAX_CAP: usize = 16;

/// Most op kinds a search may handle (`6 M`, M = 256).
const MAX_OPS: usize = 6 * 256;

/// The undominated states of a layer per count of each op kind, in a map whose order depends only
/// on what went in (a fixed hash, so the search, thinned or not, is the same on every run).
type Fronts = HashMap<[usize; 6], Vec<State>, BuildHasherDefault<Mix>>;

/// A small multiplicative hash for the counts (the standard one is seeded per process).
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The two values of [`own_problem`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Own {
    /// A lower bound on the makespan.
    pub makespan: f64,
    /// A lower bound on the span of the rank that holds stage 0.
    pub first_span: f64,
    /// Whether [`thin`] merged states (else both values are the least of the problem).
    pub thinned: bool,
}

/// One state: counts of each op kind done (F(s), F(u), I(u), I(s), rest of u, rest of s), the
/// machine's free time, the last `I(s)` end, and the times the pending ops become ready.
///
/// A pending op's ready time matters only where it is later than `free` (the machine is never free
/// earlier again), so ready times are kept as `max(ready, free)`: two states that differ only in
/// ready times the machine has already passed are the same state, which keeps the layers small.
#[derive(Debug, Clone)]
struct State {
    n: [usize; 6],
    free: f64,
    last_d: f64,
    /// The ready times of the pending ops, in three runs: `F(u, k)` for `k` in `n[1]..n[0]` (their
    /// `F(s, k)`'s end plus the delay), `I(u, k)` for `k` in `n[2]..n[1]`, `I(s, k)` for `k` in
    /// `n[3]..n[2]`. Each such microbatch holds a slot, so there are at most `cap` of them.
    t: [f64; MAX_CAP],
}

impl State {
    /// Pending ops (the three runs together).
    fn pending(&self) -> usize {
        self.n[0] - self.n[3]
    }

    /// Whether `self` is no worse than `other` in every time (same counts).
    fn covers(&self, other: &State) -> bool {
        let len = self.pending();
        self.free <= other.free
            && self.last_d <= other.last_d
            && self.t[..len]
                .iter()
                .zip(&other.t[..len])
                .all(|(x, y)| x <= y)
    }

    /// Takes the ready time at `at` out of the runs.
    fn take(&mut self, at: usize) {
        let len = self.pending();
        self.t.copy_within(at + 1..len, at);
    }

    /// Puts `v` in the runs at `at` (`len` ready times before it).
    fn put(&mut self, at: usize, len: usize, v: f64) {
        self.t.copy_within(at..len, at + 1);
        self.t[at] = v;
    }

    /// Orders states of the same counts by their times (free, last `I(s)`, then the ready times),
    /// so that merged runs do not depend on the order the states came in.
    fn by_times(&self, other: &State) -> std::cmp::Ordering {
        let len = self.pending();
        let ready = self.t[..len].iter().zip(&other.t[..len]);
        self.free
            .total_cmp(&other.free)
            .then(self.last_d.total_cmp(&other.last_d))
            .then_with(|| {
                ready
                    .map(|(a, b)| a.total_cmp(b))
                    .find(|o| o.is_ne())
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
    }

    /// Raises every ready time to at least `free` (see the type's docs).
    fn settle(&mut self) {
        let free = self.free;
        let len = self.pending();
        for t in &mut self.t[..len] {
            if *t < free {
                *t = free;
            }
        }
    }
}

/// The value of rank `r`'s own problem for lower stage `s >= 1` and upper stage `u > s`, `m`
/// microbatches, at most `cap` stage-microbatches held (exact unless [`thin`] merged states);
/// `None` when too large.
pub(super) fn own_problem(chain: &Chain, s: usize, u: usize, m: usize, cap: usize) -> Option<Own> {
    search(chain, [s, u], m, cap, MAX_TRIES, true)
}

/// [`own_problem`] with the budget of tries and whether equal rests are one kind (the tests
/// compare both ways).
fn search(
    chain: &Chain,
    [s, u]: [usize; 2],
    m: usize,
    cap: usize,
    budget: usize,
    merge_rests: bool,
) -> Option<Own> {
    if s == 0 || u <= s || m == 0 || 6 * m > MAX_OPS || !(2..=MAX_CAP).contains(&cap) {
        return None;
    }
    let dur = [
        chain.forward[s],
        chain.forward[u],
        chain.input[u],
        chain.input[s],
        chain.rest[u],
        chain.rest[s],
    ];
    let d_ab = chain.head_f[u] - chain.head_f[s] - chain.forward[s];
    let d_bc = chain.up[u];
    let d_cd = chain.down[u] - chain.down[s] - chain.input[s];
    let spacing = chain.forward[..s].iter().copied().fold(0.0, f64::max);
    let head = chain.head_f[s];
    let tail = chain.down[s];
    let mut layer: Vec<State> = vec![State {
        n: [0; 6],
        free: 0.0,
        last_d: 0.0,
        t: [0.0; MAX_CAP],
    }];
    // With equal rests, which stage's rest runs is immaterial: both free one slot, and a rest is
    // due while fewer have run than input gradients (of either stage), whichever ran. So only their
    // total counts, kept as the upper stage's first (`min(total, n[2])`), the lower's after.
    let merged = merge_rests && dur[4] == dur[5];
    let per_layer = (budget / (6 * 6 * m)).max(1);
    let mut thinned = false;
    for _ in 0..6 * m {
        let mut next: Fronts = Fronts::default();
        for st in &layer {
            let n = st.n;
            let held = (n[0] - n[5]) + (n[1] - n[4]);
            let (la, lb) = (n[0] - n[1], n[1] - n[2]);
            for (kind, &work) in dur.iter().enumerate() {
                let ready = match kind {
                    0 if n[0] < m && held < cap => head + n[0] as f64 * spacing,
                    1 if n[1] < n[0] && held < cap => st.t[0],
                    2 if n[2] < n[1] => st.t[la],
                    3 if n[3] < n[2] => st.t[la + lb],
                    4 if n[4] < n[2] => 0.0,
                    5 if n[5] < n[3] && !(merged && n[4] < n[2]) => 0.0,
                    _ => continue,
                };
                let end = st.free.max(ready) + work;
                let mut new = st.clone();
                let len = st.pending();
                match kind {
                    0 => new.put(la, len, end + d_ab),
                    1 => {
                        new.take(0);
                        new.put(la - 1 + lb, len - 1, end + d_bc);
                    }
                    2 => {
                        new.take(la);
                        new.put(la + lb - 1 + (n[2] - n[3]), len - 1, end + d_cd);
                    }
                    3 => {
                        new.take(la + lb);
                        new.last_d = end;
                    }
                    _ => {}
                }
                new.n[kind] += 1;
                new.free = end;
                if merged {
                    let rests = new.n[4] + new.n[5];
                    new.n[4] = rests.min(new.n[2]);
                    new.n[5] = rests - new.n[4];
                }
                new.settle();
                insert(next.entry(new.n).or_default(), new);
            }
        }
        let merged_some;
        (layer, merged_some) = thin(next, per_layer);
        thinned |= merged_some;
    }
    let makespan = layer
        .iter()
        .map(|st| st.free.max(st.last_d + tail))
        .fold(f64::INFINITY, f64::min);
    let first_span = layer
        .iter()
        .map(|st| st.last_d + tail)
        .fold(f64::INFINITY, f64::min);
    Some(Own {
        makespan,
        first_span,
        thinned,
    })
}

/// The next layer from `fronts` (the undominated states per count), at most about `most` states:
/// where there are more, each count's states (in order of the machine's free time) are cut into
/// runs and every run becomes one state with the least of each of its times. That state is no
/// worse than any of its run in every time, and every step of the search keeps that order (each
/// time is a maximum and a sum of times), so what follows from it is no later than what follows
/// from any of them: the search's value stays a lower bound, only no longer always the least.
/// Also says whether it merged any.
fn thin(fronts: Fronts, most: usize) -> (Vec<State>, bool) {
    let total: usize = fronts.values().map(Vec::len).sum();
    if total <= most {
        return (fronts.into_values().flatten().collect(), false);
    }
    // The most runs per count that keeps the layer within the budget (at least one): counts with
    // fewer states keep them all.
    let mut sizes: Vec<usize> = fronts.values().map(Vec::len).collect();
    sizes.sort_unstable();
    let counts = sizes.len();
    let mut runs = 1;
    let mut below = 0; // states of the counts with fewer than `runs + 1` of them
    let mut i = 0;
    while runs < sizes[counts - 1] {
        let next = runs + 1;
        while i < counts && sizes[i] < next {
            below += sizes[i];
            i += 1;
        }
        if below + next * (counts - i) > most {
            break;
        }
        runs = next;
    }
    let mut out = Vec::with_capacity(counts * runs);
    let mut merged = false;
    for (_, mut front) in fronts {
        if front.len() <= runs {
            out.extend(front);
            continue;
        }
        merged = true;
        front.sort_by(State::by_times);
        let len = front.len();
        for j in 0..runs {
            let run = &front[j * len / runs..(j + 1) * len / runs];
            out.push(least(run));
        }
    }
    (out, merged)
}

/// The state with the least of each time over `run` (same counts, at least one state).
fn least(run: &[State]) -> State {
    let mut out = run[0].clone();
    for st in &run[1..] {
        out.free = out.free.min(st.free);
        out.last_d = out.last_d.min(st.last_d);
        for (t, &v) in out.t.iter_mut().zip(&st.t) {
            *t = t.min(v);
        }
    }
    out
}

/// Adds `new` to `states` (all of its counts) unless one of them covers it, dropping those it
/// covers.
fn insert(states: &mut Vec<State>, new: State) {
    if states.iter().any(|o| o.covers(&new)) {
        return;
    }
    states.retain(|o| !new.covers(o));
    states.push(new);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{CostModel, LinkCost, StageCost};
    use crate::schedule::Placement;

    /// The tip rank's chain for V-shape, `ranks` ranks, `F:I:W` per rank, a transfer of `share` F.
    fn tip(ranks: usize, fiw: [f64; 3], share: f64) -> (Chain, [usize; 2]) {
        let link = LinkCost {
            latency: share * fiw[0],
            bandwidth: f64::INFINITY,
        };
        let one = StageCost::uniform(fiw[0], fiw[1], fiw[2]).split(2);
        let costs = CostModel::uniform(one, 2 * ranks, link);
        (
            Chain::new(ranks, Placement::Vshape, &costs),
            [ranks - 1, ranks],
        )
    }

    /// Keeping the two rests apart and merging equal ones give the same least values, and a
    /// search thinned to one state per count never rises above the exact one (it stays a lower
    /// bound; on these cases it is equal) and is the same on every run.
    #[test]
    fn merged_rests_are_exact_and_thinning_only_lowers() {
        let mut thinned = 0;
        for (ranks, m, cap) in [(4, 8, 4), (4, 6, 6), (8, 8, 8)] {
            for (fiw, share) in [([2.0, 2.0, 1.0], 0.1), ([1.0, 1.2, 0.8], 0.0)] {
                let (chain, su) = tip(ranks, fiw, share);
                let case = format!("P {ranks} M {m} cap {cap} {fiw:?} {share}");
                let exact = search(&chain, su, m, cap, usize::MAX / 64, true).expect(&case);
                let apart = search(&chain, su, m, cap, usize::MAX / 64, false).expect(&case);
                assert!((exact.makespan - apart.makespan).abs() < 1e-9, "{case}");
                assert!((exact.first_span - apart.first_span).abs() < 1e-9, "{case}");
                let thin = search(&chain, su, m, cap, 36 * m, true).expect(&case);
                // The same every time (the merged runs do not depend on a map's random order).
                assert_eq!(
                    Some(thin),
                    search(&chain, su, m, cap, 36 * m, true),
                    "{case}"
                );
                assert!(thin.makespan <= exact.makespan + 1e-9, "{case}");
                assert!(thin.first_span <= exact.first_span + 1e-9, "{case}");
                assert!(!exact.thinned, "{case}");
                thinned += usize::from(thin.thinned);
            }
        }
        assert!(thinned > 0, "a budget of one state per count never thinned");
    }
}
