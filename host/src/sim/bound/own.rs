//! Section 13 of the [simulator's docs](crate::sim#lower-bound): the tip rank's own problem,
//! solved exactly.
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
//! that matters (the machine's free time, the last `I(s)`'s end, and the ends the pending ops wait
//! for). Its least `max(machine end, last I(s) end + down(s))` bounds the makespan, and its least
//! `last I(s) end + down(s)` the span of the rank that holds stage 0 (the gradient chain ends
//! there, and every time counts from that rank's first action, the step's start).

use std::collections::HashMap;

use super::chain::Chain;

/// Most states the search may try (each compared with the kept states of its counts); past it the
/// search gives up (no term).
const MAX_TRIES: usize = 60_000;

/// Most stage-microbatches held at once for which the bound runs the search (at P = 4, V-Half's
/// limit; at 8 the states already outgrow [`MAX_TRIES`] at M = 8).
pub(super) const MAX_CAP: usize = 6;

/// Most op kinds a search may handle (`6 M`).
const MAX_OPS: usize = 6 * 64;

/// The two values of [`own_problem`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Own {
    /// A lower bound on the makespan.
    pub makespan: f64,
    /// A lower bound on the span of the rank that holds stage 0.
    pub first_span: f64,
}

/// One state: counts of each op kind done (F(s), F(u), I(u), I(s), rest of u, rest of s), the
/// machine's free time, the last `I(s)` end, and the ends the pending ops wait for.
#[derive(Debug, Clone)]
struct State {
    n: [usize; 6],
    free: f64,
    last_d: f64,
    /// Ends of `F(s, k)` for `k` in `n[1]..n[0]` (the `F(u)` waiting for them).
    a_end: Vec<f64>,
    /// Ends of `F(u, k)` for `k` in `n[2]..n[1]`.
    b_end: Vec<f64>,
    /// Ends of `I(u, k)` for `k` in `n[3]..n[2]`.
    c_end: Vec<f64>,
}

impl State {
    /// Whether `self` is no worse than `other` in every time (same counts).
    fn covers(&self, other: &State) -> bool {
        let le = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x <= y);
        self.free <= other.free
            && self.last_d <= other.last_d
            && le(&self.a_end, &other.a_end)
            && le(&self.b_end, &other.b_end)
            && le(&self.c_end, &other.c_end)
    }
}

/// The exact value of rank `r`'s own problem for lower stage `s >= 1` and upper stage `u > s`, `m`
/// microbatches, at most `cap` stage-microbatches held; `None` when too large.
pub(super) fn own_problem(chain: &Chain, s: usize, u: usize, m: usize, cap: usize) -> Option<Own> {
    if s == 0 || u <= s || m == 0 || 6 * m > MAX_OPS || cap < 2 {
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
        a_end: Vec::new(),
        b_end: Vec::new(),
        c_end: Vec::new(),
    }];
    let mut tries = 0;
    for _ in 0..6 * m {
        let mut next: HashMap<[usize; 6], Vec<State>> = HashMap::new();
        for st in &layer {
            let n = st.n;
            let held = (n[0] - n[5]) + (n[1] - n[4]);
            for (kind, &work) in dur.iter().enumerate() {
                let ready = match kind {
                    0 if n[0] < m && held < cap => head + n[0] as f64 * spacing,
                    1 if n[1] < n[0] && held < cap => st.a_end[0] + d_ab,
                    2 if n[2] < n[1] => st.b_end[0] + d_bc,
                    3 if n[3] < n[2] => st.c_end[0] + d_cd,
                    4 if n[4] < n[2] => 0.0,
                    5 if n[5] < n[3] => 0.0,
                    _ => continue,
                };
                let end = st.free.max(ready) + work;
                let mut new = st.clone();
                new.n[kind] += 1;
                new.free = end;
                match kind {
                    0 => new.a_end.push(end),
                    1 => {
                        new.a_end.remove(0);
                        new.b_end.push(end);
                    }
                    2 => {
                        new.b_end.remove(0);
                        new.c_end.push(end);
                    }
                    3 => {
                        new.c_end.remove(0);
                        new.last_d = end;
                    }
                    _ => {}
                }
                insert(next.entry(new.n).or_default(), new);
                tries += 1;
                if tries > MAX_TRIES {
                    return None;
                }
            }
        }
        layer = next.into_values().flatten().collect();
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
    })
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
