//! [`peer_ops`]: the order in which one rank's device program posts its sends and receives on a
//! device [`Transport`](crate::runtime::Transport) (NCCL point-to-point on GPUs, every rank in its own process) so that the
//! link matches them right and never deadlocks.
//!
//! NCCL's rules, which a device transport models: per (sender, receiver) pair, messages match strictly in
//! posting order (the n-th receive a rank posts from a peer gets the n-th message that peer sent
//! it, whatever it is), and a transfer completes only when both sides have posted (a rendezvous:
//! a send can hold up its stream until the receiver posts).
//!
//! The order used here ([`PostOrder::Sender`]): every rank posts all its sends **and** receives on
//! one communication stream in one global order that all ranks know, the order in which the whole
//! [`StreamProgram`] records the transfers' events. Each rank's communication stream then runs a
//! subsequence of one total order of rendezvous, so
//! - per pair of ranks, the receives are posted in the order the sends are (matching is right);
//! - the earliest unfinished transfer is at the head of both its ranks' communication streams, and
//!   its producer depends only on transfers recorded before it in the program: it completes, so
//!   nothing deadlocks, for every schedule the program builds (the V-shape families included, where
//!   a rank's send order to a peer differs from the peer's own receive order).
//!
//! A receive is *posted* on the communication stream where its sender records (it lands in a
//! buffer early); its consumer's stream waits for it only where the program waits
//! ([`PeerOp::Ready`]). [`PostOrder::Receiver`] posts each receive where its consumer needs it,
//! the naive translation of [`StreamProgram::rank_ops`]: it swaps messages for `zbv`, which is
//! what the CPU twin ([`CpuPeers`](super::CpuPeers)) catches.

use std::collections::HashMap;

use super::{EventRole, StreamId, StreamOp, StreamProgram};
use crate::schedule::deps::Edge;

/// Where a rank posts its receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostOrder {
    /// In the sender's order: where the whole program records the transfer (correct for every
    /// schedule; see [`peer_ops`] and the module).
    Sender,
    /// Where the rank's own list receives the data: the sender's order too for a schedule
    /// [lowered](crate::schedule::lower) by pipefill; wrong for a file whose receives come in
    /// another order than their sends.
    Receiver,
}

/// One operation of one rank's program for a device [`Transport`](crate::runtime::Transport). Stream indices are the rank's own
/// (into [`RankPlan::streams`]); event indices are the whole program's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerOp {
    /// A run or a lane event of the rank, as in the program.
    Local(StreamOp),
    /// Send `edge`'s data to rank `to` once its producer on `stream` is done.
    Send {
        /// The producer's stream.
        stream: usize,
        /// The edge.
        edge: Edge,
        /// The consumer's rank.
        to: usize,
    },
    /// Post the receive of `edge` from rank `from` on the communication stream.
    Post {
        /// The edge.
        edge: Edge,
        /// The producer's rank.
        from: usize,
    },
    /// `stream` waits for the posted receive of `edge`; its data goes to the consumer.
    Ready {
        /// The consumer's stream.
        stream: usize,
        /// The edge.
        edge: Edge,
    },
}

/// One rank's part of a [`StreamProgram`] for a per-rank runner: its streams and its operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlan {
    /// The rank's streams (lane 0, then lane 1 where it overlaps pairs).
    pub streams: Vec<StreamId>,
    /// The operations, in the order the host enqueues them.
    pub ops: Vec<PeerOp>,
}

