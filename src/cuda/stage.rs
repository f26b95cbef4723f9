//! [`CudaStage`]: a pipeline stage of the built-in model on a device, a run of [`DeviceLinear`]
//! layers with one optimizer and one stream.
//!
//! Its device methods ([`CudaStage::forward_device`], [`CudaStage::backward_input_device`],
//! [`CudaStage::backward_weight_device`], [`CudaStage::optimizer_step_device`]) take and return
//! [`DeviceTensor`]s and only enqueue work on the stage's stream: that is what a stream program runs.
//! The runtime's [`Stage`] trait (host [`Tensor`]s) is implemented on top of them by copying the
//! input to the device and the result back, which lets today's threaded executor and profiler run
//! the device stages unchanged.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use pipefill_host::runtime::{Stage, StageError, Tensor};

use super::device::Gpu;
use super::error::CudaError;
use super::launch::Launcher;
use super::layer::DeviceLinear;
use super::precision::Precision;
use super::tensor::{rehome, DeviceTensor};
use crate::layers::{LinearStage, Optimizer};

/// A stage of the built-in model on a device.
#[derive(Debug)]
pub struct CudaStage {
    launcher: Launcher,
    /// The layers, in order.
    pub layers: Vec<DeviceLinear>,
    /// The update applied by the optimizer step.
    pub optimizer: Optimizer,
    /// `true` for the model's first stage: its input gradient is not computed.
    pub first: bool,
    steps: u32,
}

/// What a [`CudaStage`] keeps on the device from `F` to `I` and `W` for one microbatch.
#[derive(Debug)]
pub struct CudaStash {
    rows: usize,
    /// Per layer, its input `X`.
    inputs: Vec<CudaSlice<f32>>,
    /// Per layer, `Z` after `F` (when the activation needs it), dropped at `I`.
    pre: Vec<Option<CudaSlice<f32>>>,
    /// Per layer, `dZ`, filled by `I`.
    grads: Vec<CudaSlice<f32>>,
}

impl CudaStash {
    /// Hands every buffer to `stream` ([`rehome`]): a backward running on another stream than its
    /// forward (the second lane of an overlapped pair) frees them in its own order.
    pub fn rehome(&mut self, stream: &Arc<CudaStream>) {
        let take = |v: &mut Vec<CudaSlice<f32>>| {
            std::mem::take(v)
                .into_iter()
                .map(|s| rehome(s, stream))
                .collect()
        };
        self.inputs = take(&mut self.inputs);
        self.grads = take(&mut self.grads);
        self.pre = std::mem::take(&mut self.pre)
            .into_iter()
            .map(|p| p.map(|s| rehome(s, stream)))
            .collect();
    }

    /// Bytes of device memory it holds.
    pub fn bytes(&self) -> usize {
        let values: usize = self.inputs.iter().map(CudaSlice::len).sum::<usize>()
            + self.pre.iter().flatten().map(CudaSlice::len).sum::<usize>()
            + self.grads.iter().map(CudaSlice::len).sum::<usize>();
        values * std::mem::size_of::<f32>()
    }
}

fn stage_error(e: CudaError) -> StageError {
    StageError::new(e.to_string())
}

impl CudaStage {
    /// The host stage's layers copied to `gpu`, with a new stream of its own, computing in exact
    /// `f32` ([`Precision::Fp32`]; [`CudaStage::from_host_in`] chooses).
    pub fn from_host(gpu: &Arc<Gpu>, stage: &LinearStage) -> Result<Self, CudaError> {
        Self::from_host_in(gpu, stage, Precision::Fp32)
    }

    /// [`CudaStage::from_host`] with the layers' products in `precision`.
    pub fn from_host_in(
        gpu: &Arc<Gpu>,
        stage: &LinearStage,
        precision: Precision,
    ) -> Result<Self, CudaError> {
        let launcher = Launcher::new(gpu.clone(), gpu.new_stream()?);
        Self::on_stream_in(launcher, stage, precision)
    }

    /// The host stage's layers copied to the device of `launcher`, running on its stream, in exact
    /// `f32` ([`CudaStage::on_stream_in`] chooses).
    pub fn on_stream(launcher: Launcher, stage: &LinearStage) -> Result<Self, CudaError> {
        Self::on_stream_in(launcher, stage, Precision::Fp32)
    }

