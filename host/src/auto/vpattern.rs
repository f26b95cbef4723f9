//! V-Half and V-Min as their authors build them (Qi et al., "Pipeline Parallelism with
//! Controllable Memory"; the construction re-derived and written anew): origin `v-pattern`, for
//! `--placement vshape` (`V = 2`) only.
//!
//! Time is cut into unit slots. Each rank repeats a *stable pattern* every six slots: the slot
//! offsets of its chunk-0 forward, chunk-1 forward, chunk-1 input gradient and chunk-0 input
//! gradient (V-Min's pattern keeps about a third of 1F1B's memory, V-Half's half). The `W`s go into
//! the free slots, oldest first. Then the warm-up and the cool-down are *squeezed*: in slot order,
//! every action outside the steady state moves to the earliest free slot after its inputs where the
//! rank's peak memory stays what the pattern needs; the slots are compacted by an eager unit-time
//! pass; the `W`s are taken out and the cool-down squeezed again without them; and the `W`s go back
//! into the free slots, now per chunk (chunk-1's first). Each rank's list is its actions in slot
//! order. Memory is counted as the simulator does in microbatches in flight: a forward holds one
//! chunk unit, an `I` releases nothing, a `W` releases its unit.
//!
//! The lists do not depend on the costs: the simulator times them with the request's per-stage
//! times and transfers, and they are a candidate wherever their peak fits the limit.

use crate::schedule::{Action, Op, Placement};

use super::instance::Instance;

/// Slot lists of one rank: per kind (0 F chunk 0, 1 F chunk 1, 2 I chunk 1, 3 I chunk 0, then `W`
/// lists), the slot of each microbatch in order.
type Lists = Vec<Vec<i64>>;

/// What a kind does to memory at its slot (chunk units); index 4 is a `W` of either chunk.
const MEMORY: [i64; 5] = [1, 1, 0, 0, -1];

/// The stable pattern of V-Min (`half == false`) or V-Half: per rank, the four offsets.
fn pattern(p: usize, half: bool) -> Vec<[i64; 4]> {
    let p = p as i64;
    (0..p)
        .map(|i| {
            if half {
                let gap = if p % 2 == 0 { 3 } else { 0 };
                [
                    2 * i,
                    3 * p - i - 2,
                    3 * p + gap + 2 * i - 1,
                    6 * p + gap - i - 2,
                ]
            } else {
                let gap = if p % 3 == 0 { 2 } else { 0 };
                [i, 2 * p - i - 1, 2 * p + gap + i, 4 * p + gap - i - 1]
            }
        })
        .collect()
}

/// Kind, microbatch of every item of `lists` in slot order (ties by kind).
fn in_order(lists: &Lists) -> Vec<(i64, usize, usize)> {
    let mut all: Vec<(i64, usize, usize)> = lists
        .iter()
        .enumerate()
        .flat_map(|(kind, l)| l.iter().enumerate().map(move |(k, &t)| (t, kind, k)))
        .collect();
    all.sort_unstable();
    all
}

/// Slot, rank, kind, microbatch of every item of every rank, in slot order (ties by rank, kind).
fn every_item(all: &[Lists]) -> Vec<(i64, usize, usize, usize)> {
    let mut items: Vec<(i64, usize, usize, usize)> = all
        .iter()
        .enumerate()
        .flat_map(|(r, l)| {
            in_order(l)
                .into_iter()
                .map(move |(t, kind, k)| (t, r, kind, k))
        })
        .collect();
    items.sort_unstable();
    items
}

/// Adds the `W`s into the free slots, oldest first: one list, or with `split` one per chunk
/// (chunk 1's, kind 2, first when both wait).
fn put_w(mut lists: Lists, split: bool) -> Lists {
    let order = in_order(&lists);
    let last = order.last().map_or(0, |e| e.0);
    let mut waiting = [0usize; 2];
    let mut w: [Vec<i64>; 2] = [Vec::new(), Vec::new()];
    let mut items = order.iter().peekable();
    for slot in 0..=last {
        if let Some(&&(t, kind, _)) = items.peek() {
            if t == slot {
                items.next();
                if kind == 2 || kind == 3 {
                    waiting[if split { kind - 2 } else { 0 }] += 1;
                }
                continue;
            }
        }
        if let Some(c) = (0..2).find(|&c| waiting[c] > 0) {
            w[c].push(slot);
            waiting[c] -= 1;
        }
    }
    let mut slot = last;
    for c in 0..2 {
        for _ in 0..waiting[c] {
            slot += 1;
            w[c].push(slot);
        }
    }
    let [w0, w1] = w;
    lists.push(w0);
    if split {
        lists.push(w1);
    }
    lists
}

