//! Lowering: a compute-only schedule becomes one with explicit transfers.
//!
//! In the spirit of PyTorch pipelining's `_add_send_recv`, [`lower`] gives every input that crosses
//! ranks a receive on the consuming rank, right before the item that uses it, and every output that
//! crosses ranks a send on the producing rank, right after the item that computed it. Nothing is
//! added between stages on the same rank. The result is data, printable in the same grammar extended
//! by PyTorch's `SEND_F`, `RECV_F`, `SEND_B` and `RECV_B` (`2SEND_F0`: stage 2 sends microbatch 0's
//! activation on; `3RECV_B0`: stage 3 receives microbatch 0's output gradient), and it is what the
//! backends execute: a send is "record that the data is ready" (a CUDA event, a channel send, an MPI /
//! NCCL send), a receive is "wait for it" (an event wait, a channel receive).
//!
//! Every send is retired by its wait (`WAIT_SEND_F` / `WAIT_SEND_B`, PyTorch 2.15's rule), placed
//! where it costs nothing and never holds up the peer, as PyTorch's `_add_wait_send` places it: an
//! activation's wait right after the sender's own backward of that stage and microbatch (which
//! needed the gradient the peer computed from that activation, so the peer has long received it),
//! a gradient's wait at the end of the rank's list. [`lower`] also finishes each stage's gradients
//! as PyTorch's runtime does, with a `REDUCE_GRAD` right after the stage's last `W`/`B` (where the
//! runtime's gradient hook fires: the data-parallel reduction starts there) and its
//! `WAIT_REDUCE_GRAD` as late as possible with at most one reduction pending per rank (before the
//! rank's next `REDUCE_GRAD`, else at the end), so the reduction overlaps the compute that follows;
//! a schedule that has its own `REDUCE_GRAD`s keeps them.
//!
//! Which inputs and outputs exist is read from [`super::deps`], the one definition. A schedule
//! that already carries transfers (PyTorch's compute+comms CSV) is left as it is.
//!
//! ```
//! use pipefill_host::schedule::{families, format, lower::{lower, strip}, Params};
//! # fn main() -> Result<(), pipefill_host::schedule::ScheduleError> {
//! let s = families::generate("1f1b", &Params::new(2, 1))?;
//! let lowered = lower(&s)?;
//! assert_eq!(
//!     format::to_csv(&lowered),
//!     "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n\
//!      1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_SEND_B0,1WAIT_REDUCE_GRAD\n"
//! );
//! assert_eq!(strip(&lowered), s);
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeSet, HashMap};

use super::deps::{self, Edge, Need};
use super::validate::{has_transfers, validate};
use super::{Action, Comm, CommOp, Item, Op, ParamAction, ParamOp, Schedule, ScheduleError};
use crate::runtime::last_gradient_actions;

/// `schedule` with its transfers: checked by [`validate`] first (errors are its errors), then each
/// rank's list with a receive before every item that uses data from another rank, a send after every
/// item whose output another rank uses, each send's wait, and each stage's gradient reduction (see
/// the [module docs](self)). A schedule that already has transfers comes back unchanged.
pub fn lower(schedule: &Schedule) -> Result<Schedule, ScheduleError> {
    validate(schedule)?;
    let reduce = !schedule
        .actions
        .iter()
        .flatten()
        .any(|it| matches!(it, Item::Param(p) if p.op == ParamOp::ReduceGrad));
    let last = last_gradient_actions(schedule);
    let actions = (0..schedule.ranks)
        .map(|r| {
            let list: Vec<Item> = lowered_items(schedule, r).collect();
            if reduce && !has_transfers(schedule) {
                with_reductions(list, &last)
            } else {
                list
            }
        })
        .collect();
    Ok(Schedule {
        actions,
        ..schedule.clone()
    })
}

