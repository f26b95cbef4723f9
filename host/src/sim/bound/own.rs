//! Sections 13 and 14 of the [simulator's docs](crate::sim#lower-bound): the tip rank's own
//! problem, and the tip rank's with a second rank's, solved exactly within a budget (past it,
//! still a lower bound).
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
//!
//! The same search takes two machines ([`pair_problem`]): the tip rank (stages `P - 1`, `P`) and
//! rank `q` (stages `q`, `2P - 1 - q`), whose eight op kinds lie on one chain, `F(q)`, `F(P - 1)`,
//! `F(P)`, `F(2P - 1 - q)`, `I(2P - 1 - q)`, `I(P)`, `I(P - 1)`, `I(q)`, each on its rank's machine,
//! every other rank relaxed to the chain's delays. A sequence of op kinds over both machines, each
//! op as early as its machine and its input allow, gives every semi-active schedule of the pair
//! (take the ops in order of start), so the least over sequences is the pair's optimum. Where no
//! slot limit binds, the rests need no counts: each machine owes the rest work its input gradients
//! made due and runs it in any gap before its next op and after its last, in pieces (a
//! relaxation: a rest whole in one place is a special case), so the search keeps one amount owed
//! per machine and its counts are the chain's alone.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use super::chain::Chain;

/// The search's budget of tries (states made, each compared with the kept states of its counts):
/// each of the `6 M` layers keeps at most `MAX_TRIES / (36 M)` states (one per count at least),
/// more being merged by [`thin`]. On the V-shape grid's V-Half and 1F1B rows its values equal the
/// unbudgeted search's (at most 130 ms per search at P = 16, M = 64; 140 ms at M = 128).
const MAX_TRIES: usize = 2_000_000;

/// Most comparisons between states [`pair_problem`] makes before it gives up (a few tenths of a
/// second; section 13's searches are bounded by their slots instead).
const MAX_COMPARED: usize = 100_000_000;

/// Most stage-microbatches held at once for which the bound runs the search (V-Half's limit at
/// P = 16, 1F1B's at P = 8); with more, the counts per layer grow past the budget.
pub(super) const MAX_CAP: usize = 16;

/// Most op kinds a search may handle (`6 M`, M = 256).
const MAX_OPS: usize = 6 * 256;

/// A small multiplicative hash for the counts (the standard one is seeded per process).
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn write(&mut self, bytes: &[u8]) {
        // Eight bytes at a time (the counts come as one slice of their bytes).
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
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

/// The two values of [`own_problem`] and [`pair_problem`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Own {
    /// A lower bound on the makespan.
    pub makespan: f64,
    /// A lower bound on the span of the rank that holds stage 0.
    pub first_span: f64,
    /// Whether [`thin`] merged states (else both values are the least of the problem).
    pub thinned: bool,
}

/// Most op kinds along one microbatch's chain (two two-stage ranks: four forwards, four input
/// gradients).
const KINDS: usize = 8;

/// Counts per state: the chain's kinds, then per machine its rests (upper stage's, lower's).
const COUNTS: usize = KINDS + 4;

/// The problem the search solves: one microbatch's chain of op kinds, each on one of one or two
/// machines, every other rank relaxed to the chain's delays.
#[derive(Debug, Clone, PartialEq)]
struct Problem {
    /// Kinds along the chain (4 for one rank, 8 for two).
    kinds: usize,
    /// Machines (1 or 2).
    machines: usize,
    /// Per kind: its work, its machine, and the delay from its end to the next kind's earliest
    /// start (the relaxed ranks' forwards or backwards and the transfers between).
    dur: [f64; KINDS],
    machine: [usize; KINDS],
    delay: [f64; KINDS],
    /// The first kind's `k`-th op starts no earlier than `head + k * spacing`.
    head: f64,
    spacing: f64,
    /// From the end of the last kind's op to the end of the step.
    tail: f64,
    /// Per machine: its two forward kinds (each takes a slot), its two input-gradient kinds (upper
    /// stage's first; each makes one rest due) and the two rests' work.
    forwards: [[usize; 2]; 2],
    inputs: [[usize; 2]; 2],
    rests: [[f64; 2]; 2],
    /// Per machine, the most stage-microbatches held (from a forward's start to its rest's end).
    cap: [usize; 2],
    microbatches: usize,
    /// Rests as filler: each machine's rest work, due from its input gradient's end, runs in any
    /// gap before the next op and after the machine's last (preemptive, a relaxation), kept as
    /// one amount per machine instead of counts; only where no slot limit binds.
    filler: bool,
}