    /// [`CudaStage::on_stream`] with the layers' products in `precision`.
    pub fn on_stream_in(
        launcher: Launcher,
        stage: &LinearStage,
        precision: Precision,
    ) -> Result<Self, CudaError> {
        let layers = stage
            .layers
            .iter()
            .map(|l| DeviceLinear::from_host_in(&launcher, l, precision))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CudaStage {
            launcher,
            layers,
            optimizer: stage.optimizer,
            first: stage.first,
            steps: 0,
        })
    }

    /// The launcher (device and stream) the stage enqueues on.
    pub fn launcher(&self) -> &Launcher {
        &self.launcher
    }

    /// The stream the stage enqueues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.launcher.stream()
    }

    /// Enqueues on `stream` from now on (the stream runtime binds each action's stream). Buffers the
    /// stage already holds stay owned by the stream that made them.
    pub fn set_stream(&mut self, stream: Arc<CudaStream>) {
        if self.launcher.stream() != &stream {
            self.launcher = Launcher::new(self.launcher.gpu().clone(), stream);
        }
    }

    /// Width of the stage's input.
    pub fn inputs(&self) -> usize {
        self.layers.first().map_or(0, |l| l.inputs)
    }

    /// Width of the stage's output.
    pub fn outputs(&self) -> usize {
        self.layers.last().map_or(0, |l| l.outputs)
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// `F`, enqueued: the output and the stash.
    pub fn forward_device(
        &mut self,
        input: DeviceTensor,
    ) -> Result<(DeviceTensor, CudaStash), CudaError> {
        let rows = input.rows();
        if input.cols() != self.inputs() || input.is_empty() {
            return Err(CudaError::Shape {
                what: "stage input (rows x its first layer's inputs)".into(),
                expected: rows.max(1) * self.inputs(),
                got: input.len(),
            });
        }
        let n = self.layers.len();
        let mut stash = CudaStash {
            rows,
            inputs: Vec::with_capacity(n),
            pre: Vec::with_capacity(n),
            grads: Vec::new(),
        };
        let mut x = input
            .into_scaled(&self.launcher)?
            .ok_or_else(|| CudaError::Shape {
                what: "stage input".into(),
                expected: 1,
                got: 0,
            })?;
        for layer in &self.layers {
            let (y, z) = layer.forward(&self.launcher, &x, rows)?;
            stash.inputs.push(std::mem::replace(&mut x, y));
            stash.pre.push(z);
        }
        Ok((
            DeviceTensor::from_slice(vec![rows, self.outputs()], Some(x))?,
            stash,
        ))
    }

    /// `I`, enqueued: the input gradient (empty for the first stage); keeps `dZ` in the stash.
    pub fn backward_input_device(
        &mut self,
        stash: &mut CudaStash,
        grad_output: DeviceTensor,
    ) -> Result<DeviceTensor, CudaError> {
        let rows = stash.rows;
        if grad_output.len() != rows * self.outputs() || !stash.grads.is_empty() {
            return Err(CudaError::Shape {
                what: "output gradient (or I ran twice for this microbatch)".into(),
                expected: rows * self.outputs(),
                got: grad_output.len(),
            });
        }
        let mut grads = Vec::with_capacity(self.layers.len());
        stash.rehome(self.launcher.stream());
        let mut g = grad_output
            .into_scaled(&self.launcher)?
            .ok_or_else(|| CudaError::Shape {
                what: "output gradient".into(),
                expected: 1,
                got: 0,
            })?;
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let want_input = l > 0 || !self.first;
            let out =
                layer.backward_input(&self.launcher, g, stash.pre[l].take(), rows, want_input)?;
            grads.push(out.dz);
            match out.dx {
                Some(dx) => g = dx,
                None => {
                    grads.reverse();
                    stash.grads = grads;
                    return DeviceTensor::from_slice(vec![0], None);
                }
            }
        }
        grads.reverse();
        stash.grads = grads;
        DeviceTensor::from_slice(vec![rows, self.inputs()], Some(g))
    }

    /// `W`, enqueued: adds this microbatch's weight gradients; consumes the stash.
    pub fn backward_weight_device(&mut self, mut stash: CudaStash) -> Result<(), CudaError> {
        stash.rehome(self.launcher.stream());
        if stash.grads.len() != self.layers.len() {
            return Err(CudaError::Shape {
                what: "output gradients in the stash (W before I?)".into(),
                expected: self.layers.len(),
                got: stash.grads.len(),
            });
        }
        for ((layer, x), dz) in self.layers.iter_mut().zip(&stash.inputs).zip(&stash.grads) {
            layer.backward_weight(&self.launcher, x, dz, stash.rows)?;
        }
        Ok(())
    }

    /// Starts a new gradient accumulation.
    pub fn zero_grad_device(&mut self) {
        self.layers.iter_mut().for_each(DeviceLinear::zero_grad);
    }

    /// The optimizer step, enqueued.
    pub fn optimizer_step_device(&mut self) -> Result<(), CudaError> {
        self.steps += 1;
        let (t, opt) = (self.steps, self.optimizer);
        for l in &mut self.layers {
            l.update(&self.launcher, &opt, t)?;
        }
        Ok(())
    }

    /// Waits for everything enqueued on the stage's stream.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream()
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))
    }
}

impl Stage for CudaStage {
    type Stash = CudaStash;

    fn forward(&mut self, input: Tensor) -> Result<(Tensor, CudaStash), StageError> {
        let x = DeviceTensor::from_host(self.stream(), &input).map_err(stage_error)?;
        let (y, stash) = self.forward_device(x).map_err(stage_error)?;
        Ok((y.to_host(self.stream()).map_err(stage_error)?, stash))
    }

    fn backward_input(
        &mut self,
        stash: &mut CudaStash,
        grad_output: Tensor,
    ) -> Result<Tensor, StageError> {
        let dy = DeviceTensor::from_host(self.stream(), &grad_output).map_err(stage_error)?;
        let dx = self.backward_input_device(stash, dy).map_err(stage_error)?;
        if dx.is_empty() {
            return Ok(Tensor::empty());
        }
        dx.to_host(self.stream()).map_err(stage_error)
    }

    fn backward_weight(&mut self, stash: CudaStash) -> Result<(), StageError> {
        self.backward_weight_device(stash).map_err(stage_error)?;
        // The host-tensor path is synchronous, as the CPU layers are: callers time it with a
        // host clock.
        self.synchronize().map_err(stage_error)
    }

    fn held_bytes(&self, stash: &CudaStash) -> usize {
        stash.bytes()
    }

    fn zero_grad(&mut self) {
        self.zero_grad_device();
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        self.optimizer_step_device().map_err(stage_error)?;
        self.synchronize().map_err(stage_error)
    }
}