/// Rank `rank`'s list with its transfers and the sends' waits: the list itself when the schedule
/// already has transfers. The schedule should validate (see [`lower`]). The runtimes execute this
/// list; [`lower`] adds the reductions.
pub fn lowered_items(schedule: &Schedule, rank: usize) -> impl Iterator<Item = Item> + '_ {
    let list = schedule.actions.get(rank).map_or(&[][..], Vec::as_slice);
    let items = if has_transfers(schedule) {
        list.to_vec()
    } else {
        in_sender_order(schedule, rank, placed(schedule, list).collect())
    };
    items.into_iter()
}

/// `list` (compute only) with each receive right before its consumer, each send right after its
/// producer, the activations' waits after their backward and the gradients' waits at the end.
fn placed<'a>(schedule: &'a Schedule, list: &'a [Item]) -> impl Iterator<Item = Item> + 'a {
    let gradient_waits = list
        .iter()
        .flat_map(move |item| sends_after(schedule, item))
        .filter(|c| c.op == CommOp::SendB)
        .map(|c| {
            Item::Comm(Comm {
                op: CommOp::WaitSendB,
                ..c
            })
        });
    list.iter()
        .flat_map(move |item| {
            let mut after = sends_after(schedule, item);
            after.extend(activation_waits_after(schedule, item));
            receives_before(schedule, item)
                .into_iter()
                .map(Item::Comm)
                .chain(std::iter::once(*item))
                .chain(after.into_iter().map(Item::Comm))
        })
        .chain(gradient_waits)
}

/// `items` (rank `rank`'s placed list) with its receives from each peer in the order that peer
/// sends: a transport that matches a pair's messages in order (gloo and NCCL point-to-point, so
/// PyTorch's runtime) would otherwise hand one tensor to another's receive. A receive that would
/// come after one its peer sends later moves up to just before that one: the rank waits there for
/// later data anyway, so nothing waits longer on a link that delivers in order.
fn in_sender_order(schedule: &Schedule, rank: usize, items: Vec<Item>) -> Vec<Item> {
    let stages = schedule.stages();
    let edge = |it: &Item| match it {
        Item::Comm(c) if c.op.is_recv() => Edge::of(*c, stages),
        _ => None,
    };
    let peers: BTreeSet<usize> = items
        .iter()
        .filter_map(edge)
        .map(|e| schedule.rank_of(e.from))
        .collect();
    // Each edge received here, numbered in its sender's order.
    let mut sent_as: HashMap<Edge, usize> = HashMap::new();
    for q in peers {
        for item in schedule.actions.get(q).into_iter().flatten() {
            for c in sends_after(schedule, item) {
                let e = Edge::of(c, stages).filter(|e| schedule.rank_of(e.to()) == rank);
                if let Some(e) = e {
                    let n = sent_as.len();
                    sent_as.insert(e, n);
                }
            }
        }
    }
    // (peer, sent as, position) of every receive; the latest-sent first, per peer.
    let mut recvs: Vec<(usize, usize, usize)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, it)| {
            let e = edge(it)?;
            Some((schedule.rank_of(e.from), *sent_as.get(&e)?, i))
        })
        .collect();
    recvs.sort_unstable_by(|a, b| (a.0, b.1).cmp(&(b.0, a.1)));
    let mut slot: Vec<usize> = (0..items.len()).collect();
    let mut bound = (usize::MAX, usize::MAX);
    for &(peer, _, i) in &recvs {
        if bound.0 != peer {
            bound = (peer, usize::MAX);
        }
        slot[i] = slot[i].min(bound.1);
        bound.1 = slot[i];
    }
    // A moved receive sits before the item it moved to, receives at one slot in their sent order.
    let mut keyed: Vec<((usize, u8, usize), Item)> = items
        .into_iter()
        .enumerate()
        .map(|(i, it)| match edge(&it).and_then(|e| sent_as.get(&e)) {
            Some(&n) => ((slot[i], 0, n), it),
            None => ((i, 1, 0), it),
        })
        .collect();
    keyed.sort_by_key(|k| k.0);
    keyed.into_iter().map(|(_, it)| it).collect()
}

