//! [`CudaStage`]: a pipeline stage of the built-in model on a device, a run of [`DeviceLinear`]
//! layers with one optimizer and one stream.
//!
//! Its device methods ([`CudaStage::forward_device`], [`CudaStage::backward_input_device`],
//! [`CudaStage::backward_weight_device`], [`CudaStage::optimizer_step_device`]) take and return
//! [`DeviceTensor`]s and only enqueue work on the stage's stream: that is what a stream program runs.
//! The runtime's [`Stage`] trait (host [`Tensor`]s) is implemented on top of them by copying the
//! input to the device and the result back, which lets today's threaded executor and profiler run
//! the device stages unchanged.
//!
//! A stage made from a host stage that stores BF16 activations
//! ([`LinearStage::with_activations`](pipefill_model::layers::LinearStage::with_activations)) keeps its stash
//! on the device as BF16 buffers ([`DeviceStored::Bf16`]: `X`, `Z`, `dZ`), rounded where the CPU layers
//! round them; [`Stage::held_bytes`] reports 2 bytes a value. The tensors it hands on (its output and
//! its input gradient) are BF16 too, 2 bytes a value: BF16 [`Tensor`]s through the host-tensor path
//! (copied as BF16 bits, both ways), BF16 [`DeviceTensor`]s on the stream runtime's device path (no
//! widening kernel: the next stage's first product reads them as they are). It accepts `f32` or BF16
//! inputs and output gradients on both paths (rounded, or widened, to its own storage type).

use std::sync::Arc;

use cudarc::driver::CudaStream;
use pipefill_host::cost::ActivationDtype;
use pipefill_host::runtime::{Stage, StageError, Tensor};

use super::device::Gpu;
use super::error::CudaError;
use super::launch::Launcher;
use super::layer::DeviceLinear;
use super::precision::Precision;
use super::tensor::{DeviceStored, DeviceTensor};
use pipefill_model::layers::{LinearStage, Optimizer};

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
    /// How activations are stored (the host stage's choice).
    pub activations: ActivationDtype,
    steps: u32,
}

/// What a [`CudaStage`] keeps on the device from `F` to `I` and `W` for one microbatch.
#[derive(Debug)]
pub struct CudaStash {
    rows: usize,
    /// Per layer, its input `X`.
    inputs: Vec<DeviceStored>,
    /// Per layer, `Z` after `F` (when the activation needs it), dropped at `I`.
    pre: Vec<Option<DeviceStored>>,
    /// Per layer, `dZ`, filled by `I`.
    grads: Vec<DeviceStored>,
}

impl CudaStash {
    /// Hands every buffer to `stream` ([`rehome`](super::tensor::rehome)): a backward running on
    /// another stream than its forward (the second lane of an overlapped pair) frees them in its
    /// own order.
    pub fn rehome(&mut self, stream: &Arc<CudaStream>) {
        let take = |v: &mut Vec<DeviceStored>| {
            std::mem::take(v)
                .into_iter()
                .map(|s| s.rehome(stream))
                .collect()
        };
        self.inputs = take(&mut self.inputs);
        self.grads = take(&mut self.grads);
        self.pre = std::mem::take(&mut self.pre)
            .into_iter()
            .map(|p| p.map(|s| s.rehome(stream)))
            .collect();
    }

    /// Bytes of device memory it holds (2 a value for BF16 buffers).
    pub fn bytes(&self) -> usize {
        self.inputs.iter().map(DeviceStored::bytes).sum::<usize>()
            + self
                .pre
                .iter()
                .flatten()
                .map(DeviceStored::bytes)
                .sum::<usize>()
            + self.grads.iter().map(DeviceStored::bytes).sum::<usize>()
    }
}

fn stage_error(e: CudaError) -> StageError {
    StageError::new(e.to_string())
}

