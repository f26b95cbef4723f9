//! [`Transport`]: the one way a rank's runner exchanges data with the other ranks: it sends the
//! payload of an [`Edge`] to a rank, receives one, aborts, and ends a step with a barrier
//! ([`finish`](Transport::finish)).
//!
//! A transport is generic over what it carries, `P`, and the event `E` that orders a transfer
//! against the compute around it:
//! - on the host (no device), `P` is a [`Parcel`] (a [`Tensor`] and where it came from) and `E` is
//!   `()`: the data is ready when it is handed over, and a receive returns once it has arrived.
//!   The threaded per-rank runner ([`run_rank`](super::run_rank)) calls it at its lowered list's
//!   `SEND` and `RECV` items. Implementations: [`Channels`] (threads of one process, what the
//!   [`Executor`](super::Executor) uses) and MPI point-to-point between processes (in `pipefill`);
//! - on a [`Device`](super::streams::Device) `D`, `P` is `D::Payload` and `E` is `D::Event`: a send
//!   is enqueued to go once `after` (recorded after its producer) has completed, and a receive is
//!   posted, returning the payload (filled once the transfer completes) and an event its consumer's
//!   stream waits on; [`complete`](Transport::complete) waits for every enqueued transfer. The
//!   per-rank stream runner ([`RankStreams`](super::streams::RankStreams)) posts them in the order
//!   [`peer_ops`](super::streams::peer_ops) gives. Implementations:
//!   [`CpuPeer`](super::streams::CpuPeer) (the CPU twin of NCCL) and NCCL on CUDA streams (in
//!   `pipefill-cuda`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::Tensor;
use crate::schedule::deps::Edge;
use crate::schedule::Action;

/// What crosses from one rank to another on the host: the tensor of an edge and where it came
/// from (for the timeline's transfers).
#[derive(Debug, Clone, PartialEq)]
pub struct Parcel {
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
#[non_exhaustive]
pub enum TransportError {
    /// Another rank failed and the step is being stopped.
    #[error("another rank stopped the step")]
    Aborted,
    /// The link itself failed or the other side is gone without a word (it crashed, a failed
    /// NCCL call, or nothing will ever send this).
    #[error("{message}")]
    Link {
        /// What the transport saw.
        message: String,
    },
    /// A receive got the message of another edge: the two ranks posted in different orders.
    #[error(
        "posted a receive of {} from rank {from}, but rank {from}'s next message is {}: messages \
         match in posting order, so receives must be posted in the sender's order",
        expected.send(), got.send()
    )]
    Mismatch {
        /// The sending rank.
        from: usize,
        /// The edge the receive was posted for.
        expected: Edge,
        /// The edge of the message it got.
        got: Edge,
    },
    /// A message has another shape than its receive was posted with.
    #[error("the message of {} from rank {from} has shape {got:?}, the receive expected {expected:?}", edge.send())]
    Shape {
        /// The sending rank.
        from: usize,
        /// The edge.
        edge: Edge,
        /// The shape the receive was posted with.
        expected: Vec<usize>,
        /// The shape that came.
        got: Vec<usize>,
    },
    /// A rendezvous did not complete in time: the ranks' posting orders cannot meet (a deadlock).
    #[error(
        "the {} of {} {} rank {peer} did not complete within {millis} ms: the two ranks' posting \
         orders cannot meet (a deadlock)",
        if *sending { "send" } else { "receive" }, edge.send(),
        if *sending { "to" } else { "from" }
    )]
    Deadline {
        /// Whether this rank was sending (else receiving).
        sending: bool,
        /// The edge.
        edge: Edge,
        /// The other rank.
        peer: usize,
        /// Milliseconds waited.
        millis: u64,
    },
    /// The producer left no data to send (its device failed before it).
    #[error("nothing to send for {}: its producer left no data", edge.send())]
    NoData {
        /// The edge.
        edge: Edge,
    },
}

impl TransportError {
    /// Whether this error is a cause (a wrong order, a wrong shape, a deadlock, a failed link),
    /// not a consequence of a failure elsewhere (no data, another rank's abort).
    pub fn is_cause(&self) -> bool {
        !matches!(
            self,
            TransportError::NoData { .. } | TransportError::Aborted
        )
    }
}

/// Moves the payloads of edges between one rank and the others: `P` is what travels, `E` the
/// event that orders a transfer against the compute around it (`Parcel` and `()` on the host; a
/// device's payload and event on a [`Device`](super::streams::Device)). See the module.
pub trait Transport<P = Parcel, E = ()> {
    /// Sends `data`, the data of `edge`, to rank `to` once `after` has completed (never blocks for
    /// long: the receiver may not be waiting yet). The transport owns `data` from now on.
    fn send(&mut self, edge: Edge, to: usize, data: P, after: E) -> Result<(), TransportError>;

