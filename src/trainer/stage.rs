//! What the trainer needs of a stage beyond running it ([`Trainable`]: its checkpoint state and its
//! gradients for the replica mean), and the replica mean itself ([`mean_over_replicas`]).

use pipefill_host::runtime::streams::OnStreams;
use pipefill_host::runtime::{AllReduce, Stage, StageError};

use super::TrainError;
use crate::checkpoint::StageState;
use crate::layers::LinearStage;

/// What [`Trainable::with_gradients`] calls with a stage's gradient buffers.
pub type GradientsFn<'a> = dyn FnMut(Vec<&mut [f32]>) -> Result<(), StageError> + 'a;

/// A stage the trainer can checkpoint and average over replicas.
pub trait Trainable {
    /// The stage's checkpoint state (weights, optimizer moments, steps), global index `index`.
    /// On a device, this copies them to the host (and waits for the device).
    fn state(&self, index: usize) -> Result<StageState, StageError>;

    /// Calls `f` with the stage's accumulated gradient buffers (in [`Stage::gradients`]' order, a
    /// gradient nothing accumulated into written out as zeros), keeping what `f` leaves in them.
    /// On a device: copied to the host, then back.
    fn with_gradients(&mut self, f: &mut GradientsFn<'_>) -> Result<(), StageError>;
}

impl Trainable for LinearStage {
    fn state(&self, index: usize) -> Result<StageState, StageError> {
        Ok(StageState::of(index, self))
    }

    fn with_gradients(&mut self, f: &mut GradientsFn<'_>) -> Result<(), StageError> {
        f(self.gradients())
    }
}

/// The CPU twin of a device stage: the host stage a [`CpuStreams`](pipefill_host::runtime::streams::CpuStreams)
/// worker runs (read between steps, once the device is synchronised).
impl<S: Trainable> Trainable for OnStreams<S> {
    fn state(&self, index: usize) -> Result<StageState, StageError> {
        self.inner().state(index)
    }

    fn with_gradients(&mut self, f: &mut GradientsFn<'_>) -> Result<(), StageError> {
        self.inner().with_gradients(f)
    }
}

/// Averages each stage's gradients over the replicas: `replicas[d]` are replica `d`'s stages, in
/// global order. The mean is the runtime's [`AllReduce`] (summed in replica order, so bit-equal to
/// the threaded replicas' reduction), one thread per replica.
pub fn mean_over_replicas<S: Trainable + Send>(replicas: Vec<&mut [S]>) -> Result<(), StageError> {
    let stages = replicas.first().map_or(0, |r| r.len());
    let ar = AllReduce::new(replicas.len(), stages);
    let ar = &ar;
    std::thread::scope(|scope| {
        let workers: Vec<_> = replicas
            .into_iter()
            .enumerate()
            .map(|(d, stages)| {
                scope.spawn(move || {
                    for (s, stage) in stages.iter_mut().enumerate() {
                        let done = stage.with_gradients(&mut |g| ar.reduce(d, s, g));
                        if let Err(e) = done {
                            ar.poison();
                            return Err(StageError::new(format!(
                                "replica {d}: gradient mean of stage {s}: {e}"
                            )));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let mut first = Ok(());
        for w in workers {
            let r = w
                .join()
                .unwrap_or_else(|_| Err(StageError::new("a replica's gradient mean panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
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