/// The waits lowering puts after `item` (once its own sends are out): for each backward (`I` or
/// `B`) of a stage whose activation went to another rank, the wait of that activation's send.
fn activation_waits_after<'a>(
    schedule: &'a Schedule,
    item: &Item,
) -> impl Iterator<Item = Comm> + 'a {
    let stages = schedule.stages();
    item.actions()
        .filter(|a| matches!(a.op, Op::I | Op::B))
        .filter_map(move |a| deps::output(Action::new(Op::F, a.stage, a.microbatch), stages))
        .filter(|e| crosses(schedule, e))
        .map(|e| e.wait())
}

/// `list` with a `REDUCE_GRAD` after the item holding each stage's last `W`/`B` (and that item's
/// sends and waits), and its `WAIT_REDUCE_GRAD` before the next `REDUCE_GRAD` or at the end.
fn with_reductions(list: Vec<Item>, last: &[Option<Action>]) -> Vec<Item> {
    let mut out = Vec::with_capacity(list.len() + 4);
    let mut pending: Option<usize> = None;
    let mut ready: Vec<usize> = Vec::new();
    let wait = |stage| {
        Item::Param(ParamAction {
            op: ParamOp::WaitReduceGrad,
            stage,
        })
    };
    let flush = |out: &mut Vec<Item>, ready: &mut Vec<usize>, pending: &mut Option<usize>| {
        for stage in ready.drain(..) {
            out.extend(pending.replace(stage).map(wait));
            out.push(Item::Param(ParamAction {
                op: ParamOp::ReduceGrad,
                stage,
            }));
        }
    };
    for item in list {
        // The sends after an item and its free activation waits stay with it; the reduction
        // follows them, before anything that may wait (a receive, a gradient's wait).
        let with_previous =
            matches!(item, Item::Comm(c) if c.op.is_send() || c.op == CommOp::WaitSendF);
        if !with_previous {
            flush(&mut out, &mut ready, &mut pending);
        }
        for a in item.actions() {
            if last.get(a.stage) == Some(&Some(a)) {
                ready.push(a.stage);
            }
        }
        out.push(item);
    }
    flush(&mut out, &mut ready, &mut pending);
    out.extend(pending.map(wait));
    out
}

/// The receives lowering puts right before `item` in a compute-only schedule: one per input of its
/// actions that comes from another rank.
pub fn receives_before(schedule: &Schedule, item: &Item) -> Vec<Comm> {
    let stages = schedule.stages();
    item.actions()
        .flat_map(|a| deps::needs(a, stages))
        .filter_map(|need| match need {
            Need::Data(e) if crosses(schedule, &e) => Some(e.recv()),
            _ => None,
        })
        .collect()
}

/// The sends lowering puts right after `item` in a compute-only schedule: one per output of its
/// actions that another rank uses.
pub fn sends_after(schedule: &Schedule, item: &Item) -> Vec<Comm> {
    let stages = schedule.stages();
    item.actions()
        .filter_map(|a| deps::output(a, stages))
        .filter(|e| crosses(schedule, e))
        .map(|e| e.send())
        .collect()
}

fn crosses(schedule: &Schedule, e: &Edge) -> bool {
    schedule.rank_of(e.from) != schedule.rank_of(e.to())
}