/// The undominated states of a layer per count of each op kind, in a map whose order depends only
/// on what went in (a fixed hash, so the search, thinned or not, is the same on every run).
type Fronts<const N: usize> = HashMap<[u16; COUNTS], Vec<State<N>>, BuildHasherDefault<Mix>>;

/// One state: counts of each op kind done (the chain's, then each machine's rests), each machine's
/// free time, the last op of the chain's last kind's end, and the times the pending ops become
/// ready (at most `N` of them).
///
/// A pending op's ready time matters only where it is later than its machine's `free` (the machine
/// is never free earlier again), so ready times are kept as `max(ready, free)`: two states that
/// differ only in ready times the machine has already passed are the same state, which keeps the
/// layers small.
#[derive(Debug, Clone)]
struct State<const N: usize> {
    n: [u16; COUNTS],
    free: [f64; 2],
    /// Rest work due and not yet run, per machine (rests as filler only).
    owed: [f64; 2],
    last: f64,
    /// The ready times of the pending ops, in runs: run `c` (kind `c >= 1`) holds those of
    /// microbatches `n[c]..n[c - 1]` (the end of their kind `c - 1` op plus the delay) and starts at
    /// `n[0] - n[c - 1]`. Each pending microbatch holds a slot of the first kind's machine.
    t: [f64; N],
}

impl<const N: usize> State<N> {
    /// Count of kind `c`.
    fn c(&self, c: usize) -> usize {
        usize::from(self.n[c])
    }

    /// Whether `self` is no worse than `other` in every time (same counts).
    fn covers(&self, other: &Self, len: usize) -> bool {
        self.free[0] <= other.free[0]
            && self.free[1] <= other.free[1]
            && self.owed[0] <= other.owed[0]
            && self.owed[1] <= other.owed[1]
            && self.last <= other.last
            && self.t[..len]
                .iter()
                .zip(&other.t[..len])
                .all(|(x, y)| x <= y)
    }

    /// Takes the ready time at `at` out of the runs (`len` of them).
    fn take(&mut self, at: usize, len: usize) {
        self.t.copy_within(at + 1..len, at);
    }

    /// Puts `v` in the runs at `at` (`len` ready times before it).
    fn put(&mut self, at: usize, len: usize, v: f64) {
        self.t.copy_within(at..len, at + 1);
        self.t[at] = v;
    }

