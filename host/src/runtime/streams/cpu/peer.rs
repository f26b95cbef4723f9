//! [`CpuPeers`]: the CPU twin of NCCL point-to-point between ranks, for [`CpuStreams`](super::CpuStreams) devices on
//! threads: a device [`Transport`] that enforces what NCCL does and reports what breaks it.
//!
//! Each rank's [`CpuPeer`] has one communication thread (its "stream") that runs the rank's sends
//! and receives in the order they were posted. Per (sender, receiver) pair there is one queue:
//! the n-th receive a rank posts from a peer takes the n-th message that peer sent, whatever edge
//! it carries, as NCCL matches; a receive that gets another edge's message is
//! [`TransportError::Mismatch`], naming both. A send holds its stream until the receiver takes the
//! message and a receive until a message comes (a rendezvous, NCCL's protocol for large messages);
//! one that does not complete within the deadline is [`TransportError::Deadline`], so a deadlock is
//! reported, not hung. [`CpuPeers::eager`] models small messages instead, which NCCL buffers: a
//! send completes without waiting for its receive, so a wrong posting order swaps messages
//! (caught as a mismatch) instead of deadlocking.
//!
//! Capture ([`Transport::begin_capture`]): while the rank's device captures a step, the link's
//! jobs are kept by its thread, after a wait on the fork event, and end with a join event; each
//! [`Transport::replay`] runs them again (the twin of NCCL calls captured into a CUDA graph). A
//! replay is refused when the join event was never waited on during the capture, as CUDA refuses
//! to end a capture with a stream not joined back.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Flag, Pending};
use crate::runtime::{Tensor, Transport, TransportError};
use crate::schedule::deps::Edge;

/// A message on its way from one rank to another.
struct Message {
    edge: Edge,
    tensor: Tensor,
}

/// One ordered pair's queue: messages sent and not yet taken, and how many were sent and taken.
#[derive(Default)]
struct Pair {
    queue: VecDeque<Message>,
    sent: u64,
    taken: u64,
}

/// The step's end: how many ranks arrived, whether all were fine, which round this is.
#[derive(Default)]
struct Round {
    arrived: usize,
    all_ok: bool,
    generation: u64,
    last: bool,
}

/// Every ordered pair's queue, by `(sender, receiver)`.
type Pairs = HashMap<(usize, usize), Pair>;

/// What the ranks' links share.
struct Hub {
    ranks: usize,
    /// Sends complete without waiting for their receive.
    eager: bool,
    deadline: Duration,
    pairs: Mutex<Pairs>,
    moved: Condvar,
    failed: AtomicBool,
    round: Mutex<Round>,
    ended: Condvar,
    /// Bytes of every message sent ([`Tensor::bytes`]: 2 a value for BF16), by all ranks.
    sent_bytes: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Hub {
    /// Wakes every waiter: a rank failed.
    fn poison(&self) {
        self.failed.store(true, Ordering::SeqCst);
        let _guard = lock(&self.pairs);
        self.moved.notify_all();
    }

    /// Waits on `moved` while `pending` holds, until the deadline or a failure.
    fn wait_while<'a>(
        &self,
        mut pairs: MutexGuard<'a, Pairs>,
        pending: impl Fn(&mut Pairs) -> bool,
    ) -> (MutexGuard<'a, Pairs>, Result<(), bool>) {
        let start = Instant::now();
        while pending(&mut pairs) {
            if self.failed.load(Ordering::SeqCst) {
                return (pairs, Err(false));
            }
            let left = self.deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                return (pairs, Err(true));
            }
            let step = left.min(Duration::from_millis(20));
            pairs = self
                .moved
                .wait_timeout(pairs, step)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        (pairs, Ok(()))
    }

    fn send(&self, from: usize, to: usize, message: Message) -> Result<(), TransportError> {
        let edge = message.edge;
        let mut pairs = lock(&self.pairs);
        let pair = pairs.entry((from, to)).or_default();
        let seq = pair.sent;
        pair.sent += 1;
        pair.queue.push_back(message);
        self.moved.notify_all();
        if self.eager {
            return Ok(());
        }
        let taken = |p: &mut Pairs| p.get(&(from, to)).is_some_and(|pair| pair.taken <= seq);
        let (_pairs, waited) = self.wait_while(pairs, taken);
        waited.map_err(|timed_out| self.lost(timed_out, true, edge, to))
    }