/// The error of an empty buffer where `what` must hold values.
fn empty(what: &str) -> CudaError {
    CudaError::Shape {
        what: what.into(),
        expected: 1,
        got: 0,
    }
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

    /// The host stage's layers (weights, optimizer state, step count) copied to the device of
    /// `launcher`, running on its stream, in exact
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
            activations: stage.activations,
            steps: stage.steps(),
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

    /// Refuses an input of `len` values in `rows` rows of `cols` that does not fit the first layer.
    fn check_input(&self, rows: usize, cols: usize, len: usize) -> Result<(), CudaError> {
        if cols != self.inputs() || len == 0 {
            return Err(CudaError::Shape {
                what: "stage input (rows x its first layer's inputs)".into(),
                expected: rows.max(1) * self.inputs(),
                got: len,
            });
        }
        Ok(())
    }

    /// `F`, enqueued: the output (in the stage's storage type: BF16 under `--activations bf16`)
    /// and the stash. The input may be `f32` or BF16.
    pub fn forward_device(
        &mut self,
        input: DeviceTensor,
    ) -> Result<(DeviceTensor, CudaStash), CudaError> {
        let rows = input.rows();
        self.check_input(rows, input.cols(), input.len())?;
        let x = input
            .into_scaled(&self.launcher)?
            .ok_or_else(|| empty("stage input"))?
            .into_dtype(&self.launcher, self.activations)?;
        let (y, stash) = self.forward_stored(x, rows)?;
        Ok((
            DeviceTensor::from_stored(vec![rows, self.outputs()], Some(y))?,
            stash,
        ))
    }

    /// `F` on a stored input of `rows` rows: the output as stored, and the stash.
    fn forward_stored(
        &mut self,
        input: DeviceStored,
        rows: usize,
    ) -> Result<(DeviceStored, CudaStash), CudaError> {
        let n = self.layers.len();
        let mut stash = CudaStash {
            rows,
            inputs: Vec::with_capacity(n),
            pre: Vec::with_capacity(n),
            grads: Vec::new(),
        };
        let mut x = input;
        for layer in &self.layers {
            let (y, z) = layer.forward_stored(&self.launcher, &x, rows, self.activations)?;
            stash.inputs.push(std::mem::replace(&mut x, y));
            stash.pre.push(z);
        }
        Ok((x, stash))
    }

    /// `I`, enqueued: the input gradient in the stage's storage type (empty for the first stage);
    /// keeps `dZ` in the stash. The output gradient may be `f32` (the loss's, with its pending
    /// scale) or BF16.
    pub fn backward_input_device(
        &mut self,
        stash: &mut CudaStash,
        grad_output: DeviceTensor,
    ) -> Result<DeviceTensor, CudaError> {
        let rows = stash.rows;
        self.check_grad(stash, grad_output.len())?;
        let g = grad_output
            .into_scaled(&self.launcher)?
            .ok_or_else(|| empty("output gradient"))?
            .into_dtype(&self.launcher, self.activations)?;
        match self.backward_input_stored(stash, g)? {
            Some(dx) => DeviceTensor::from_stored(vec![rows, self.inputs()], Some(dx)),
            None => DeviceTensor::from_stored(vec![0], None),
        }
    }

    /// Refuses an output gradient of `len` values that does not fit the stash, or a second `I`.
    fn check_grad(&self, stash: &CudaStash, len: usize) -> Result<(), CudaError> {
        let rows = stash.rows;
        if len != rows * self.outputs() || !stash.grads.is_empty() {
            return Err(CudaError::Shape {
                what: "output gradient (or I ran twice for this microbatch)".into(),
                expected: rows * self.outputs(),
                got: len,
            });
        }
        Ok(())
    }

    /// `I` on a stored output gradient: the input gradient as stored (`None` for the first stage).
    fn backward_input_stored(
        &mut self,
        stash: &mut CudaStash,
        grad_output: DeviceStored,
    ) -> Result<Option<DeviceStored>, CudaError> {
        let rows = stash.rows;
        let mut grads = Vec::with_capacity(self.layers.len());
        stash.rehome(self.launcher.stream());
        let mut g = grad_output.rehome(self.launcher.stream());
        let mut dx_out = None;
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let want_input = l > 0 || !self.first;
            let z = stash.pre[l].take();
            let out = layer.backward_input_stored(
                &self.launcher,
                g,
                z,
                rows,
                want_input,
                self.activations,
            )?;
            grads.push(out.dz);
            match out.dx {
                Some(dx) => g = dx,
                None => break,
            }
            if l == 0 {
                dx_out = Some(g);
                break;
            }
        }
        grads.reverse();
        stash.grads = grads;
        Ok(dx_out)
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
            layer.backward_weight_stored(&self.launcher, x, dz, stash.rows)?;
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
        let rows = input.rows();
        self.check_input(rows, input.cols(), input.len())
            .map_err(stage_error)?;
        let x = DeviceStored::from_host(&self.launcher, &input, self.activations)
            .map_err(stage_error)?
            .ok_or_else(|| stage_error(empty("stage input")))?;
        let (y, stash) = self.forward_stored(x, rows).map_err(stage_error)?;
        let y = y
            .to_host(self.stream(), vec![rows, self.outputs()])
            .map_err(stage_error)?;
        Ok((y, stash))
    }

    fn backward_input(
        &mut self,
        stash: &mut CudaStash,
        grad_output: Tensor,
    ) -> Result<Tensor, StageError> {
        self.check_grad(stash, grad_output.len())
            .map_err(stage_error)?;
        let dy = DeviceStored::from_host(&self.launcher, &grad_output, self.activations)
            .map_err(stage_error)?
            .ok_or_else(|| stage_error(empty("output gradient")))?;
        match self.backward_input_stored(stash, dy).map_err(stage_error)? {
            Some(dx) => dx
                .to_host(self.stream(), vec![stash.rows, self.inputs()])
                .map_err(stage_error),
            None => Ok(Tensor::empty()),
        }
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