    /// Orders states of the same counts by their times (free times, last end, then the ready
    /// times), so that merged runs do not depend on the order the states came in.
    fn by_times(&self, other: &Self, len: usize) -> std::cmp::Ordering {
        let ready = self.t[..len].iter().zip(&other.t[..len]);
        self.free[0]
            .total_cmp(&other.free[0])
            .then(self.free[1].total_cmp(&other.free[1]))
            .then(self.owed[0].total_cmp(&other.owed[0]))
            .then(self.owed[1].total_cmp(&other.owed[1]))
            .then(self.last.total_cmp(&other.last))
            .then_with(|| {
                ready
                    .map(|(a, b)| a.total_cmp(b))
                    .find(|o| o.is_ne())
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
    }
}

impl Problem {
    /// Pending ops of a state (every run together).
    fn pending(&self, n: &[u16; COUNTS]) -> usize {
        usize::from(n[0] - n[self.kinds - 1])
    }

    /// Raises every pending op's ready time to at least its machine's free time (see [`State`]).
    fn settle<const N: usize>(&self, st: &mut State<N>) {
        let raise = |ts: &mut [f64], free: f64| {
            for t in ts {
                if *t < free {
                    *t = free;
                }
            }
        };
        if self.machines == 1 {
            let len = self.pending(&st.n);
            raise(&mut st.t[..len], st.free[0]);
            return;
        }
        let mut at = 0;
        for c in 1..self.kinds {
            let len = st.c(c - 1) - st.c(c);
            raise(&mut st.t[at..at + len], st.free[self.machine[c]]);
            at += len;
        }
    }

    /// Keeps each machine's merged rests as their total, the upper stage's first
    /// (`min(total, n[upper I])`), so that equal totals are one count (see [`search`]).
    fn canonical(&self, n: &mut [u16; COUNTS], merged: [bool; 2]) {
        for mm in (0..self.machines).filter(|&mm| merged[mm]) {
            let (ru, rl) = (KINDS + 2 * mm, KINDS + 2 * mm + 1);
            let total = n[ru] + n[rl];
            n[ru] = total.min(n[self.inputs[mm][0]]);
            n[rl] = total - n[ru];
        }
    }

    /// Stage-microbatches machine `m` holds in state `n`.
    fn held(&self, n: &[u16; COUNTS], m: usize) -> usize {
        let [a, b] = self.forwards[m];
        usize::from(n[a] + n[b]) - usize::from(n[KINDS + 2 * m] + n[KINDS + 2 * m + 1])
    }
}

/// The value of rank `r`'s own problem for lower stage `s >= 1` and upper stage `u > s`, `m`
/// microbatches, at most `cap` stage-microbatches held (exact unless [`thin`] merged states);
/// `None` when too large.
pub(super) fn own_problem(chain: &Chain, s: usize, u: usize, m: usize, cap: usize) -> Option<Own> {
    let pb = one_rank(chain, [s, u], m, cap)?;
    let answer = {
        let mut recent = RECENT.lock().unwrap_or_else(PoisonError::into_inner);
        match recent.iter().find(|(p, _)| *p == pb) {
            Some((_, answer)) => answer.clone(),
            None => {
                let answer = Arc::new(OnceLock::new());
                if recent.len() >= RECENT_KEPT {
                    recent.remove(0);
                }
                recent.push((pb.clone(), answer.clone()));
                answer
            }
        }
    };
    *answer.get_or_init(|| search::<MAX_CAP>(&pb, MAX_TRIES, usize::MAX, true))
}

/// The answers of [`own_problem`] to its last few problems (the answer's cell made before the
/// search, so that a second asker waits for the first's answer instead of searching too). One
/// request's makespan bound and span bound ask the same problem, and `auto` computes the two side
/// by side: at P = 16, M = 128 under V-Half's limit the search takes 0.1 s, a quarter of a bound.
/// The same problem gives the same answer (the search is deterministic), so this changes no value.
#[allow(clippy::type_complexity)]
static RECENT: Mutex<Vec<(Problem, Arc<OnceLock<Option<Own>>>)>> = Mutex::new(Vec::new());

/// How many problems [`RECENT`] keeps (the oldest dropped first).
const RECENT_KEPT: usize = 4;

/// Most pending microbatches [`pair_problem`] affords (it keeps their ready times inline).
pub(super) const PAIR_PENDING: usize = 32;

/// The value of the two-rank problem of section 14: the tip rank (stages `P - 1` and `P`) and rank
/// `q` (`1 <= q <= P - 2`, stages `q` and `2P - 1 - q`) on V-shape, `m` microbatches, at most
/// `caps` stage-microbatches held on each (rank `q`'s first), within `budget` tries; `None` when it
/// does not apply or is too large.
pub(super) fn pair_problem(
    chain: &Chain,
    ranks: usize,
    q: usize,
    m: usize,
    caps: [usize; 2],
    budget: usize,
) -> Option<Own> {
    search::<PAIR_PENDING>(
        &two_ranks(chain, ranks, q, m, caps)?,
        budget,
        MAX_COMPARED,
        true,
    )
}

/// The two-rank problem of section 14 (`None` when it does not apply).
fn two_ranks(chain: &Chain, ranks: usize, q: usize, m: usize, caps: [usize; 2]) -> Option<Problem> {
    if ranks < 3 || q == 0 || q + 2 > ranks || chain.forward.len() != 2 * ranks || m == 0 {
        return None;
    }
    let [a, b, c, d] = [q, ranks - 1, ranks, 2 * ranks - 1 - q];
    let dur = [
        chain.forward[a],
        chain.forward[b],
        chain.forward[c],
        chain.forward[d],
        chain.input[d],
        chain.input[c],
        chain.input[b],
        chain.input[a],
    ];
    let delay = [
        chain.forward_gap(a, b),
        chain.forward_gap(b, c),
        chain.forward_gap(c, d),
        chain.up[d],
        chain.backward_gap(d, c),
        chain.backward_gap(c, b),
        chain.backward_gap(b, a),
        0.0,
    ];
    Some(Problem {
        kinds: 8,
        machines: 2,
        dur,
        machine: [0, 1, 1, 0, 0, 1, 1, 0],
        delay,
        head: chain.head_f[a],
        spacing: chain.forward[..a].iter().copied().fold(0.0, f64::max),
        tail: chain.down[a],
        forwards: [[0, 3], [1, 2]],
        inputs: [[4, 7], [5, 6]],
        rests: [
            [chain.rest[d], chain.rest[a]],
            [chain.rest[c], chain.rest[b]],
        ],
        cap: caps,
        microbatches: m,
        filler: caps.iter().all(|&c| c >= 2 * m),
    })
}

/// The one-rank problem of section 13 (`None` when it does not apply or is too large).
fn one_rank(chain: &Chain, [s, u]: [usize; 2], m: usize, cap: usize) -> Option<Problem> {
    if s == 0 || u <= s || m == 0 || 6 * m > MAX_OPS || !(2..=MAX_CAP).contains(&cap) {
        return None;
    }
    let mut dur = [0.0; KINDS];
    let mut delay = [0.0; KINDS];
    dur[..4].copy_from_slice(&[
        chain.forward[s],
        chain.forward[u],
        chain.input[u],
        chain.input[s],
    ]);
    delay[..3].copy_from_slice(&[
        chain.forward_gap(s, u),
        chain.up[u],
        chain.backward_gap(u, s),
    ]);
    Some(Problem {
        kinds: 4,
        machines: 1,
        dur,
        machine: [0; KINDS],
        delay,
        head: chain.head_f[s],
        spacing: chain.forward[..s].iter().copied().fold(0.0, f64::max),
        tail: chain.down[s],
        forwards: [[0, 1], [0, 1]],
        inputs: [[2, 3], [2, 3]],
        rests: [[chain.rest[u], chain.rest[s]]; 2],
        cap: [cap, cap],
        microbatches: m,
        filler: false,
    })
}

/// The search over the sequences of op kinds, layer by layer, within `budget` tries; rests of
/// equal work on one machine are one kind where `merge_rests` (the tests compare both ways).
fn search<const N: usize>(
    pb: &Problem,
    budget: usize,
    max_compared: usize,
    merge_rests: bool,
) -> Option<Own> {
    let m = pb.microbatches;
    // Each pending microbatch holds a slot of the first kind's machine, so at most its cap.
    if m == 0 || pb.cap[pb.machine[0]].min(m) > N || u16::try_from(m).is_err() {
        return None;
    }
    let k = pb.kinds;
    // With equal rests on a machine, which stage's rest runs is immaterial: both free one slot,
    // and a rest is due while fewer have run than input gradients (of either stage), whichever
    // ran. So only their total counts, kept as the upper stage's first (`min(total, n[upper I])`),
    // the lower's after.
    let merged = [0, 1].map(|mm| merge_rests && pb.rests[mm][0] == pb.rests[mm][1]);
    let rest_ops = if pb.filler { 0 } else { 2 * pb.machines * m };
    let ops = k * m + rest_ops;
    let options = k + if pb.filler { 0 } else { 2 * pb.machines };
    let per_layer = (budget / (ops * options)).max(1);
    let mut layer: Vec<State<N>> = vec![State {
        n: [0; COUNTS],
        free: [0.0; 2],
        owed: [0.0; 2],
        last: 0.0,
        t: [0.0; N],
    }];
    let mut thinned = false;
    // Comparisons between states: a layer's fronts grow before it is thinned, so the budget of
    // tries alone does not bound the time; past `max_compared` the search gives up.
    let mut compared = 0usize;
    for _ in 0..ops {
        if compared > max_compared {
            return None;
        }
        let mut next: Fronts<N> = Fronts::default();
        for st in &layer {
            let n = st.n;
            let len = pb.pending(&n);
            // The chain's kinds.
            for c in 0..k {
                let mm = pb.machine[c];
                let room = || pb.held(&n, mm) < pb.cap[mm];
                let takes_slot = pb.forwards[mm].contains(&c);
                let ready = if c == 0 {
                    if st.c(0) >= m || !room() {
                        continue;
                    }
                    pb.head + st.c(0) as f64 * pb.spacing
                } else {
                    if st.c(c) >= st.c(c - 1) || (takes_slot && !room()) {
                        continue;
                    }
                    st.t[st.c(0) - st.c(c - 1)]
                };
                let start = st.free[mm].max(ready);
                let end = start + pb.dur[c];
                let mut new = st.clone();
                if pb.filler {
                    // The gap before the op runs rests owed; an input gradient makes its own due.
                    new.owed[mm] = (new.owed[mm] - (start - st.free[mm])).max(0.0);
                    if let Some(j) = pb.inputs[mm].iter().position(|&i| i == c) {
                        new.owed[mm] += pb.rests[mm][j];
                    }
                }
                let mut len = len;
                if c > 0 {
                    new.take(st.c(0) - st.c(c - 1), len);
                    len -= 1;
                }
                if c + 1 < k {
                    // The end of run `c + 1` (one before it where run `c` lost its first).
                    let at = st.c(0) - st.c(c + 1) - usize::from(c > 0);
                    new.put(at, len, end + pb.delay[c]);
                } else {
                    new.last = end;
                }
                new.n[c] += 1;
                new.free[mm] = end;
                pb.canonical(&mut new.n, merged);
                pb.settle(&mut new);
                let len = pb.pending(&new.n);
                compared += insert(next.entry(new.n).or_default(), new, len);
            }
            // The rests, each due once its input gradient ran (on the same machine, so ready).
            for mm in (0..pb.machines).filter(|_| !pb.filler) {
                let [iu, il] = pb.inputs[mm];
                let (ru, rl) = (KINDS + 2 * mm, KINDS + 2 * mm + 1);
                let due = [st.c(iu) > st.c(ru), st.c(il) > st.c(rl)];
                for (j, &is_due) in due.iter().enumerate() {
                    if merged[mm] && j == 1 {
                        break;
                    }
                    let total = st.c(ru) + st.c(rl);
                    if (merged[mm] && total >= st.c(iu) + st.c(il)) || (!merged[mm] && !is_due) {
                        continue;
                    }
                    let mut new = st.clone();
                    new.free[mm] += pb.rests[mm][j];
                    new.n[KINDS + 2 * mm + j] += 1;
                    pb.canonical(&mut new.n, merged);
                    pb.settle(&mut new);
                    compared += insert(next.entry(new.n).or_default(), new, len);
                }
            }
        }
        let merged_some;
        (layer, merged_some) = thin(pb, next, per_layer);
        thinned |= merged_some;
    }
    let makespan = layer
        .iter()
        .map(|st| {
            (st.free[0] + st.owed[0])
                .max(st.free[1] + st.owed[1])
                .max(st.last + pb.tail)
        })
        .fold(f64::INFINITY, f64::min);
    let first_span = layer
        .iter()
        .map(|st| st.last + pb.tail)
        .fold(f64::INFINITY, f64::min);
    Some(Own {
        makespan,
        first_span,
        thinned,
    })
}

/// The next layer from `fronts` (the undominated states per count), at most about `most` states:
/// where there are more, each count's states (in order of the machines' free times) are cut into
/// runs and every run becomes one state with the least of each of its times. That state is no
/// worse than any of its run in every time, and every step of the search keeps that order (each
/// time is a maximum and a sum of times), so what follows from it is no later than what follows
/// from any of them: the search's value stays a lower bound, only no longer always the least.
/// Also says whether it merged any.
fn thin<const N: usize>(pb: &Problem, fronts: Fronts<N>, most: usize) -> (Vec<State<N>>, bool) {
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
    for (n, mut front) in fronts {
        if front.len() <= runs {
            out.extend(front);
            continue;
        }
        merged = true;
        let len = pb.pending(&n);
        front.sort_by(|a, b| a.by_times(b, len));
        let size = front.len();
        for j in 0..runs {
            let run = &front[j * size / runs..(j + 1) * size / runs];
            out.push(least(run));
        }
    }
    (out, merged)
}

/// The state with the least of each time over `run` (same counts, at least one state).
fn least<const N: usize>(run: &[State<N>]) -> State<N> {
    let mut out = run[0].clone();
    for st in &run[1..] {
        out.free[0] = out.free[0].min(st.free[0]);
        out.free[1] = out.free[1].min(st.free[1]);
        out.owed[0] = out.owed[0].min(st.owed[0]);
        out.owed[1] = out.owed[1].min(st.owed[1]);
        out.last = out.last.min(st.last);
        for (t, &v) in out.t.iter_mut().zip(&st.t) {
            *t = t.min(v);
        }
    }
    out
}

/// Adds `new` to `states` (all of its counts, `len` pending ops) unless one of them covers it,
/// dropping those it covers; returns the comparisons made.
fn insert<const N: usize>(states: &mut Vec<State<N>>, new: State<N>, len: usize) -> usize {
    let before = states.len();
    if states.iter().any(|o| o.covers(&new, len)) {
        return before;
    }
    states.retain(|o| !new.covers(o, len));
    states.push(new);
    2 * before
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
                let pb = one_rank(&chain, su, m, cap).expect(&case);
                let exact = search::<MAX_CAP>(&pb, usize::MAX / 64, usize::MAX, true).expect(&case);
                let apart =
                    search::<MAX_CAP>(&pb, usize::MAX / 64, usize::MAX, false).expect(&case);
                assert!((exact.makespan - apart.makespan).abs() < 1e-9, "{case}");
                assert!((exact.first_span - apart.first_span).abs() < 1e-9, "{case}");
                let thin = search::<MAX_CAP>(&pb, 36 * m, usize::MAX, true).expect(&case);
                // The same every time (the merged runs do not depend on a map's random order).
                assert_eq!(
                    Some(thin),
                    search::<MAX_CAP>(&pb, 36 * m, usize::MAX, true),
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

    /// The two-rank problem with rests as filler equals the optimum CP-SAT proves for the same
    /// relaxation (`scripts/optimum/vshape_optimum.py target/release/pipefill P M --limits 2x
    /// --objectives makespan --ratios R --transfers T --machines q,P-1`: only those two ranks run
    /// one action at a time, every other rank is the chain's delays; the limit binds nothing), on
    /// V-shape with transfers and uneven `F:I:W`, without merging states.
    #[test]
    fn the_pair_problem_reaches_cp_sat_s_two_rank_optima() {
        for (ranks, m, fiw, share, q, optimum) in [
            (4, 4, [2.0, 2.0, 1.0], 0.1, 1, 25.3),
            (4, 4, [1.0, 1.2, 0.8], 0.1, 2, 14.7),
            (5, 7, [1.0, 1.2, 0.8], 0.1, 1, 23.4),
            (6, 6, [1.0, 1.0, 1.0], 0.0, 1, 20.5),
            (6, 6, [2.0, 2.0, 1.0], 0.1, 1, 39.3),
            (6, 6, [2.0, 2.0, 1.0], 0.1, 2, 39.3),
            (7, 7, [2.0, 2.0, 1.0], 0.1, 1, 46.5),
            (8, 8, [2.0, 2.0, 1.0], 0.1, 1, 53.3),
            (8, 8, [2.0, 2.0, 1.0], 0.1, 2, 53.3),
        ] {
            let (chain, _) = tip(ranks, fiw, share);
            let case = format!("P {ranks} M {m} {fiw:?} {share} q {q}");
            let pb = two_ranks(&chain, ranks, q, m, [2 * m; 2]).expect(&case);
            let pair = search::<PAIR_PENDING>(&pb, usize::MAX / 64, usize::MAX, true).expect(&case);
            assert!(!pair.thinned, "{case}");
            assert!((pair.makespan - optimum).abs() < 1e-9, "{case}: {pair:?}");
            assert!(pair.first_span <= pair.makespan + 1e-9, "{case}: {pair:?}");
        }
    }

    /// Rests as filler relax rests as op kinds (each rest whole, in its own place), so the pair
    /// problem's value with them is never above its value without them, and neither is the tip's
    /// own problem's (the pair keeps all of the tip's ops and more).
    #[test]
    fn filler_rests_only_relax() {
        for (ranks, m, fiw, share) in [
            (4, 3, [2.0, 2.0, 1.0], 0.1),
            (4, 3, [1.0, 1.2, 0.8], 0.0),
            (5, 3, [1.0, 2.0, 0.5], 0.3),
        ] {
            let (chain, su) = tip(ranks, fiw, share);
            for q in 1..ranks - 1 {
                let case = format!("P {ranks} M {m} {fiw:?} {share} q {q}");
                let mut pb = two_ranks(&chain, ranks, q, m, [2 * m; 2]).expect(&case);
                assert!(pb.filler, "{case}");
                let filler =
                    search::<PAIR_PENDING>(&pb, usize::MAX / 64, usize::MAX, true).expect(&case);
                pb.filler = false;
                let whole =
                    search::<PAIR_PENDING>(&pb, usize::MAX / 64, usize::MAX, true).expect(&case);
                let tip = own_problem(&chain, su[0], su[1], m, 2 * m).expect(&case);
                assert!(!filler.thinned && !whole.thinned, "{case}");
                assert!(filler.makespan <= whole.makespan + 1e-9, "{case}");
                assert!(filler.first_span <= whole.first_span + 1e-9, "{case}");
                assert!(tip.makespan <= whole.makespan + 1e-9, "{case}");
            }
        }
    }
}
