//! `runtime`: executes any valid schedule for real.
//!
//! A trainer brings its layers by implementing one trait, [`Stage`] (forward, backward for inputs,
//! backward for weights, the activation memory held, zero-grad and optimizer hooks), plus a
//! [`Loss`] for the end of the last stage. A step ends with the gradients ready; the optimizer is
//! the trainer's call (`optimizer_step` on every runner), so it can clip or skip first. Data moves
//! between stages as [`Tensor`]s (values of one [`Dtype`], `f32`, BF16 or integers, with a shape).
//! The runtime knows nothing of how a stage computes; it decides nothing about order either: it
//! runs the schedule it is given, in order, on every rank.
//!
//! Pieces:
//! - [`Tensor`]: the buffer that moves between stages.
//! - [`Stage`], [`Loss`], [`StageError`]: what a trainer implements.
//! - [`DynStage`], [`BoxedStage`]: the stash type erased, so one model mixes stage types
//!   (an embedding, blocks, a head) in one `Vec<BoxedStage>`.
//! - [`Executor`]: runs training steps of a schedule, one OS thread per rank, and returns a
//!   [`StepReport`] with the losses and the measured [`Timeline`](crate::timeline::Timeline).
//!   [`Executor::step_with`] also tells a trainer's hook of each completed action and of each
//!   stage whose gradients are ready ([`StepEvent`]).
//! - [`run_rank`]: one rank's part of a step over a [`Transport`] (the per-rank runner). The
//!   `Executor` runs one per thread over [`Channels`]; a multi-process launcher runs one per process
//!   over its own transport, and [`assemble`] merges the ranks' [`RankOutcome`]s into a report.
//!   The same [`Transport`] trait, over a device's payloads and events, links the per-rank stream
//!   runner ([`streams::RankStreams`]) to the other ranks.
//! - [`Replicas`], [`AllReduce`]: data parallelism in one process: `D` pipeline replicas whose
//!   stages' gradients ([`Stage::gradients`]) are averaged as soon as each is final.
//! - [`streams`]: the device path: the lowered schedule as one enqueue order over streams and
//!   events ([`streams::StreamProgram`]), its static check, the [`streams::Device`] trait, the
//!   one-thread [`streams::StreamExecutor`] and the CPU reference device. [`Stage`] and [`Loss`] are
//!   generic over the [`Payload`] a device exchanges (host [`Tensor`] by default).
//! - [`sequential_step`]: the same step done plainly on one thread (the reference and the
//!   baseline).
//! - [`RuntimeError`]: why a step failed (naming the rank and the action).

mod check;
mod clock;
mod dyn_stage;
mod error;
mod executor;
mod hook;
mod key_map;
mod machine;
mod program;
mod replicas;
mod report;
mod sequential;
mod stage;
pub mod streams;
mod tensor;
mod transport;
mod worker;

pub use clock::CPU_CLOCK_FROM;
pub use dyn_stage::{AnyStash, BoxedStage, BoxedStreamStage, DynStage, DynStreamStage};
pub use error::RuntimeError;
pub use executor::{default_poll, Executor};
pub use hook::{last_gradient_actions, StepEvent};
pub use machine::{optimizer_steps, RankOutcome, RankStop};
pub use program::RankProgram;
pub use replicas::{on_replicas, AllReduce, Replicas};
pub use report::{assemble, Evaluation, StepReport};
pub use sequential::{sequential_step, SequentialReport};
pub use stage::{Loss, Payload, Stage, StageError};
pub use tensor::{Dtype, ShapeError, Tensor};
pub use transport::{Channels, Mailbox, Parcel, Transport, TransportError};
pub use worker::{run_rank, RankStep, Reducer};
