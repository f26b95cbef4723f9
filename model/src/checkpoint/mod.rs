//! Checkpoints of `pipefill train`: every rank's stage weights and optimizer state, saved so that a
//! run killed at any moment resumes from its last complete checkpoint with the losses it would have
//! had without the interruption.
//!
//! A checkpoint is a folder `DIR/step-NNNNNNNN/` with one rank file per rank ([`mod@file`]: a small
//! binary format with a header, lengths and a checksum) and a JSON [`Manifest`] written last
//! ([`mod@store`]: each file through a synced temporary file and a rename, the folder synced after).
//! Resuming reads the latest folder that has a manifest, checks the run against it
//! ([`Manifest::check_run`]) and every rank file against the manifest ([`store::load_ranks`]), and
//! puts the state back into freshly built stages ([`restore`]).

mod error;
pub mod file;
mod manifest;
mod state;
pub mod store;

pub use error::{CheckpointError, Field};
pub use file::RankState;
pub use manifest::{
    learning_rate, LayerShape, Manifest, ModelShape, RankFile, RunIdentity, FORMAT,
};
pub use state::{LayerState, StageState};

use std::path::Path;

use pipefill_host::schedule::Schedule;

use crate::layers::LinearStage;

/// The version of the rank file and manifest formats this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Each rank's state after `step` steps: the stages the schedule places on it, in stage order.
pub fn rank_states(step: u64, schedule: &Schedule, stages: &[LinearStage]) -> Vec<RankState> {
    let states = stages
        .iter()
        .enumerate()
        .map(|(s, stage)| StageState::of(s, stage))
        .collect();
    ranks_of(step, schedule, states)
}

/// Each rank's state after `step` steps from the stages' states (any order): each goes to the rank
/// the schedule places it on, in the order given.
pub fn ranks_of(step: u64, schedule: &Schedule, states: Vec<StageState>) -> Vec<RankState> {
    let mut ranks: Vec<RankState> = (0..schedule.ranks)
        .map(|rank| RankState {
            rank,
            step,
            stages: Vec::new(),
        })
        .collect();
    for state in states {
        if let Some(r) = ranks.get_mut(schedule.rank_of(state.stage)) {
            r.stages.push(state);
        }
    }
    ranks
}

/// Puts the saved `ranks` (read from the checkpoint in `folder`) into `stages`, which `schedule`
/// places: every stage must be saved exactly once, by the rank that holds it, with layers that fit.
pub fn restore(
    folder: &Path,
    ranks: Vec<RankState>,
    schedule: &Schedule,
    stages: &mut [LinearStage],
) -> Result<(), CheckpointError> {
    restore_some(
        folder,
        ranks,
        schedule,
        stages.iter_mut().enumerate().collect(),
    )
}

/// [`restore`] into some of the stages only, `(stage index, stage)` (a process that holds one
/// rank's): the checkpoint must still save every stage of `schedule` exactly once, by its rank.
pub fn restore_some(
    folder: &Path,
    ranks: Vec<RankState>,
    schedule: &Schedule,
    mut stages: Vec<(usize, &mut LinearStage)>,
) -> Result<(), CheckpointError> {
    let mut seen = vec![false; schedule.stages()];
    for rank in ranks {
        let path = folder.join(store::rank_file_name(rank.rank));
        for s in rank.stages {
            let i = s.stage;
            let bad = |why: String| CheckpointError::corrupt(&path, why);
            if i >= seen.len() {
                return Err(bad(format!(
                    "stage {i}: the schedule has {} stages",
                    seen.len()
                )));
            }
            if schedule.rank_of(i) != rank.rank || seen[i] {
                return Err(bad(format!(
                    "stage {i} saved by rank {}, the schedule places it on rank {}{}",
                    rank.rank,
                    schedule.rank_of(i),
                    if seen[i] { " (and saved twice)" } else { "" }
                )));
            }
            seen[i] = true;
            if let Some((_, stage)) = stages.iter_mut().find(|(j, _)| *j == i) {
                s.restore(stage).map_err(bad)?;
            }
        }
    }
    match seen.iter().position(|&s| !s) {
        Some(i) => Err(CheckpointError::corrupt(
            folder,
            format!("no rank saved stage {i}"),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::{gemm::GemmBackend, LossKind, Optimizer, ParamState};
    use crate::model::{stage_ranges, ModelSpec};
    use pipefill_host::schedule::{families, Params};
    use pipefill_kernels::Activation;

    fn stages(seed: u64) -> (Schedule, Vec<LinearStage>) {
        let spec = ModelSpec::uniform(4, 8, 3, Activation::Gelu, LossKind::Mse, 8).unwrap();
        let schedule = families::generate("interleaved-1f1b", &Params::new(2, 2)).unwrap();
        let ranges = stage_ranges(&[1, 1, 1, 1]);
        let opt = Optimizer::adamw(1e-3);
        let stages = spec
            .build_stages(&ranges, opt, GemmBackend::default(), seed)
            .unwrap();
        (schedule, stages)
    }

    #[test]
    fn saved_stages_restore_exactly_into_fresh_ones() {
        let (schedule, mut trained) = stages(1);
        for (i, s) in trained.iter_mut().enumerate() {
            s.set_steps(3 + i as u32);
            let l = &mut s.layers[0];
            let n = l.weight.len();
            let m = ParamState::from_moments(vec![0.5; n], vec![0.25; n]);
            l.set_optimizer_state(m, ParamState::default());
        }
        let ranks = rank_states(3, &schedule, &trained);
        // Looped placement: rank 0 holds stages 0 and 2.
        let held: Vec<usize> = ranks[0].stages.iter().map(|s| s.stage).collect();
        assert_eq!(held, vec![0, 2]);
        let (_, mut fresh) = stages(2);
        assert_ne!(fresh, trained);
        restore(Path::new("ck"), ranks.clone(), &schedule, &mut fresh).unwrap();
        assert_eq!(fresh, trained);
        // A stage saved by a rank that does not hold it, or missing, is refused.
        let mut moved = ranks.clone();
        let s = moved[0].stages.pop().unwrap();
        moved[1].stages.push(s);
        assert!(restore(Path::new("ck"), moved, &schedule, &mut fresh).is_err());
        let mut missing = ranks;
        missing[1].stages.clear();
        let e = restore(Path::new("ck"), missing, &schedule, &mut fresh).unwrap_err();
        assert!(e.to_string().contains("no rank saved stage 1"), "{e}");
    }
}
