//! The forward-only pass: a schedule's forward order for evaluation (no stash kept, no gradients).
//!
//! [`forward_only`] keeps, on every rank, the schedule's `F` actions in the order it runs them (an
//! overlapped pair keeps its forward half) and drops every backward, transfer and gradient
//! reduction; [`lowered_items`](super::lower::lowered_items) then puts the activations' sends and
//! receives around them as for training. The runtimes execute the result as an evaluation step
//! ([`Executor::evaluate`](crate::runtime::Executor::evaluate)).
//!
//! Why it cannot deadlock when the schedule validates: an `F` needs only the `F` before it on its
//! microbatch, and the schedule's own dry run finished every `F` after those; keeping a subsequence
//! of each rank's list keeps that order, so the same run without the backwards finishes too. The
//! result does not validate itself (it is incomplete by design: no backward).

use super::{Item, ParamOp, Schedule};

/// `schedule`'s forward order: per rank, its `F` actions in list order (an overlapped pair's
/// forward half; FSDP's `UNSHARD` / `RESHARD` stay), nothing else. `P`, `V`, `M`, placement and
/// name are the schedule's. Transfers and reductions the schedule carried are dropped; lowering
/// puts the activations' sends and receives back.
///
/// ```
/// use pipefill_host::schedule::{families, forward_only::forward_only, Params};
/// let s = families::generate("1f1b", &Params::new(2, 3)).unwrap();
/// let f = forward_only(&s);
/// let text = |l: &[pipefill_host::schedule::Item]| {
///     l.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" ")
/// };
/// assert_eq!(text(&f.actions[0]), "0F0 0F1 0F2");
/// assert_eq!(text(&f.actions[1]), "1F0 1F1 1F2");
/// ```
pub fn forward_only(schedule: &Schedule) -> Schedule {
    let keep = |it: &Item| match *it {
        Item::One(a) if a.op == super::Op::F => Some(Item::One(a)),
        Item::Overlap { forward, .. } => Some(Item::One(forward)),
        Item::Param(p) if matches!(p.op, ParamOp::Unshard | ParamOp::Reshard) => Some(*it),
        _ => None,
    };
    let actions = schedule
        .actions
        .iter()
        .map(|l| l.iter().filter_map(keep).collect())
        .collect();
    Schedule {
        actions,
        ..schedule.clone()
    }
}

/// Whether `schedule` runs no backward at all (a forward-only schedule, as [`forward_only`] makes).
pub fn is_forward_only(schedule: &Schedule) -> bool {
    schedule
        .actions
        .iter()
        .flatten()
        .flat_map(Item::actions)
        .all(|a| a.op == super::Op::F)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::families::{self, FAMILIES};
    use crate::schedule::lower::{lower, lowered_items};
    use crate::schedule::{Action, Op, Params};

    #[test]
    fn every_family_keeps_each_forward_once_in_its_ranks_order() {
        for fam in FAMILIES {
            for (p, m) in [(2, 4), (4, 8)] {
                let Ok(s) = families::generate(fam.name, &Params::new(p, m)) else {
                    continue;
                };
                let f = forward_only(&s);
                assert!(is_forward_only(&f) && !is_forward_only(&s), "{}", fam.name);
                for r in 0..p {
                    let want: Vec<Action> = s.actions[r]
                        .iter()
                        .flat_map(Item::actions)
                        .filter(|a| a.op == Op::F)
                        .collect();
                    let got: Vec<Action> = f.actions[r].iter().flat_map(Item::actions).collect();
                    assert_eq!(got, want, "{} P{p} M{m} rank {r}", fam.name);
                }
                let forwards = f.actions.iter().flatten().count();
                assert_eq!(forwards, s.stages() * m, "{}", fam.name);
            }
        }
    }

    #[test]
    fn a_lowered_schedule_gives_the_same_forward_order_and_only_activation_transfers() {
        let s = families::generate("zbv", &Params::new(2, 4)).unwrap();
        let low = lower(&s).unwrap();
        assert_eq!(forward_only(&low), forward_only(&s));
        let f = forward_only(&s);
        for r in 0..2 {
            for it in lowered_items(&f, r) {
                if let Item::Comm(c) = it {
                    assert!(c.to_string().contains("_F"), "{c} moves a gradient");
                }
            }
        }
    }
}
