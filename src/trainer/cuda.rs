//! The CUDA pieces of the [`Streams`](super::Streams) runner: [`Trainable`] for a stage on CUDA
//! streams (its state copied to the host) and [`CudaUpload`], which copies a
//! step's batch to the devices of the first and the last stage.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use pipefill_host::runtime::{StageError, Tensor};

use super::streams::Uploaded;
use super::{Trainable, Upload};
use crate::checkpoint::{LayerState, StageState};
use crate::cuda::{CudaError, DeviceTensor, OnCudaStreams};
use crate::layers::LossKind;

fn stage_error(e: CudaError) -> StageError {
    StageError::new(e.to_string())
}

impl Trainable for OnCudaStreams {
    fn state(&self, index: usize) -> Result<StageState, StageError> {
        let stage = self.inner();
        let la = stage.launcher();
        let layers = stage
            .layers
            .iter()
            .map(|l| {
                let (weight, bias) = l.parameters_to_host(la)?;
                let [weight_moments, bias_moments] = l.moments_to_host(la)?;
                Ok(LayerState {
                    inputs: l.inputs,
                    outputs: l.outputs,
                    activation: l.activation,
                    weight,
                    bias,
                    weight_moments,
                    bias_moments,
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()
            .map_err(stage_error)?;
        Ok(StageState {
            stage: index,
            steps: stage.steps(),
            layers,
        })
    }
}

/// Copies a step's inputs to stage 0's GPU and its targets to the last stage's, on one upload
/// stream per GPU, and waits for the copies.
pub struct CudaUpload {
    /// One stream per GPU, by device index.
    pub streams: Vec<Arc<CudaStream>>,
    /// The loss the targets are for (values for MSE, class labels for cross-entropy).
    pub loss: LossKind,
}

impl Upload<DeviceTensor> for CudaUpload {
    fn upload(&self, x: &[Tensor], t: &[Tensor], on: (usize, usize)) -> Uploaded<DeviceTensor> {
        let stream = |d: usize| {
            self.streams
                .get(d)
                .ok_or_else(|| format!("no upload stream for GPU {d}"))
        };
        upload_batch((stream(on.0)?, stream(on.1)?), self.loss, x, t).map_err(|e| e.to_string())
    }
}

/// A microbatch's target on the device: values (MSE) or class labels (cross-entropy).
fn target(stream: &Arc<CudaStream>, kind: LossKind, t: &Tensor) -> Result<DeviceTensor, CudaError> {
    match kind {
        LossKind::Mse => DeviceTensor::from_host(stream, t),
        LossKind::CrossEntropy => {
            // The teacher's classes are whole numbers in range; the loss kernel checks the range.
            let classes: Vec<u32> = t.data().iter().map(|&c| c.max(0.0) as u32).collect();
            DeviceTensor::labels(stream, &classes)
        }
    }
}

/// A step's inputs copied to the device of `upload.0` and its targets to that of `upload.1`
/// (waits for the copies).
pub fn upload_batch(
    upload: (&Arc<CudaStream>, &Arc<CudaStream>),
    kind: LossKind,
    x: &[Tensor],
    t: &[Tensor],
) -> Result<(Vec<DeviceTensor>, Vec<DeviceTensor>), CudaError> {
    let inputs = x
        .iter()
        .map(|x| DeviceTensor::from_host(upload.0, x))
        .collect::<Result<Vec<_>, _>>()?;
    let targets = t
        .iter()
        .map(|t| target(upload.1, kind, t))
        .collect::<Result<Vec<_>, _>>()?;
    for s in [upload.0, upload.1] {
        s.synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))?;
    }
    Ok((inputs, targets))
}