/// Rank `rank`'s plan in `program`, its receives posted in `order`.
///
/// With [`PostOrder::Sender`] every rank posts all its sends and receives in one global order all
/// ranks know (where the whole program records each transfer's event). Each rank's communication
/// stream then runs a subsequence of one total order of rendezvous: per pair of ranks the receives
/// are posted in the order of the sends (matching is right), and the earliest unfinished transfer
/// is at the head of both its ranks' streams while its producer depends only on transfers
/// recorded before it, so it completes (no deadlock), for every schedule the program builds.
pub fn peer_ops(program: &StreamProgram, rank: usize, order: PostOrder) -> RankPlan {
    let rank_of = |stream: usize| program.streams.get(stream).map(|s| s.rank);
    let local: HashMap<usize, usize> = program
        .streams
        .iter()
        .enumerate()
        .filter(|(_, s)| s.rank == rank)
        .enumerate()
        .map(|(i, (global, _))| (global, i))
        .collect();
    let mut recorder = vec![None; program.events.len()];
    let mut waiter = vec![None; program.events.len()];
    for op in &program.ops {
        match *op {
            StreamOp::Record { stream, event } => recorder[event] = rank_of(stream),
            StreamOp::Wait { stream, event } => waiter[event] = rank_of(stream),
            StreamOp::Run { .. } => {}
        }
    }
    let edge = |event: usize| match program.events.get(event) {
        Some(EventRole::Transfer(e)) => Some(*e),
        _ => None,
    };
    let mut ops = Vec::new();
    for op in &program.ops {
        let (stream, event) = match *op {
            StreamOp::Run { stream, .. } => (stream, None),
            StreamOp::Record { stream, event } | StreamOp::Wait { stream, event } => {
                (stream, Some(event))
            }
        };
        let crossing = event.and_then(|ev| {
            let (from, to) = (recorder[ev]?, waiter[ev]?);
            Some((edge(ev)?, from, to)).filter(|_| from != to)
        });
        let mine = local.get(&stream).copied();
        match (*op, crossing, mine) {
            (StreamOp::Record { .. }, Some((edge, _, to)), Some(s)) => {
                ops.push(PeerOp::Send {
                    stream: s,
                    edge,
                    to,
                });
            }
            (StreamOp::Record { .. }, Some((edge, from, to)), None) => {
                if to == rank && order == PostOrder::Sender {
                    ops.push(PeerOp::Post { edge, from });
                }
            }
            (StreamOp::Wait { .. }, Some((edge, from, _)), Some(s)) => {
                if order == PostOrder::Receiver {
                    ops.push(PeerOp::Post { edge, from });
                }
                ops.push(PeerOp::Ready { stream: s, edge });
            }
            (_, _, Some(s)) => ops.push(PeerOp::Local(relocal(*op, s))),
            (_, _, None) => {}
        }
    }
    let streams = program
        .streams
        .iter()
        .filter(|s| s.rank == rank)
        .copied()
        .collect();
    RankPlan { streams, ops }
}

/// `op` with its stream replaced by the rank's own index `stream`.
fn relocal(op: StreamOp, stream: usize) -> StreamOp {
    match op {
        StreamOp::Run { action, .. } => StreamOp::Run { stream, action },
        StreamOp::Record { event, .. } => StreamOp::Record { stream, event },
        StreamOp::Wait { event, .. } => StreamOp::Wait { stream, event },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{families, Params};

    /// `(edges rank a sends to b, edges b posts from a)` for every ordered pair.
    fn pairs(plans: &[RankPlan]) -> Vec<(usize, usize, Vec<Edge>, Vec<Edge>)> {
        let mut out = Vec::new();
        for a in 0..plans.len() {
            for b in (0..plans.len()).filter(|&b| b != a) {
                let sent = plans[a].ops.iter().filter_map(|o| match *o {
                    PeerOp::Send { edge, to, .. } if to == b => Some(edge),
                    _ => None,
                });
                let posted = plans[b].ops.iter().filter_map(|o| match *o {
                    PeerOp::Post { edge, from } if from == a => Some(edge),
                    _ => None,
                });
                out.push((a, b, sent.collect(), posted.collect()));
            }
        }
        out
    }

    #[test]
    fn sender_order_posts_match_the_sends_per_pair_and_so_does_the_lowered_receiver_order() {
        for family in ["1f1b", "interleaved-1f1b", "zbv", "dualpipev"] {
            let mut params = Params::new(3, 7);
            if family.contains("interleaved") {
                params.chunks = Some(3);
            }
            let schedule = families::generate(family, &params).unwrap();
            let program = StreamProgram::build(&schedule).unwrap();
            let plans: Vec<RankPlan> = (0..3)
                .map(|r| peer_ops(&program, r, PostOrder::Sender))
                .collect();
            for (a, b, sent, posted) in pairs(&plans) {
                assert_eq!(sent, posted, "{family}: {a} -> {b}");
            }
            // Every post comes before its ready, and every ready has a post.
            for plan in &plans {
                let mut posted = Vec::new();
                for op in &plan.ops {
                    match op {
                        PeerOp::Post { edge, .. } => posted.push(*edge),
                        PeerOp::Ready { edge, .. } => {
                            assert!(posted.contains(edge), "{family}: ready before post")
                        }
                        _ => {}
                    }
                }
            }
            let naive: Vec<RankPlan> = (0..3)
                .map(|r| peer_ops(&program, r, PostOrder::Receiver))
                .collect();
            // Lowering lists receives in the sender's order, so the rank's own order agrees.
            let swapped = pairs(&naive).iter().any(|(_, _, s, p)| s != p);
            assert!(!swapped, "{family}");
        }
    }
}