/// The rank's peak memory in chunk units; without `W` lists each waiting `W` runs in the next free
/// slot.
fn peak(lists: &Lists) -> i64 {
    let has_w = lists.len() > 4;
    let order = in_order(lists);
    let last = order.last().map_or(0, |e| e.0);
    let (mut now, mut most, mut waiting) = (0i64, 0i64, 0usize);
    let mut items = order.iter().peekable();
    for slot in 0..=last {
        match items.peek() {
            Some(&&(t, kind, _)) if t == slot => {
                items.next();
                now += MEMORY[kind.min(4)];
                if kind == 2 || kind == 3 {
                    waiting += 1;
                }
            }
            _ if !has_w && waiting > 0 => {
                now -= 1;
                waiting -= 1;
            }
            _ => {}
        }
        most = most.max(now);
    }
    most
}

/// The slot before which item `(r, kind, k)` cannot run: its inputs (the neighbour rank's item of
/// the same kind, the same rank's previous kind) and the previous microbatch of its kind.
fn ready(all: &[Lists], r: usize, kind: usize, k: usize) -> Option<i64> {
    let p = all.len();
    let mut deps: Vec<Option<i64>> = Vec::new();
    if (kind == 0 || kind == 2) && r > 0 {
        deps.push(all[r - 1][kind].get(k).copied());
    }
    if (kind == 1 || kind == 3) && r + 1 < p {
        deps.push(all[r + 1][kind].get(k).copied());
    }
    if (1..4).contains(&kind) {
        deps.push(all[r][kind - 1].get(k).copied());
    }
    if kind == 4 {
        let mut is: Vec<i64> = all[r][2].iter().chain(&all[r][3]).copied().collect();
        is.sort_unstable();
        deps.push(is.get(k).copied());
    }
    if k > 0 {
        deps.push(all[r][kind].get(k - 1).copied());
    }
    deps.into_iter()
        .try_fold(-1, |at: i64, d| d.map(|d| at.max(d)))
        .map(|at| at + 1)
}

/// Squeezes the warm-up (only with `W`s in the lists) and the cool-down: see the module docs.
/// `None` when an item comes before its inputs (a pattern that does not fit `P`).
fn squeeze(mut all: Vec<Lists>, with_w: bool) -> Option<Vec<Lists>> {
    if with_w {
        all = all.into_iter().map(|l| put_w(l, false)).collect();
    }
    let limit = all.iter().map(peak).max()?;
    let items = every_item(&all);
    let m = all.first()?.first()?.len();
    let mut taken: Vec<Vec<bool>> = all
        .iter()
        .map(|l| vec![false; in_order(l).last().map_or(0, |e| e.0 as usize + 1)])
        .collect();
    let mut phase = 0;
    for (t, r, kind, k) in items {
        if kind == 3 && r == 0 && phase == 0 {
            phase = 1;
        }
        let keep = if phase == 1 {
            if kind == 0 && k + 1 == m {
                phase = 2;
            }
            true
        } else {
            phase == 0 && !with_w
        };
        if !keep {
            let from = ready(&all, r, kind, k)?;
            if from > t {
                return None;
            }
            for slot in from..t {
                if !taken[r][slot as usize] {
                    all[r][kind][k] = slot;
                    if peak(&all[r]) <= limit {
                        break;
                    }
                }
                all[r][kind][k] = t;
            }
        }
        taken[r][all[r][kind][k] as usize] = true;
    }
    if !with_w {
        all = all.into_iter().map(|l| put_w(l, false)).collect();
    }
    eager(&all)
}