    /// The next message from `from` to `to`; `Err(timed_out)` when none came.
    fn recv(&self, from: usize, to: usize) -> Result<Message, bool> {
        let pairs = lock(&self.pairs);
        let empty = |p: &mut Pairs| p.get(&(from, to)).is_none_or(|pair| pair.queue.is_empty());
        let (mut pairs, waited) = self.wait_while(pairs, empty);
        waited?;
        let pair = pairs.entry((from, to)).or_default();
        let message = pair.queue.pop_front().ok_or(false)?;
        pair.taken += 1;
        self.moved.notify_all();
        Ok(message)
    }

    /// The error of a rendezvous that ended without its partner: the deadline, or an abort.
    fn lost(&self, timed_out: bool, sending: bool, edge: Edge, peer: usize) -> TransportError {
        if !timed_out {
            return TransportError::Aborted;
        }
        TransportError::Deadline {
            sending,
            edge,
            peer,
            millis: u64::try_from(self.deadline.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// The end of a step: waits for every rank (up to the deadline); `true` when all were ok.
    fn finish(&self, ok: bool) -> bool {
        let mut round = lock(&self.round);
        if round.arrived == 0 {
            round.all_ok = true;
        }
        round.all_ok &= ok;
        round.arrived += 1;
        if round.arrived == self.ranks {
            round.last = round.all_ok;
            round.arrived = 0;
            round.generation += 1;
            self.ended.notify_all();
            return round.last;
        }
        // A rank that never arrives (it hangs or is gone) must not hang the others: after the
        // deadline the step counts as failed.
        let (generation, start) = (round.generation, Instant::now());
        while round.generation == generation {
            if start.elapsed() > self.deadline {
                return false;
            }
            round = self
                .ended
                .wait_timeout(round, Duration::from_millis(20))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        round.last
    }
}

/// What a rank's communication thread runs, in posting order.
enum Job {
    Send {
        after: Arc<Flag>,
        edge: Edge,
        data: Pending<Tensor>,
        to: usize,
    },
    Recv {
        edge: Edge,
        from: usize,
        shape: Vec<usize>,
        into: Pending<Tensor>,
        done: Arc<Flag>,
    },
    Sync(mpsc::Sender<()>),
    /// Waits for a device event (the fork of a capture).
    Wait(Arc<Flag>),
    /// Raises an event (the join of a capture).
    Raise(Arc<Flag>),
}

/// What the communication thread is sent: a job to run now, one to keep for every replay
/// (while capturing), or a replay of the kept ones.
enum Post {
    Once(Job),
    Keep(Job),
    Replay,
}

/// The link's capture: whether it is capturing or holds a captured step, the events it made
/// during the capture (lowered once a replay completed) and the join.
#[derive(Default)]
struct Capture {
    capturing: bool,
    captured: bool,
    flags: Vec<Arc<Flag>>,
    join: Option<Arc<Flag>>,
}

/// Links between ranks that are threads of one process, each rank on its own [`CpuStreams`](super::CpuStreams):
/// [`CpuPeers::connect`] gives one [`CpuPeer`] per rank.
pub struct CpuPeers;

impl CpuPeers {
    /// One link per rank of `ranks`, every transfer a rendezvous; one that does not complete
    /// within `deadline` fails.
    pub fn connect(ranks: usize, deadline: Duration) -> Vec<CpuPeer> {
        Self::hub(ranks, deadline, false)
    }

    /// [`connect`](CpuPeers::connect), but sends complete at once (small messages that NCCL
    /// buffers); receives still wait for their message, up to `deadline`.
    pub fn eager(ranks: usize, deadline: Duration) -> Vec<CpuPeer> {
        Self::hub(ranks, deadline, true)
    }

    fn hub(ranks: usize, deadline: Duration, eager: bool) -> Vec<CpuPeer> {
        let hub = Arc::new(Hub {
            ranks,
            eager,
            deadline,
            pairs: Mutex::new(HashMap::new()),
            moved: Condvar::new(),
            failed: AtomicBool::new(false),
            round: Mutex::new(Round::default()),
            ended: Condvar::new(),
            sent_bytes: AtomicUsize::new(0),
        });
        (0..ranks).map(|rank| CpuPeer::start(rank, &hub)).collect()
    }
}

/// One rank's [`Transport`] of [`CpuPeers`].
pub struct CpuPeer {
    rank: usize,
    hub: Arc<Hub>,
    jobs: Option<Sender<Post>>,
    capture: Capture,
    worker: Option<JoinHandle<()>>,
    error: Arc<Mutex<Option<TransportError>>>,
}

impl CpuPeer {
    fn start(rank: usize, hub: &Arc<Hub>) -> Self {
        let (tx, rx) = mpsc::channel::<Post>();
        let error = Arc::new(Mutex::new(None));
        let (h, e) = (Arc::clone(hub), Arc::clone(&error));
        let worker = std::thread::Builder::new()
            .name(format!("peer-r{rank}"))
            .spawn(move || {
                let mut kept = Vec::new();
                while let Ok(post) = rx.recv() {
                    match post {
                        Post::Once(job) => run(rank, &h, &e, &job),
                        Post::Keep(job) => kept.push(job),
                        Post::Replay => kept.iter().for_each(|job| run(rank, &h, &e, job)),
                    }
                }
            })
            .ok();
        CpuPeer {
            rank,
            hub: Arc::clone(hub),
            jobs: Some(tx),
            capture: Capture::default(),
            worker,
            error,
        }
    }

    /// This link's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Bytes of every message sent so far over this link's [`CpuPeers`], by all its ranks: what
    /// the tensors' storage type says ([`Tensor::bytes`], 2 a value for BF16), the twin of the
    /// bytes NCCL moves.
    pub fn sent_bytes(&self) -> usize {
        self.hub.sent_bytes.load(Ordering::SeqCst)
    }

    fn post(&self, job: Job) -> Result<(), TransportError> {
        let stopped = || TransportError::Link {
            message: format!("rank {}'s communication thread has stopped", self.rank),
        };
        let tx = self.jobs.as_ref().ok_or_else(stopped)?;
        let post = if self.capture.capturing {
            Post::Keep(job)
        } else {
            Post::Once(job)
        };
        tx.send(post).map_err(|_| stopped())
    }

    fn replay_kept(&self) -> Result<(), TransportError> {
        let tx = self.jobs.as_ref().ok_or_else(|| TransportError::Link {
            message: format!("rank {}'s communication thread has stopped", self.rank),
        })?;
        tx.send(Post::Replay).map_err(|_| TransportError::Link {
            message: format!("rank {}'s communication thread has stopped", self.rank),
        })
    }
}

/// Runs one job on the communication thread; a failure is kept (the first wins), poisons the hub
/// so no other rank waits for this one, and still raises the receive's flag so the consumer's
/// stream goes on (to find no data).
fn run(rank: usize, hub: &Hub, error: &Mutex<Option<TransportError>>, job: &Job) {
    let fail = |e: TransportError| {
        lock(error).get_or_insert(e);
        hub.poison();
    };
    match job {
        Job::Send {
            after,
            edge,
            data,
            to,
        } => {
            let (edge, to) = (*edge, *to);
            after.wait(&hub.failed);
            if hub.failed.load(Ordering::SeqCst) {
                return fail(TransportError::Aborted);
            }
            match data.take_tensor() {
                Ok(tensor) => {
                    hub.sent_bytes.fetch_add(tensor.bytes(), Ordering::SeqCst);
                    if let Err(e) = hub.send(rank, to, Message { edge, tensor }) {
                        fail(e);
                    }
                }
                Err(_) => fail(TransportError::NoData { edge }),
            }
        }
        Job::Recv {
            edge,
            from,
            shape,
            into,
            done,
        } => {
            let (edge, from) = (*edge, *from);
            match hub.recv(from, rank) {
                Ok(m) if m.edge != edge => fail(TransportError::Mismatch {
                    from,
                    expected: edge,
                    got: m.edge,
                }),
                Ok(m) if m.tensor.shape() != shape.as_slice() => fail(TransportError::Shape {
                    from,
                    edge,
                    expected: shape.clone(),
                    got: m.tensor.shape().to_vec(),
                }),
                Ok(m) => into.fill(m.tensor),
                Err(timed_out) => fail(hub.lost(timed_out, false, edge, from)),
            }
            done.raise();
        }
        Job::Sync(ack) => {
            let _ = ack.send(());
        }
        Job::Wait(flag) => flag.wait(&hub.failed),
        Job::Raise(flag) => flag.raise(),
    }
}

impl Transport<Pending<Tensor>, Arc<Flag>> for CpuPeer {
    fn send(
        &mut self,
        edge: Edge,
        to: usize,
        data: Pending<Tensor>,
        after: Arc<Flag>,
    ) -> Result<(), TransportError> {
        self.post(Job::Send {
            after,
            edge,
            data,
            to,
        })
    }

    /// Posts the receive; `shape` is required (a message of another shape is
    /// [`TransportError::Shape`], as NCCL's byte count would not match).
    fn recv(
        &mut self,
        edge: Edge,
        from: usize,
        shape: Option<&[usize]>,
    ) -> Result<(Pending<Tensor>, Arc<Flag>), TransportError> {
        let shape = shape.ok_or_else(|| TransportError::Link {
            message: format!("a receive of {} posted without its shape", edge.recv()),
        })?;
        let (data, done) = (Pending::empty(), Flag::new());
        self.post(Job::Recv {
            edge,
            from,
            shape: shape.to_vec(),
            into: data.share(),
            done: Arc::clone(&done),
        })?;
        if self.capture.capturing {
            self.capture.flags.push(Arc::clone(&done));
        }
        Ok((data, done))
    }

    fn complete(&mut self) -> Result<(), TransportError> {
        let (tx, rx) = mpsc::channel();
        self.post(Job::Sync(tx))?;
        rx.recv().map_err(|_| TransportError::Link {
            message: format!("rank {}'s communication thread has stopped", self.rank),
        })?;
        // Every kept job has run: the capture's events are lowered for the next replay (the
        // device's streams, synchronised before, wait on none of them any more).
        self.capture.flags.iter().for_each(|f| f.lower());
        match lock(&self.error).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn abort(&mut self) {
        self.hub.poison();
    }

    fn finish(&mut self, ok: bool) -> bool {
        self.hub.finish(ok)
    }

    fn begin_capture(&mut self, fork: Arc<Flag>) -> Result<(), TransportError> {
        if self.capture.capturing || self.capture.captured {
            return Err(TransportError::Link {
                message: format!("rank {}'s link already holds a captured step", self.rank),
            });
        }
        self.capture.capturing = true;
        self.post(Job::Wait(fork))
    }

    fn end_capture(&mut self) -> Result<Arc<Flag>, TransportError> {
        if !self.capture.capturing {
            return Err(TransportError::Link {
                message: "end_capture without begin_capture".into(),
            });
        }
        let join = Flag::new();
        self.post(Job::Raise(Arc::clone(&join)))?;
        self.capture.capturing = false;
        self.capture.captured = true;
        self.capture.flags.push(Arc::clone(&join));
        self.capture.join = Some(Arc::clone(&join));
        Ok(join)
    }

    /// Refused before a capture, and when the capture's join was never waited on by a capturing
    /// stream (CUDA's `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` at the end of the capture).
    fn replay(&mut self) -> Result<(), TransportError> {
        let join = self
            .capture
            .join
            .as_ref()
            .ok_or_else(|| TransportError::Link {
                message: format!("rank {}'s link: replay before a capture", self.rank),
            })?;
        if !join.was_waited() {
            let what = format!("rank {}'s communication stream", self.rank);
            return Err(TransportError::Link {
                message: super::unjoined(&what),
            });
        }
        self.replay_kept()
    }
}

impl Drop for CpuPeer {
    fn drop(&mut self) {
        self.hub.poison();
        self.jobs.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
