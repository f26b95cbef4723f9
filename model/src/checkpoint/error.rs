//! What can go wrong saving or loading a checkpoint.

use std::fmt;
use std::path::PathBuf;

/// A property of the run that a checkpoint must share with the run that resumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The model's layers (widths, activations), input width and loss.
    Model,
    /// Rows per step.
    Batch,
    /// `P`, the number of ranks.
    Ranks,
    /// `M`, microbatches per step.
    Microbatches,
    /// `V`, stages per rank.
    Chunks,
    /// The schedule (family name, or the schedule itself for a given one).
    Schedule,
    /// Layers per stage.
    Partition,
    /// The seed of the weights, the teacher and the data stream.
    Seed,
    /// The optimizer's kind.
    Optimizer,
    /// The learning rate.
    LearningRate,
    /// How activations are stored (`--activations`).
    Activations,
}

impl Field {
    /// The field in words, as errors show it.
    pub fn name(self) -> &'static str {
        match self {
            Field::Model => "model",
            Field::Batch => "batch",
            Field::Ranks => "number of ranks",
            Field::Microbatches => "number of microbatches",
            Field::Chunks => "stages per rank",
            Field::Schedule => "schedule",
            Field::Partition => "partition (layers per stage)",
            Field::Seed => "seed",
            Field::Optimizer => "optimizer",
            Field::LearningRate => "learning rate",
            Field::Activations => "activation storage",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error saving, finding or loading a checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A file or folder could not be read, written, synced or renamed.
    #[error("cannot {action} `{}`: {source}", path.display())]
    Io {
        /// What was being done (`create`, `write`, `rename`, ...).
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The folder holds no complete checkpoint (none with a manifest).
    #[error("`{}` holds no complete checkpoint (no `step-*/manifest.json`)", dir.display())]
    NoCheckpoint {
        /// The folder searched.
        dir: PathBuf,
    },
    /// A checkpoint file is damaged: truncated, wrong checksum, unreadable manifest, or contents
    /// that contradict the manifest.
    #[error("checkpoint file `{}` is corrupt: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The checkpoint was made by a run that differs from this one in `field`.
    #[error("the checkpoint's {field} is {checkpoint}, this run's is {run}")]
    Mismatch {
        /// What differs.
        field: Field,
        /// The checkpoint's value, in words.
        checkpoint: String,
        /// This run's value, in words.
        run: String,
    },
    /// Another process holds the folder's lock: it is writing checkpoints there now.
    #[error("`{}` is in use: another pipefill run is writing checkpoints there (it holds `{}`)", dir.display(), dir.join(super::store::LOCK).display())]
    Busy {
        /// The folder.
        dir: PathBuf,
    },
    /// A new run would write into a folder that already holds another run's checkpoints.
    #[error("`{}` already holds a checkpoint (step {step})", dir.display())]
    NotEmpty {
        /// The folder.
        dir: PathBuf,
        /// The step of the latest checkpoint there.
        step: u64,
    },
}

impl CheckpointError {
    /// A [`CheckpointError::Io`] for `action` on `path`.
    pub fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| CheckpointError::Io {
            action,
            path,
            source,
        }
    }

    /// A [`CheckpointError::Corrupt`] for `path`; tokens from the file in `reason` are shortened
    /// ([`pipefill_host::input::shorten`]).
    pub(crate) fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        CheckpointError::Corrupt {
            path: path.into(),
            reason: pipefill_host::input::shorten(&reason.into()),
        }
    }
}