/// The slots compacted: every item as early as its inputs, its kind's previous microbatch and the
/// rank's previous item allow, in slot order, each taking one slot.
fn eager(all: &[Lists]) -> Option<Vec<Lists>> {
    let items = every_item(all);
    let unset = i64::MIN;
    let mut out: Vec<Lists> = all
        .iter()
        .map(|l| l.iter().map(|x| vec![unset; x.len()]).collect())
        .collect();
    let mut last = vec![-1i64; all.len()];
    let p = all.len();
    for (_, r, kind, k) in items {
        let mut at = last[r] + 1;
        let mut need = |v: i64| {
            if v == unset {
                return None;
            }
            at = at.max(v + 1);
            Some(())
        };
        if (kind == 0 || kind == 2) && r > 0 {
            need(out[r - 1][kind][k])?;
        }
        if (kind == 1 || kind == 3) && r + 1 < p {
            need(out[r + 1][kind][k])?;
        }
        if (1..4).contains(&kind) {
            need(out[r][kind - 1][k])?;
        }
        if k > 0 {
            need(out[r][kind][k - 1])?;
        }
        out[r][kind][k] = at;
        last[r] = at;
    }
    Some(out)
}

/// V-Min's (`half == false`) or V-Half's per-rank lists for the instance; `None` off V-shape or
/// when the pattern does not fit `P`.
pub(crate) fn build(inst: &Instance, half: bool) -> Option<Vec<Vec<Action>>> {
    if inst.v != 2 || inst.placement != Placement::Vshape {
        return None;
    }
    let (p, m) = (inst.p, inst.m);
    let start: Vec<Lists> = pattern(p, half)
        .iter()
        .map(|offsets| {
            offsets
                .iter()
                .map(|&x| (0..m as i64).map(|k| x + 6 * k).collect())
                .collect()
        })
        .collect();
    let strip = |all: Vec<Lists>| -> Vec<Lists> {
        all.into_iter()
            .map(|mut l| {
                l.truncate(4);
                l
            })
            .collect()
    };
    let once = squeeze(start, true)?;
    let twice = squeeze(strip(once), false)?;
    let last: Vec<Lists> = strip(twice).into_iter().map(|l| put_w(l, true)).collect();
    let orders = last
        .iter()
        .enumerate()
        .map(|(r, lists)| {
            let (lo, hi) = (r, 2 * p - 1 - r);
            in_order(lists)
                .into_iter()
                .map(|(_, kind, k)| {
                    let (op, stage) = match kind {
                        0 => (Op::F, lo),
                        1 => (Op::F, hi),
                        2 => (Op::I, hi),
                        3 => (Op::I, lo),
                        4 => (Op::W, hi),
                        _ => (Op::W, lo),
                    };
                    Action::new(op, stage, k)
                })
                .collect()
        })
        .collect();
    Some(orders)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::score::schedule_of;
    use crate::auto::vgreedy::tests::{fits, instance};
    use crate::sim::simulate;

    /// V-Half and V-Min are valid schedules for every `P` and `M` tried, under uneven costs and
    /// transfers; V-Min never holds more than V-Half, and V-Half less than 1F1B's `P` from `P = 4`.
    #[test]
    fn v_half_and_v_min_validate_and_keep_their_memory() {
        for p in 1..=8 {
            for m in [p, 2 * p, 4 * p] {
                let inst = instance(p, m, [1.0, 1.2, 0.8], 0.1, true, 4.0 * p as f64);
                let mut peaks = Vec::new();
                for half in [true, false] {
                    let orders = build(&inst, half)
                        .unwrap_or_else(|| panic!("P={p} M={m} half={half}: no schedule"));
                    let what = format!("P={p} M={m} half={half}");
                    peaks.push(fits(&inst, &orders, 4.0 * p as f64, &what));
                }
                assert!(peaks[1] <= peaks[0] + 1e-9, "P={p} M={m}: {peaks:?}");
                if p >= 4 {
                    assert!(peaks[0] < p as f64, "P={p} M={m}: {peaks:?}");
                }
            }
        }
    }

    /// With equal unit costs and no transfers, V-Half's steady state has no idle slot: the step is
    /// within `6P` slots (the warm-up and cool-down) of the `6M` slots of work per rank.
    #[test]
    fn v_half_steady_state_is_dense() {
        for p in [4, 6, 8] {
            let m = 4 * p;
            let inst = instance(p, m, [3.0, 3.0, 3.0], 0.0, false, 2.0 * p as f64);
            let orders = build(&inst, true).unwrap();
            let sim = simulate(&schedule_of(&inst, "auto", &orders), &inst.scoring).unwrap();
            let slot = 1.5;
            let work = 6.0 * m as f64 * slot;
            let makespan = sim.timeline.makespan();
            assert!(makespan >= work);
            assert!(
                makespan <= work + 6.0 * p as f64 * slot,
                "P={p}: {makespan} vs {work}"
            );
        }
    }
}