    /// Receives `edge`'s data from rank `from`: the payload and an event that completes when it
    /// has arrived (the consumer waits on it before reading the payload). `shape` is the data's
    /// shape where the transport must size a buffer before the data comes (a device's); a host
    /// transport, whose messages carry their shape, is given `None` and returns once the data is
    /// there.
    fn recv(
        &mut self,
        edge: Edge,
        from: usize,
        shape: Option<&[usize]>,
    ) -> Result<(P, E), TransportError>;

    /// Waits until every transfer enqueued so far has completed; the first failure, if any.
    /// Nothing to wait for on a transport whose receives return with their data (the default).
    fn complete(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    /// Tells every other rank that this one failed, so that none waits forever (a no-op where the
    /// launcher ends the job on a failure, as `MPI_Abort` does).
    fn abort(&mut self);

    /// `true` once another rank has aborted (checked between items; may stay `false`, the default,
    /// on transports that only learn of it at a receive).
    fn aborted(&self) -> bool {
        false
    }

    /// Waits until every rank has finished its step; returns `true` when all of them succeeded
    /// (`ok` is this rank's outcome). Only then may the ranks apply their optimizer steps.
    fn finish(&mut self, ok: bool) -> bool;

    // Whole-step capture (a device transport whose work a graph can hold). A transport that
    // cannot be captured keeps the defaults, which refuse. See `RankStreams::capture`.

    /// The link's work from now on joins the device's capture: its stream waits on `fork` (an
    /// event recorded on the capturing origin stream) before anything it enqueues next.
    fn begin_capture(&mut self, fork: E) -> Result<(), TransportError> {
        let _ = fork;
        Err(not_capturable())
    }

    /// Ends the link's part of the capture: an event recorded after its last captured work, which
    /// the origin stream must wait on before the device ends its capture (the join).
    fn end_capture(&mut self) -> Result<E, TransportError> {
        Err(not_capturable())
    }

    /// Runs the link's captured work once more, right after the device's
    /// [`replay`](super::streams::Device::replay) (nothing to do where the device's graph holds
    /// the link's work, as a CUDA graph holds NCCL's).
    fn replay(&mut self) -> Result<(), TransportError> {
        Err(not_capturable())
    }
}

/// The error of a capture method a transport does not provide.
fn not_capturable() -> TransportError {
    TransportError::Link {
        message: "this transport cannot be captured in a whole-step graph".into(),
    }
}

/// Host parcels that arrived before they were wanted, by edge: what a host transport whose
/// messages come in the sender's order keeps while it waits for another edge's.
#[derive(Debug, Default)]
pub struct Mailbox {
    parcels: HashMap<Edge, Parcel>,
}

impl Mailbox {
    /// The parcel of `edge`: out of the mailbox, or the first one for it that `next` (the
    /// transport's next message) brings; the others it brings are kept for later.
    pub fn take(
        &mut self,
        edge: Edge,
        mut next: impl FnMut() -> Result<(Edge, Parcel), TransportError>,
    ) -> Result<Parcel, TransportError> {
        if let Some(p) = self.parcels.remove(&edge) {
            return Ok(p);
        }
        loop {
            let (e, p) = next()?;
            if e == edge {
                return Ok(p);
            }
            self.parcels.insert(e, p);
        }
    }
}

/// What travels on a [`Channels`] channel.
enum Message {
    Data(Edge, Parcel),
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
    mailbox: Mailbox,
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
                mailbox: Mailbox::default(),
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
}

/// The next message on `rx`: polled for up to `poll`, yielding the core between polls (a hand-off
/// that arrives meanwhile costs neither side a sleep and a wake-up), then blocking.
fn next_message(rx: &Receiver<Message>, poll: Duration) -> Option<Message> {
    let start = Instant::now();
    while start.elapsed() < poll {
        match rx.try_recv() {
            Ok(m) => return Some(m),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
    rx.recv().ok()
}

impl Transport for Channels {
    fn send(
        &mut self,
        edge: Edge,
        to: usize,
        parcel: Parcel,
        _after: (),
    ) -> Result<(), TransportError> {
        if let Some(Some(tx)) = self.peers.get(to) {
            // If the receiver already left, it failed (and we will be told) or did not need this.
            let _ = tx.send(Message::Data(edge, parcel));
        }
        Ok(())
    }

    fn recv(
        &mut self,
        edge: Edge,
        _from: usize,
        _shape: Option<&[usize]>,
    ) -> Result<(Parcel, ()), TransportError> {
        let (rx, poll) = (&self.rx, self.poll);
        let parcel = self.mailbox.take(edge, || match next_message(rx, poll) {
            Some(Message::Data(e, p)) => Ok((e, p)),
            Some(Message::Abort) => Err(TransportError::Aborted),
            None => Err(TransportError::Link {
                message: "waits for data that no rank will send (does the schedule validate?)"
                    .into(),
            }),
        })?;
        Ok((parcel, ()))
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
