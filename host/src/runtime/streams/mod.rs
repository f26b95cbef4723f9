//! `streams`: running a schedule on a device with streams and events (CUDA, or the CPU reference
//! [`CpuStreams`]) from **one host thread**.
//!
//! The threaded [`Executor`](super::Executor) gives every rank an OS thread that blocks at its
//! receives. A GPU works differently: the host only *enqueues* work on streams, and the device runs
//! each stream in order, waiting at events for work on other streams. So a device step is:
//!
//! 1. [`StreamProgram::build`] turns the [lowered](crate::schedule::lower) schedule into one enqueue
//!    order of [`StreamOp`]s: `Run` an action on its rank's stream, `Record` an event after a
//!    producer whose data crosses ranks (the lowered `SEND`), `Wait` on it on the consumer's stream
//!    (the lowered `RECV`). Overlapped F/B pairs use a second stream per rank, forked and joined by
//!    events.
//! 2. [`check`](fn@check) verifies statically that every wait follows its record and that every action is
//!    ordered after what it needs (vector clocks over streams and events).
//! 3. [`StreamExecutor`] walks the ops once per step on the calling thread, calling the
//!    [`StreamStage`] methods with the [`Device::Stream`] each runs on (they only enqueue there, on a
//!    device) and the [`Device`]'s record / wait / timing marks, then synchronises once and reads the
//!    timeline from the marks.
//! 4. Optionally, [`StreamExecutor::capture`] enqueues one whole step while the device records it
//!    (a CUDA graph; kept jobs on [`CpuStreams`]) and [`StreamExecutor::replay`] reruns it on new
//!    inputs copied into fixed buffers, so later steps cost the host one launch instead of one
//!    enqueue per action ([`Device::begin_capture`] and its siblings; devices that cannot capture
//!    refuse by default).
//!
//! 5. For one process per rank (GPU ranks over NCCL), [`RankStreams`] runs one rank's part of the
//!    same program on a device holding only that rank's stages, the data crossing ranks through a
//!    device [`Transport`](crate::runtime::Transport); [`peer_ops`] posts every rank's sends and receives in one shared order (receives
//!    in the sender's order), which a link that matches messages in order (NCCL) cannot mismatch or
//!    deadlock on. [`CpuPeers`] is its CPU twin: in-order matching, rendezvous, deadlines.
//!
//! Stream choice: one stream per **rank** (plus the second lane), not per model stage: a rank's list
//! is an order the schedule chose, and one in-order stream keeps it on the device. Ranks sharing one
//! GPU run their streams concurrently, which is the kernel-level overlap the shared-device simulation
//! predicts.
//!
//! [`CpuStreams`] is the reference device: one worker thread per stream, events as flags, the host
//! layers run by the workers. It runs any program with the CPU layers, so the enqueue order and event
//! placement are tested without a GPU: a missing wait shows up as a consumer finding no input.

mod after;
mod check;
mod cpu;
mod device;
mod executor;
mod peer;
mod program;
mod rank;
mod stage;
mod step;

pub use check::check;
pub use cpu::{CpuPeer, CpuPeers, CpuStream, CpuStreams, Flag, OnStreams, OnStreamsLoss, Pending};
pub use device::{Device, DeviceError, Misplaced};
pub use executor::StreamExecutor;
pub use peer::{peer_ops, PeerOp, PostOrder, RankPlan};
pub use program::{EventRole, RankOp, StreamId, StreamOp, StreamProgram};
pub use rank::{RankBatch, RankStreams};
pub use stage::{GradientsFn, StreamLoss, StreamStage};

use thiserror::Error;

use crate::schedule::Action;

/// A stream program that cannot be built or that [`check`](fn@check) refuses.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The schedule deadlocks: no enqueue order exists (validate it first).
    #[error("no enqueue order: rank {rank} waits at `{item}` for data no rank sends first")]
    Stuck {
        /// The first rank that cannot go on.
        rank: usize,
        /// Its next item.
        item: String,
    },
    /// A transfer names no boundary between two stages.
    #[error("rank {rank}: `{item}` names no boundary between stages")]
    NoBoundary {
        /// The rank.
        rank: usize,
        /// The transfer.
        item: String,
    },
    /// A rank has no stream for a lane an item needs.
    #[error("rank {rank} has no stream for lane {lane}")]
    NoStream {
        /// The rank.
        rank: usize,
        /// The lane.
        lane: usize,
    },
    /// An op names a stream the program does not have.
    #[error("op {op} names stream {stream}, which the program does not have")]
    UnknownStream {
        /// The op's index.
        op: usize,
        /// The stream.
        stream: usize,
    },
    /// An op names an event the program does not have.
    #[error("op {op} names event {event}, which the program does not have")]
    UnknownEvent {
        /// The op's index.
        op: usize,
        /// The event.
        event: usize,
    },
    /// An event is recorded twice.
    #[error("op {op} records event {event} a second time")]
    RecordedTwice {
        /// The op's index.
        op: usize,
        /// The event.
        event: usize,
    },
    /// A wait is enqueued before its record: on a device it would wait for nothing.
    #[error(
        "op {op} waits on event {event} before it is recorded: the wait would wait for nothing"
    )]
    WaitBeforeRecord {
        /// The op's index.
        op: usize,
        /// The event.
        event: usize,
    },
    /// An action runs on another rank's stream.
    #[error("{action} runs on a stream of rank {stream_rank}, but its stage is on rank {rank}")]
    WrongRank {
        /// The action.
        action: Action,
        /// The stream's rank.
        stream_rank: usize,
        /// The stage's rank.
        rank: usize,
    },
    /// A rank's actions are not enqueued in its list's order.
    #[error("rank {rank}: expected {} next, got {got}", expected.as_deref().unwrap_or("nothing"))]
    Order {
        /// The rank.
        rank: usize,
        /// The action its list has next (`None`: the list is done).
        expected: Option<String>,
        /// What the program has.
        got: String,
    },
    /// An action is enqueued before what it needs.
    #[error("{consumer} is enqueued before {producer}, which it needs")]
    BeforeProducer {
        /// The action.
        consumer: Action,
        /// What it needs.
        producer: Action,
    },
    /// An action may run before what it needs: no stream order or event chain orders them.
    #[error("{consumer} is not ordered after {producer}: no wait on an event recorded after it")]
    Unordered {
        /// The action.
        consumer: Action,
        /// What it needs.
        producer: Action,
    },
}
