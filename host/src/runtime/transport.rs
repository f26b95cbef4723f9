//! [`Transport`]: how one rank's runner exchanges activations and gradients with the other ranks.
//!
//! The per-rank runner ([`run_rank`](super::run_rank)) executes a rank's lowered list and calls the
//! transport only at the list's `SEND` and `RECV` items: a send hands a [`Parcel`] to the rank of its
//! consumer, a receive waits for the parcel of one [`Edge`]. The in-process
//! [`Executor`](super::Executor) uses [`Channels`] (one channel per rank, threads of one process);
//! a multi-process launcher brings its own (MPI point-to-point, keyed by edge).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::Tensor;
use crate::schedule::deps::Edge;
use crate::schedule::Action;

/// Data crossing from one rank to another: the tensor of one [`Edge`].
#[derive(Debug, Clone, PartialEq)]
pub struct Parcel {
    /// Which data: its producing stage, flow and microbatch.
    pub edge: Edge,
    /// The producing action (`I` or `B` for a gradient).
    pub producer: Action,
    /// The sending rank.
    pub from: usize,
    /// When it was sent, in seconds since the sender's step began.
    pub sent_at: f64,
    /// The data.
    pub tensor: Tensor,
}

/// Why a transport could not deliver.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TransportError {
    /// Another rank failed and the step is being stopped.
    #[error("another rank stopped the step")]
    Aborted,
    /// The other side is gone without a word (it crashed, or nothing will ever send this).
    #[error("{message}")]
    Lost {
        /// What the transport saw.
        message: String,
    },
}

/// Moves [`Parcel`]s between ranks for one rank's runner ([`run_rank`](super::run_rank)): called only at
/// the lowered list's `SEND` and `RECV` items.
pub trait Transport {
    /// Sends `parcel` to rank `to` (never blocks for long: the receiver may not be waiting yet).
    fn send(&mut self, to: usize, parcel: Parcel) -> Result<(), TransportError>;

    /// Waits for the parcel of `edge`, sent by rank `from`.
    fn recv(&mut self, edge: Edge, from: usize) -> Result<Parcel, TransportError>;

    /// Tells every other rank that this one failed, so that none waits forever.
    fn abort(&mut self);

    /// `true` once another rank has aborted (checked between items; may stay `false` on transports
    /// that only learn of it at a receive).
    fn aborted(&self) -> bool;

    /// Waits until every rank has finished its list; returns `true` when all of them succeeded
    /// (`ok` is this rank's outcome). Only then may the ranks apply their optimizer steps.
    fn finish(&mut self, ok: bool) -> bool;
}

/// What travels on a [`Channels`] channel.
enum Message {
    Data(Parcel),
    Abort,
}

/// The in-process transport: one channel per rank, a shared failure flag and a barrier.
///
/// A rank waiting for data polls its channel for a while before it blocks (see
/// [`Executor::set_poll`](super::Executor::set_poll)); parcels that arrive before they are wanted
/// wait in a mailbox.
pub struct Channels {
    rank: usize,
    rx: Receiver<Message>,
    peers: Vec<Option<Sender<Message>>>,
    mailbox: HashMap<Edge, Parcel>,
    failed: Arc<AtomicBool>,
    barrier: Arc<Barrier>,
    poll: Duration,
}

impl Channels {
    /// One connected transport per rank for `ranks` ranks; a waiting rank polls for `poll`.
    pub fn connect(ranks: usize, poll: Duration) -> Vec<Channels> {
        let (senders, receivers): (Vec<Sender<Message>>, Vec<_>) =
            (0..ranks).map(|_| mpsc::channel()).unzip();
        let failed = Arc::new(AtomicBool::new(false));
        let barrier = Arc::new(Barrier::new(ranks));
        receivers
            .into_iter()
            .enumerate()
            .map(|(rank, rx)| Channels {
                rank,
                rx,
                peers: senders
                    .iter()
                    .enumerate()
                    .map(|(r, tx)| (r != rank).then(|| tx.clone()))
                    .collect(),
                mailbox: HashMap::new(),
                failed: Arc::clone(&failed),
                barrier: Arc::clone(&barrier),
                poll,
            })
            .collect()
    }

    /// The rank this end belongs to.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The next message: polled for up to `poll`, yielding the core between polls (a hand-off
    /// that arrives meanwhile costs neither side a sleep and a wake-up), then blocking.
    fn next_message(&self) -> Option<Message> {
        let start = Instant::now();
        while start.elapsed() < self.poll {
            match self.rx.try_recv() {
                Ok(m) => return Some(m),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => std::thread::yield_now(),
            }
        }
        self.rx.recv().ok()
    }
}

impl Transport for Channels {
    fn send(&mut self, to: usize, parcel: Parcel) -> Result<(), TransportError> {
        if let Some(Some(tx)) = self.peers.get(to) {
            // If the receiver already left, it failed (and we will be told) or did not need this.
            let _ = tx.send(Message::Data(parcel));
        }
        Ok(())
    }

    fn recv(&mut self, edge: Edge, _from: usize) -> Result<Parcel, TransportError> {
        if let Some(p) = self.mailbox.remove(&edge) {
            return Ok(p);
        }
        loop {
            match self.next_message() {
                None => {
                    return Err(TransportError::Lost {
                        message: "waits for data that no rank will send (does the schedule \
                                  validate?)"
                            .into(),
                    })
                }
                Some(Message::Abort) => return Err(TransportError::Aborted),
                Some(Message::Data(p)) if p.edge == edge => return Ok(p),
                Some(Message::Data(p)) => {
                    self.mailbox.insert(p.edge, p);
                }
            }
        }
    }

    fn abort(&mut self) {
        self.failed.store(true, Ordering::SeqCst);
        for tx in self.peers.iter().flatten() {
            // A rank that already left does not need telling.
            let _ = tx.send(Message::Abort);
        }
    }

    fn aborted(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    fn finish(&mut self, ok: bool) -> bool {
        if !ok {
            self.failed.store(true, Ordering::SeqCst);
        }
        self.barrier.wait();
        !self.failed.load(Ordering::SeqCst)
    }
}
