//! What the trainer needs of a stage beyond running it ([`Trainable`]: its checkpoint state). The
//! replicas' gradient mean is the runtime's `Reducer` on every runner (a stream stage lends its
//! gradients through `StreamStage::with_gradients`).

use pipefill_host::runtime::streams::OnStreams;
use pipefill_host::runtime::StageError;

use super::TrainError;
use crate::checkpoint::StageState;
use crate::layers::LinearStage;

/// A stage the trainer can checkpoint.
pub trait Trainable {
    /// The stage's checkpoint state (weights, optimizer moments, steps), global index `index`.
    /// On a device, this copies them to the host (and waits for the device).
    fn state(&self, index: usize) -> Result<StageState, StageError>;
}

impl Trainable for LinearStage {
    fn state(&self, index: usize) -> Result<StageState, StageError> {
        Ok(StageState::of(index, self))
    }
}

/// The CPU twin of a device stage: the host stage a [`CpuStreams`](pipefill_host::runtime::streams::CpuStreams)
/// worker runs (read between steps, once the device is synchronised).
impl<S: Trainable> Trainable for OnStreams<S> {
    fn state(&self, index: usize) -> Result<StageState, StageError> {
        self.inner().state(index)
    }
}

/// The checkpoint states of `(global index, stage)`s, after step `done`.
pub fn states_of<'a, S: Trainable + 'a>(
    stages: impl IntoIterator<Item = (usize, &'a S)>,
    done: usize,
) -> Result<Vec<StageState>, TrainError> {
    stages
        .into_iter()
        .map(|(s, stage)| {
            stage.state(s).map_err(|e| {
                TrainError::Runner(format!("checkpoint after step {done}: stage {s}: {e}"))
            })
        })
        .collect()
}
