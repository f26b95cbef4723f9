//! [`Saver`]: the checkpoints of a run, saved during the loop (every `every` steps and after the
//! last one). The format and the files are [`crate::checkpoint`].

use std::path::{Path, PathBuf};

use pipefill_host::schedule::Schedule;

use super::TrainError;
use crate::checkpoint::{self, store, CheckpointError, Manifest, RankFile, StageState};

/// Saves checkpoints during the step loop (the caller holds the folder's lock:
/// [`store::FolderLock`]).
#[derive(Debug, Clone)]
pub struct Saver {
    dir: PathBuf,
    every: Option<usize>,
    steps: usize,
    base: Manifest,
}

impl Saver {
    /// Saves into `dir` after every `every` steps (if given) and after step `steps`, with the
    /// run's `base` manifest (its step and files are filled in at each save).
    pub fn new(dir: PathBuf, every: Option<usize>, steps: usize, base: Manifest) -> Self {
        Saver {
            dir,
            every,
            steps,
            base,
        }
    }

    /// Whether a checkpoint is due after step `done` (counted from 1): a multiple of `every`, or
    /// the last step.
    pub fn due(&self, done: usize) -> bool {
        self.every.is_some_and(|n| done % n == 0) || done == self.steps
    }

    /// Saves every rank's state after step `done` from one process (`stages`: every stage's
    /// state, placed by `schedule`).
    pub fn save(
        &self,
        done: usize,
        schedule: &Schedule,
        stages: Vec<StageState>,
    ) -> Result<(), TrainError> {
        let ranks = checkpoint::ranks_of(done as u64, schedule, stages);
        let manifest = self.manifest(done, Vec::new());
        store::save(&self.dir, manifest, &ranks).map_err(|e| self.failed(done, e))
    }

    /// The checkpoint folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest of the checkpoint after step `done` with these rank `files`.
    pub fn manifest(&self, done: usize, files: Vec<RankFile>) -> Manifest {
        let mut m = self.base.clone();
        m.step = done as u64;
        m.files = files;
        m
    }

    /// A failed save after step `done`.
    pub fn failed(&self, done: usize, source: CheckpointError) -> TrainError {
        TrainError::Save {
            dir: self.dir.clone(),
            step: done,
            source,
        }
    }
}
