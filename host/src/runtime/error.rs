//! [`RuntimeError`]: why a training step did not complete.

use thiserror::Error;

use crate::schedule::{Action, ScheduleError};

/// Why the runtime refused a schedule or a step failed. A failure inside a trainer's layers names
/// the rank and the action (or the optimizer step) where it happened; the other ranks are stopped,
/// none is left waiting.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The schedule does not validate (or does not fit the stages given).
    #[error("the schedule cannot run: {0}")]
    Schedule(#[from] ScheduleError),
    /// The number of stages given does not match the schedule's `P * V`.
    #[error(
        "schedule `{schedule}` has {expected} stages (P = {ranks} x V = {chunks}) but {got} stages \
         were given"
    )]
    StageCount {
        /// The schedule's name.
        schedule: String,
        /// `P * V`, the stages the schedule runs.
        expected: usize,
        /// `P`.
        ranks: usize,
        /// `V`.
        chunks: usize,
        /// The stages given.
        got: usize,
    },
    /// The inputs or targets of a step are not one per microbatch.
    #[error(
        "a step runs M = {microbatches} microbatches, but {inputs} inputs and {targets} targets \
         were given (give one input and one target per microbatch)"
    )]
    BatchCount {
        /// `M`, the microbatches a step runs.
        microbatches: usize,
        /// The inputs given.
        inputs: usize,
        /// The targets given.
        targets: usize,
    },
    /// A step was asked of no stages at all.
    #[error("a step needs at least one stage, none were given")]
    NoStages,
    /// A step hook (the callback of [`Executor::step_with`](super::Executor::step_with))
    /// panicked; the step was stopped as if a layer had failed.
    #[error("the step hook panicked on rank {rank} after {action}: {message}")]
    HookPanicked {
        /// The rank whose thread ran the hook.
        rank: usize,
        /// The action the hook was told about.
        action: Action,
        /// The panic's message.
        message: String,
    },
    /// The schedule has no device program, or its program fails the static check.
    #[error("the schedule cannot run on streams: {0}")]
    Streams(super::streams::StreamError),
    /// The device reported an error (a launch, a copy, or a failure found at synchronisation).
    #[error("the device failed: {message}")]
    Device {
        /// What the device reported.
        message: String,
    },
    /// An action was handed a payload that lives on another device than its stream's (a device
    /// whose [`adopt`](super::streams::Device::adopt) did not move it).
    #[error("rank {rank} at {action}: {misplaced}")]
    WrongDevice {
        /// The rank.
        rank: usize,
        /// The action.
        action: Action,
        /// Where the payload and the stream are (boxed, as `Peer`'s error).
        misplaced: Box<super::streams::Misplaced>,
    },
    /// The runtime itself failed outside any layer call (a bug in pipefill, not in the layers).
    #[error("the runtime failed on rank {rank}: {message}")]
    Internal {
        /// The rank whose worker failed.
        rank: usize,
        /// What went wrong.
        message: String,
    },
    /// A layer returned an error.
    #[error("rank {rank} failed at {action}: {message}")]
    ActionFailed {
        /// The rank that failed.
        rank: usize,
        /// The action it was running.
        action: Action,
        /// The layer's message.
        message: String,
    },
    /// A layer panicked.
    #[error("rank {rank} panicked at {action}: {message}")]
    ActionPanicked {
        /// The rank that panicked.
        rank: usize,
        /// The action it was running.
        action: Action,
        /// The panic's message.
        message: String,
    },
    /// A stage's optimizer step failed or panicked.
    #[error("rank {rank} failed in the optimizer step of stage {stage}: {message}")]
    OptimizerFailed {
        /// The rank that failed.
        rank: usize,
        /// The stage whose optimizer failed.
        stage: usize,
        /// The message.
        message: String,
    },
    /// An optimizer step was asked for with no gradients to apply: no step ran since the last
    /// optimizer step, or the last step failed (its gradients are incomplete).
    #[error(
        "no gradients to apply: run a step that succeeds before each optimizer step (a failed \
         step leaves none)"
    )]
    NoGradients,
    /// A transfer between ranks of a per-rank stream runner failed
    /// ([`RankStreams`](super::streams::RankStreams) over a device [`Transport`](super::Transport)).
    #[error("rank {rank}: {error}")]
    Peer {
        /// The rank that saw it.
        rank: usize,
        /// What went wrong (boxed: it is large, and a `RuntimeError` travels in every action's
        /// `Result`).
        error: Box<super::TransportError>,
    },
    /// A per-rank runner was given other stages than the ones its rank holds.
    #[error(
        "rank {rank} holds stages {expected:?} of schedule `{schedule}`, but stages {got:?} were \
         given (build exactly the rank's own stages)"
    )]
    RankStages {
        /// The schedule's name.
        schedule: String,
        /// The rank.
        rank: usize,
        /// The global indices of the stages the schedule places on the rank.
        expected: Vec<usize>,
        /// The global indices given.
        got: Vec<usize>,
    },
}