/// The compute-only schedule under a lowered one: every send, receive and send's wait removed, and
/// the gradient reductions (`REDUCE_GRAD`, `WAIT_REDUCE_GRAD`) [`lower`] adds; FSDP's `UNSHARD` /
/// `RESHARD` stay.
pub fn strip(schedule: &Schedule) -> Schedule {
    let lowering_adds = |it: &Item| match it {
        Item::Comm(_) => true,
        Item::Param(p) => matches!(p.op, ParamOp::ReduceGrad | ParamOp::WaitReduceGrad),
        _ => false,
    };
    let actions = schedule
        .actions
        .iter()
        .map(|l| l.iter().filter(|it| !lowering_adds(it)).copied().collect())
        .collect();
    Schedule {
        actions,
        ..schedule.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::families::{self, FAMILIES};
    use crate::schedule::Params;

    #[test]
    fn every_family_lowers_to_a_valid_schedule_with_one_send_and_receive_per_crossing() {
        for fam in FAMILIES {
            for (p, m) in [(1, 3), (2, 4), (4, 8), (3, 6)] {
                let Ok(s) = families::generate(fam.name, &Params::new(p, m)) else {
                    continue;
                };
                let low = lower(&s).unwrap_or_else(|e| panic!("{} P{p} M{m}: {e}", fam.name));
                validate(&low).unwrap_or_else(|e| panic!("{} lowered: {e}", fam.name));
                assert_eq!(strip(&low), s);
                assert_eq!(lower(&low).unwrap(), low, "lowering twice changes nothing");
                let crossings = (1..s.stages())
                    .filter(|&st| s.rank_of(st) != s.rank_of(st - 1))
                    .count();
                let comms: Vec<Comm> = low
                    .actions
                    .iter()
                    .flatten()
                    .filter_map(|it| match it {
                        Item::Comm(c) => Some(*c),
                        _ => None,
                    })
                    .collect();
                // An activation and a gradient per crossing and microbatch, each a send, a receive
                // and the send's wait.
                assert_eq!(comms.len(), 6 * crossings * m, "{} P{p} M{m}", fam.name);
                assert_eq!(
                    comms.iter().filter(|c| c.op.is_wait()).count(),
                    2 * crossings * m
                );
                // One reduction per stage, each waited for; never two pending on a rank.
                for list in &low.actions {
                    let mut pending = None;
                    for it in list {
                        match it {
                            Item::Param(p) if p.op == ParamOp::ReduceGrad => {
                                assert_eq!(pending.replace(p.stage), None, "{}", fam.name);
                            }
                            Item::Param(p) if p.op == ParamOp::WaitReduceGrad => {
                                assert_eq!(pending.take(), Some(p.stage), "{}", fam.name);
                            }
                            _ => {}
                        }
                    }
                    assert_eq!(pending, None);
                }
                let reductions = low
                    .actions
                    .iter()
                    .flatten()
                    .filter(|it| matches!(it, Item::Param(p) if p.op == ParamOp::ReduceGrad));
                assert_eq!(reductions.count(), s.stages());
                assert_sender_order(&low, fam.name);
            }
        }
    }

    /// Per pair of ranks, the receiver's receives come in the order of the sender's sends.
    fn assert_sender_order(low: &Schedule, name: &str) {
        let stages = low.stages();
        let ends = |rank: usize, send: bool| -> Vec<Edge> {
            let list = &low.actions[rank];
            let edges = list.iter().filter_map(|it| match it {
                Item::Comm(c) if c.op.is_send() == send && !c.op.is_wait() => Edge::of(*c, stages),
                _ => None,
            });
            edges.collect()
        };
        for from in 0..low.ranks {
            for to in (0..low.ranks).filter(|&t| t != from) {
                let toward = |e: &&Edge| low.rank_of(e.from) == from && low.rank_of(e.to()) == to;
                let sent: Vec<Edge> = ends(from, true).iter().filter(toward).copied().collect();
                let got: Vec<Edge> = ends(to, false).iter().filter(toward).copied().collect();
                assert_eq!(sent, got, "{name}: {from} -> {to}");
            }
        }
    }

    #[test]
    fn no_transfer_within_a_rank() {
        // Two chunks on one rank: stage 0 -> 1 stays on rank 0.
        let s = families::generate("interleaved-1f1b", &Params::new(1, 2).with_chunks(2));
        if let Ok(s) = s {
            // Only the gradient reductions are added.
            let low = lower(&s).unwrap();
            assert!(!has_transfers(&low));
            assert_eq!(strip(&low), s);
        }
    }
}
