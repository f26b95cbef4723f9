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
//! Which inputs and outputs exist is read from [`deps`](super::deps), the one definition. A schedule
//! that already carries transfers (PyTorch's compute+comms CSV) is left as it is.
//!
//! ```
//! use pipefill_host::schedule::{families, format, lower::{self, lower}, Params};
//! # fn main() -> Result<(), pipefill_host::schedule::ScheduleError> {
//! let s = families::generate("1f1b", &Params::new(2, 1))?;
//! let lowered = lower(&s)?;
//! assert_eq!(
//!     format::to_csv(&lowered),
//!     "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"
//! );
//! assert_eq!(lower::strip(&lowered), s);
//! # Ok(())
//! # }
//! ```

use super::deps::{self, Edge, Need};
use super::validate::{has_transfers, validate};
use super::{Item, Schedule, ScheduleError};

/// `schedule` with its transfers: checked by [`validate`] first (errors are its errors), then each
/// rank's list with a receive before every item that uses data from another rank and a send after every
/// item whose output another rank uses. A schedule that already has transfers comes back unchanged.
pub fn lower(schedule: &Schedule) -> Result<Schedule, ScheduleError> {
    validate(schedule)?;
    let actions = (0..schedule.ranks)
        .map(|r| lowered_items(schedule, r).collect())
        .collect();
    Ok(Schedule {
        actions,
        ..schedule.clone()
    })
}

/// Rank `rank`'s list with its transfers, produced as it is read (no copy of the schedule): the list
/// itself when the schedule already has transfers. The schedule should validate (see [`lower`]).
pub fn lowered_items(schedule: &Schedule, rank: usize) -> impl Iterator<Item = Item> + '_ {
    let explicit = has_transfers(schedule);
    let stages = schedule.stages();
    let crosses = move |e: &Edge| schedule.rank_of(e.from) != schedule.rank_of(e.to());
    schedule
        .actions
        .get(rank)
        .into_iter()
        .flatten()
        .flat_map(move |item| {
            let (mut before, mut after) = (Vec::new(), Vec::new());
            if !explicit {
                for a in item.actions() {
                    for need in deps::needs(a, stages) {
                        if let Need::Data(e) = need {
                            if crosses(&e) {
                                before.push(Item::Comm(e.recv()));
                            }
                        }
                    }
                    if let Some(e) = deps::output(a, stages).filter(|e| crosses(e)) {
                        after.push(Item::Comm(e.send()));
                    }
                }
            }
            before.push(*item);
            before.extend(after);
            before
        })
}

/// The compute-only schedule under a lowered one: every send and receive removed.
pub fn strip(schedule: &Schedule) -> Schedule {
    let actions = schedule
        .actions
        .iter()
        .map(|l| {
            l.iter()
                .filter(|it| !matches!(it, Item::Comm(_)))
                .copied()
                .collect()
        })
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
    use crate::schedule::{Comm, Params};

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
                // An activation and a gradient per crossing and microbatch, each a send and a receive.
                assert_eq!(comms.len(), 4 * crossings * m, "{} P{p} M{m}", fam.name);
            }
        }
    }

    #[test]
    fn no_transfer_within_a_rank() {
        // Two chunks on one rank: stage 0 -> 1 stays on rank 0.
        let s = families::generate("interleaved-1f1b", &Params::new(1, 2).with_chunks(2));
        if let Ok(s) = s {
            assert_eq!(lower(&s).unwrap(), s);
        }
    }
}
