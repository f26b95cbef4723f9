//! Pairing: overlapped forward/backward pairs formed where overlap saves time.
//!
//! Where the cost model lets a forward and a backward run at once in less than their sum
//! (`overlap_share` below 1; the CLI's default is 0, a pair takes the longer half), a schedule built
//! of single actions leaves that saving unused. The constructions and most moves build single
//! actions; the families `dualpipev` and `dualpipev-slack` have pairs but need more memory than
//! 1F1B's. This pass joins, on each rank, a single forward and a single backward (`I` or `B`) of
//! another microbatch that stand next to each other in the list when, in the simulated run, both
//! were ready by the time the first of them started: the pair starts then and ends no later than
//! the second would have, so the rank gets free time while no input waits longer (what the
//! forward feeds comes out when the pair ends, which can be later; the simulation decides).
//!
//! Each pass joins every such neighbour at once and is kept when the schedule simulates no worse
//! within the memory limit; passes repeat while they are kept and find something to join. At
//! P = 16, M = 128, V = 2 under 1F1B's memory (F:I:W 1:1.2:0.8, transfers 0.1 of F), two passes
//! take `auto`'s 400.1 to 349.0; random joins one at a time, each simulated, needed about 9000
//! simulations for as much (a prototype, not kept).

use crate::schedule::{Action, Item, Op, Schedule};
use crate::sim::{simulate_with, SimOptions};

use super::improve::{self, Work};
use super::instance::Instance;
use super::score::{Checks, Scored};
use super::Objective;

/// The most passes one call runs (each costs two simulations; at P = 16, M = 128 the second
/// already finds almost nothing to join).
const MAX_PASSES: usize = 8;

/// Whether an overlapped pair runs shorter than its halves one after the other on some stage
/// (`overlap_share` below 1 and both halves take time).
pub(crate) fn pairs_save(inst: &Instance) -> bool {
    inst.scoring.overlap_share < 1.0
        && inst
            .scoring
            .stages
            .iter()
            .any(|c| c.forward > 0.0 && c.backward_input > 0.0)
}

/// Joins neighbours into overlapped pairs on `best` while a pass is no worse (module docs); only
/// where overlap saves time ([`pairs_save`]). Returns whether `best` got better.
pub(crate) fn pair_up(
    inst: &Instance,
    objective: Objective,
    best: &mut Scored,
    work: &mut Work,
) -> bool {
    if !pairs_save(inst) {
        return false;
    }
    let before = best.value;
    for _ in 0..MAX_PASSES {
        let Some(candidate) = joined(inst, &best.schedule) else {
            break;
        };
        match improve::evaluate(inst, objective, candidate, work, Checks::Reordered) {
            Some(s) if s.value <= best.value => *best = s,
            _ => break,
        }
    }
    best.value < before
}

/// `schedule` with every neighbouring single forward and single backward (of different
/// microbatches) joined into a pair where the simulated run had both ready when the first of them
/// started; `None` when nothing qualifies or the schedule does not simulate.
fn joined(inst: &Instance, schedule: &Schedule) -> Option<Schedule> {
    let sim = simulate_with(schedule, &inst.scoring, SimOptions::SPANS).ok()?;
    // Start and end of every action (a `B` as its `I`: its gradient leaves at its end).
    let slot = |a: Action| {
        let op = match a.op {
            Op::F => 0,
            Op::I | Op::B => 1,
            Op::W => 2,
        };
        inst.id(op, a.stage, a.microbatch)
    };
    let mut start = vec![f64::INFINITY; inst.actions()];
    let mut end = vec![f64::INFINITY; inst.actions()];
    for lane in &sim.timeline.spans {
        for span in lane {
            for a in span.item().actions() {
                start[slot(a)] = span.start;
                end[slot(a)] = span.end;
            }
        }
    }
    // When `a`'s inputs were there in that run.
    let ready = |a: Action| {
        let (x, k) = (a.stage, a.microbatch);
        match a.op {
            Op::F if x == 0 => 0.0,
            Op::F => end[inst.id(0, x - 1, k)] + inst.comm[x - 1],
            Op::I | Op::B if x + 1 == inst.s => end[inst.id(0, x, k)],
            Op::I | Op::B => end[inst.id(0, x, k)].max(end[inst.id(1, x + 1, k)] + inst.comm[x]),
            Op::W => end[inst.id(1, x, k)],
        }
    };
    let mut out = schedule.clone();
    let mut joins = 0;
    for (r, list) in schedule.actions.iter().enumerate() {
        let mut new = Vec::with_capacity(list.len());
        let mut i = 0;
        while i < list.len() {
            if let (Item::One(a), Some(&Item::One(b))) = (list[i], list.get(i + 1)) {
                let (forward, backward) = if a.op == Op::F { (a, b) } else { (b, a) };
                let fits = forward.op == Op::F
                    && matches!(backward.op, Op::I | Op::B)
                    && forward.microbatch != backward.microbatch;
                let first = start[slot(a)];
                if fits && ready(forward).max(ready(backward)) <= first + 1e-9 * first.max(1.0) {
                    new.push(Item::Overlap { forward, backward });
                    joins += 1;
                    i += 2;
                    continue;
                }
            }
            new.push(list[i]);
            i += 1;
        }
        out.actions[r] = new;
    }
    (joins > 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::score::score_with;
    use crate::auto::{AutoRequest, Objective};
    use crate::cost::{CostModel, LinkCost, StageCost};
    use crate::schedule::families::generate;
    use crate::schedule::{Params, Placement};

    fn costs(share: f64) -> CostModel {
        let link = LinkCost {
            latency: 0.1,
            bandwidth: f64::INFINITY,
        };
        let mut c = CostModel::uniform(StageCost::uniform(0.5, 0.6, 0.4), 8, link);
        c.overlap_share = share;
        c
    }

    fn instance(share: f64) -> Instance {
        let req = AutoRequest::new(4, 16, costs(share)).with_chunks(2, Placement::Vshape);
        Instance::new(&req).unwrap()
    }

    /// ZB-V at P = 4, M = 16 with free overlap: the pass joins, the result simulates shorter
    /// and holds no more than ZB-V; without free overlap it does nothing.
    #[test]
    fn zbv_gets_shorter_with_pairs_where_overlap_is_free() {
        let zbv = generate("zbv", &Params::new(4, 16).with_chunks(2)).unwrap();
        let inst = instance(0.0);
        let mut best = score_with(&inst, Objective::Makespan, zbv.clone(), Checks::Full)
            .unwrap()
            .unwrap();
        let (value, peak) = (best.value, best.peak.clone());
        let mut work = Work::new(1.0);
        assert!(pair_up(&inst, Objective::Makespan, &mut best, &mut work));
        assert!(best.value < value, "{} !< {value}", best.value);
        let pairs = best.schedule.actions.iter().flatten();
        assert!(pairs
            .filter(|i| matches!(i, Item::Overlap { .. }))
            .any(|i| i.actions().count() == 2));
        assert!(best.peak.iter().zip(&peak).all(|(a, b)| a <= b));
        crate::schedule::validate::validate(&best.schedule).unwrap();

        let inst = instance(1.0);
        let mut best = score_with(&inst, Objective::Makespan, zbv, Checks::Full)
            .unwrap()
            .unwrap();
        assert!(!pair_up(&inst, Objective::Makespan, &mut best, &mut work));
    }
}
