//! The CUDA [`Device`] of the stream runtime ([`pipefill_host::runtime::streams`]): [`CudaStreams`]
//! (cudarc streams; events with timing disabled for the order between streams, timing-enabled ones
//! as the per-action marks), the stage and loss wrappers that enqueue on the stream each call is
//! given (a [`Launcher`]: the stream and its device), and [`DeviceTensor`] as the runtime's
//! [`Payload`].
//!
//! The context has cudarc's event tracking off ([`Gpu::open`]): the only order between streams is
//! the program's records and waits. Buffers crossing streams are re-homed to their consumer
//! ([`super::tensor::rehome`]) so they are freed in its order.
//!
//! Several devices ([`CudaStreams::on_devices`]: one GPU per rank, or ranks spread round robin):
//! each rank's streams are made on its device's context, events recorded on one device are waited
//! on by streams of another (`cuStreamWaitEvent` takes an event of any device of the process), and
//! a payload that crosses devices is peer-copied on the consumer's stream ([`Device::adopt`],
//! `streams/devices.rs`).

use std::sync::atomic::AtomicUsize;

mod devices;
mod graph;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaStream};
use pipefill_host::runtime::streams::{
    Device, DeviceError, GradientsFn, StreamId, StreamLoss, StreamStage,
};
use pipefill_host::runtime::{Payload, StageError};

use super::device::Gpu;
use super::error::CudaError;
use super::launch::Launcher;
use super::stage::{CudaStage, CudaStash};
use super::tensor::{DeviceStored, DeviceTensor};
use pipefill_model::layers::LossKind;

/// The streams and what crosses devices, shared by the clones of a device.
#[derive(Debug)]
struct Link {
    /// The devices, by index (one unless made by [`CudaStreams::on_devices`]).
    gpus: Vec<Arc<Gpu>>,
    /// The device index of each rank (empty: every rank on device 0).
    rank_devices: Vec<usize>,
    streams: Mutex<Vec<Arc<CudaStream>>>,
    /// The device index of each stream.
    stream_devices: Mutex<Vec<usize>>,
    /// Bytes peer-copied between devices so far.
    copied: AtomicUsize,
    /// Sources of peer copies, kept until the next device-wide synchronisation (their
    /// stream-ordered free, on the producer's device, must follow the copy on the consumer's).
    parked: Mutex<Vec<DeviceStored>>,
}

impl Link {
    fn streams(&self) -> MutexGuard<'_, Vec<Arc<CudaStream>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stream(&self, i: usize) -> Result<Arc<CudaStream>, CudaError> {
        let streams = self.streams();
        streams.get(i).cloned().ok_or_else(|| CudaError::Shape {
            what: format!("stream {i} (make_streams not called, or too few streams)"),
            expected: i + 1,
            got: streams.len(),
        })
    }
}

fn device_error(e: CudaError) -> DeviceError {
    DeviceError::new(e.to_string())
}

fn stage_error(e: CudaError) -> StageError {
    StageError::new(e.to_string())
}

/// CUDA streams for the stream runtime: one stream per program stream, all on the same GPU (ranks
/// share its SMs; [`CudaStreams::new`]) or each rank's on its own device
/// ([`CudaStreams::on_devices`]: payloads crossing devices are peer-copied, timing marks are read
/// against one origin per device).
///
/// It can capture a whole step as a CUDA graph ([`Device::begin_capture`], used by
/// [`StreamExecutor::capture`](pipefill_host::runtime::streams::StreamExecutor::capture)), on one
/// device or across several (`streams/graph.rs`): capture runs on stream 0 in thread-local mode,
/// the other streams (of any device) join it through the executor's fork events and are joined
/// back before it ends, buffers made during the capture are graph allocations (stream-ordered
/// allocation is required on every device), and the graph is instantiated with
/// auto-free-on-launch, since the loss partials are allocated in the graph and read after each
/// launch. A clone shares the streams, not the graph; the graph stays with the device that
/// captured it (moved with it, never shared).
pub struct CudaStreams {
    link: Arc<Link>,
    /// Each stream with its device, as stage calls are given them.
    launchers: Vec<Launcher>,
    graph: Option<Graph>,
    /// The step's time origin on each device other than stream 0's (see `Device::origin`).
    origins: Vec<Option<CudaEvent>>,
}

/// A captured step's CUDA graph, which a [`CudaStreams`] (and the executor holding it) may be moved
/// to another thread with: a data-parallel replica's steps run on a host thread of its own.
struct Graph(CudaGraph);

// SAFETY: a CUDA graph and its executable instance are driver handles valid in every thread of
// the process; cudarc binds the graph's context to the calling thread before each launch and
// upload, and destroying the handles needs no current context. `Graph` is only moved between
// threads (it is not `Sync`), so no two threads use it at once.
unsafe impl Send for Graph {}

impl Clone for CudaStreams {
    fn clone(&self) -> Self {
        CudaStreams {
            link: self.link.clone(),
            launchers: self.launchers.clone(),
            graph: None,
            origins: Vec::new(),
        }
    }
}

impl std::fmt::Debug for CudaStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStreams")
            .field("link", &self.link)
            .field("captured", &self.graph.is_some())
            .finish()
    }
}

impl CudaStreams {
    /// Streams on `gpu` for every rank (made by the executor through [`Device::make_streams`]).
    pub fn new(gpu: Arc<Gpu>) -> Self {
        Self::build(vec![gpu], Vec::new())
    }

    fn build(gpus: Vec<Arc<Gpu>>, rank_devices: Vec<usize>) -> Self {
        CudaStreams {
            link: Arc::new(Link {
                gpus,
                rank_devices,
                streams: Mutex::new(Vec::new()),
                stream_devices: Mutex::new(Vec::new()),
                copied: AtomicUsize::new(0),
                parked: Mutex::new(Vec::new()),
            }),
            launchers: Vec::new(),
            graph: None,
            origins: Vec::new(),
        }
    }

    /// Device 0 (the one of [`CudaStreams::new`]).
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.link.gpus[0]
    }

    /// `stage`, enqueuing each call on the stream it is given.
    pub fn stage(&self, stage: CudaStage) -> OnCudaStreams {
        OnCudaStreams { stage }
    }

    /// The built-in loss `kind`, computed on the stream it is given.
    pub fn loss(&self, kind: LossKind) -> CudaLoss {
        CudaLoss { kind }
    }
}

impl Device for CudaStreams {
    type Payload = DeviceTensor;
    type Stream = Launcher;
    type Event = CudaEvent;
    type Mark = CudaEvent;

    fn make_streams(&mut self, streams: &[StreamId]) -> Result<(), DeviceError> {
        let devices = self.map_streams(streams).map_err(device_error)?;
        let made = devices
            .iter()
            .map(|&d| self.link.gpus[d].new_stream())
            .collect::<Result<Vec<_>, _>>()
            .map_err(device_error)?;
        self.launchers = made
            .iter()
            .zip(&devices)
            .map(|(s, &d)| Launcher::new(self.link.gpus[d].clone(), s.clone()))
            .collect();
        *self.link.streams() = made;
        *self.link.stream_devices() = devices;
        Ok(())
    }

    fn stream(&self, index: usize) -> Option<&Launcher> {
        self.launchers.get(index)
    }

    fn record(&mut self, stream: usize) -> Result<CudaEvent, DeviceError> {
        let s = self.link.stream(stream).map_err(device_error)?;
        s.record_event(None)
            .map_err(|e| device_error(CudaError::driver("cuEventRecord")(e)))
    }

    fn wait(&mut self, stream: usize, event: &CudaEvent) -> Result<(), DeviceError> {
        let s = self.link.stream(stream).map_err(device_error)?;
        s.wait(event)
            .map_err(|e| device_error(CudaError::driver("cuStreamWaitEvent")(e)))
    }

    fn mark(&mut self, stream: usize) -> Result<CudaEvent, DeviceError> {
        let s = self.link.stream(stream).map_err(device_error)?;
        s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| device_error(CudaError::driver("cuEventRecord (timing)")(e)))
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        for gpu in &self.link.gpus {
            gpu.synchronize().map_err(device_error)?;
            gpu.context()
                .check_err()
                .map_err(|e| device_error(CudaError::driver("an earlier asynchronous call")(e)))?;
        }
        // Every peer copy is done: the sources can be freed.
        self.link.parked().clear();
        Ok(())
    }

    fn seconds(&self, origin: &CudaEvent, mark: &CudaEvent) -> Result<f64, DeviceError> {
        let origin = self.origin_for(origin, mark);
        origin
            .elapsed_ms(mark)
            .map(|ms| f64::from(ms) / 1e3)
            .map_err(|e| device_error(CudaError::driver("cuEventElapsedTime")(e)))
    }

    fn origin(&mut self) -> Result<CudaEvent, DeviceError> {
        self.mark_origins().map_err(device_error)
    }

    fn stream_device(&self, stream: usize) -> usize {
        self.link.device_of(stream)
    }

    fn payload_device(&self, payload: &DeviceTensor) -> Option<usize> {
        self.link.device_holding(payload)
    }

    fn adopt(&mut self, stream: usize, payload: DeviceTensor) -> Result<DeviceTensor, DeviceError> {
        self.link.adopt(stream, payload).map_err(device_error)
    }

    fn begin_capture(&mut self) -> Result<(), DeviceError> {
        self.start_capture()
    }

    fn end_capture(&mut self) -> Result<(), DeviceError> {
        self.finish_capture()
    }

    fn replay(&mut self) -> Result<(), DeviceError> {
        self.launch_graph()
    }

    fn copy(&self, stream: usize, src: &DeviceTensor) -> Result<DeviceTensor, DeviceError> {
        let s = self.link.stream(stream).map_err(device_error)?;
        copy_on(&s, src).map_err(device_error)
    }

    fn refresh(&mut self, dst: &mut DeviceTensor, src: DeviceTensor) -> Result<(), DeviceError> {
        self.refresh_fixed(dst, src).map_err(device_error)
    }

    fn read_loss(&self, loss: &DeviceLoss) -> Result<f32, DeviceError> {
        loss.value().map_err(device_error)
    }
}

/// The error of a payload whose shape or pending scale a graph copy cannot take.
fn unfit(what: &str, expected: usize, got: usize) -> CudaError {
    CudaError::Shape {
        what: what.to_string(),
        expected,
        got,
    }
}

/// A new buffer on `s` holding `src`'s values in its storage type (a graph allocation and copy
/// node under capture).
fn copy_on(s: &Arc<CudaStream>, src: &DeviceTensor) -> Result<DeviceTensor, CudaError> {
    if src.pending_scale() != 1.0 {
        return Err(unfit(
            "graph input with a pending scale (not supported)",
            1,
            0,
        ));
    }
    let copied = src.stored().map(|x| x.duplicate(s)).transpose()?;
    DeviceTensor::from_stored(src.shape().to_vec(), copied)
}

/// Copies `src` into `dst` on `s` (stream 0, where the graph launches next); `src` is re-homed to
/// `s`, so its stream-ordered free comes after the copy. Both must have one shape and storage type.
fn refresh_on(
    s: &Arc<CudaStream>,
    dst: &mut DeviceTensor,
    src: DeviceTensor,
) -> Result<(), CudaError> {
    if src.shape() != dst.shape() || src.pending_scale() != 1.0 {
        return Err(unfit(
            &format!(
                "refreshed buffer of shape {:?} (no pending scale)",
                dst.shape()
            ),
            dst.len(),
            src.len(),
        ));
    }
    let Some(x) = src.into_stored() else {
        return Ok(());
    };
    let x = x.rehome(s);
    let d = dst
        .stored_mut()
        .ok_or_else(|| unfit("refreshed buffer", x.len(), 0))?;
    x.copy_into(d, s)
}

impl Payload for DeviceTensor {
    type Loss = DeviceLoss;

    fn bytes(&self) -> usize {
        DeviceTensor::bytes(self)
    }

    fn scale_by(&mut self, by: f32) -> Result<(), StageError> {
        self.scale_later(by);
        Ok(())
    }

    fn loss_value(loss: DeviceLoss) -> Result<f32, StageError> {
        loss.value().map_err(stage_error)
    }
}

/// A loss value still on the device: per-block or per-row partial sums and what to divide their
/// sum by. Read after the step ([`DeviceLoss::value`]).
#[derive(Debug)]
pub struct DeviceLoss {
    partial: CudaSlice<f32>,
    divisor: f64,
}

impl DeviceLoss {
    /// The loss: the partials copied back (waits for their stream), summed in `f64`, divided.
    pub fn value(&self) -> Result<f32, CudaError> {
        let s = self.partial.stream();
        let v = s
            .clone_dtoh(&self.partial)
            .map_err(CudaError::driver("memcpy loss to host"))?;
        s.synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))?;
        let sum: f64 = v.iter().map(|&x| f64::from(x)).sum();
        Ok((sum / self.divisor) as f32)
    }
}

/// A [`CudaStage`] of the stream runtime: each call enqueues on the stream it is given.
#[derive(Debug)]
pub struct OnCudaStreams {
    stage: CudaStage,
}

impl OnCudaStreams {
    /// The stage.
    pub fn inner(&self) -> &CudaStage {
        &self.stage
    }

    /// The stage, for changes between steps (a data-parallel gradient mean).
    pub fn inner_mut(&mut self) -> &mut CudaStage {
        &mut self.stage
    }

    /// The stage enqueuing on `on`; refused when that stream is on another device than the one
    /// the stage's parameters live on.
    fn on(&mut self, on: &Launcher) -> Result<&mut CudaStage, StageError> {
        let (mine, bound) = (self.stage.launcher().gpu(), on.gpu());
        if mine.context() != bound.context() {
            return Err(StageError::new(format!(
                "the stage's parameters live on GPU {} (its own context) but it was given a stream \
                 on GPU {}: build each stage on its rank's device",
                mine.ordinal(),
                bound.ordinal()
            )));
        }
        self.stage.set_stream(on.stream().clone());
        Ok(&mut self.stage)
    }
}

impl StreamStage<Launcher, DeviceTensor> for OnCudaStreams {
    type Stash = CudaStash;

    fn forward(
        &mut self,
        on: &Launcher,
        input: DeviceTensor,
    ) -> Result<(DeviceTensor, CudaStash), StageError> {
        self.on(on)?.forward_device(input).map_err(stage_error)
    }

    fn backward_input(
        &mut self,
        on: &Launcher,
        stash: &mut CudaStash,
        grad_output: DeviceTensor,
    ) -> Result<DeviceTensor, StageError> {
        self.on(on)?
            .backward_input_device(stash, grad_output)
            .map_err(stage_error)
    }

    fn backward_weight(&mut self, on: &Launcher, stash: CudaStash) -> Result<(), StageError> {
        self.on(on)?
            .backward_weight_device(stash)
            .map_err(stage_error)
    }

    fn held_bytes(&self, stash: &CudaStash) -> usize {
        stash.bytes()
    }

    /// Host-side only (the next gradient overwrites instead of adding).
    fn zero_grad(&mut self, _: &Launcher) {
        self.stage.zero_grad_device();
    }

    /// The update on `on` (its rank's main stream), then a wait for it: the next step's first
    /// action may run on another stream, which nothing else orders after this update.
    fn optimizer_step(&mut self, on: &Launcher) -> Result<(), StageError> {
        let stage = self.on(on)?;
        stage.optimizer_step_device().map_err(stage_error)?;
        stage.synchronize().map_err(stage_error)
    }

    /// The gradients copied to the host (a gradient nothing accumulated into as zeros), given to
    /// `f`, and what `f` leaves copied back, on `on`; then a wait for the copies.
    fn with_gradients(&mut self, on: &Launcher, f: &mut GradientsFn<'_>) -> Result<(), StageError> {
        let stage = self.on(on)?;
        let la = stage.launcher().clone();
        let mut host = Vec::with_capacity(stage.layers.len());
        for l in &stage.layers {
            let (w, b) = match l.grads_to_host(&la).map_err(stage_error)? {
                Some(pair) => pair,
                None => (vec![0.0; l.inputs * l.outputs], vec![0.0; l.outputs]),
            };
            host.push((w, b));
        }
        f(host
            .iter_mut()
            .flat_map(|(w, b)| [&mut w[..], &mut b[..]])
            .collect())?;
        for (l, (w, b)) in stage.layers.iter_mut().zip(&host) {
            l.grads_from_host(&la, (w, b)).map_err(stage_error)?;
        }
        stage.synchronize().map_err(stage_error)
    }
}

pipefill_host::boxed_stream_stage!(Launcher, DeviceTensor);

/// The built-in loss on the stream it is given. Targets are [`DeviceTensor`]s: values of the
/// output's shape (MSE) or class indices made by [`DeviceTensor::labels`] (cross-entropy).
#[derive(Debug, Clone)]
pub struct CudaLoss {
    kind: LossKind,
}

impl CudaLoss {
    fn compute(
        &self,
        la: &Launcher,
        output: &DeviceTensor,
        target: &DeviceTensor,
    ) -> Result<(DeviceLoss, DeviceTensor), CudaError> {
        let empty = |what: &str| CudaError::Shape {
            what: what.to_string(),
            expected: 1,
            got: 0,
        };
        if output.pending_scale() != 1.0 || target.pending_scale() != 1.0 {
            return Err(empty("loss input with a pending scale (not supported)"));
        }
        // A BF16 stage's output is widened (exactly) for the loss kernels, which read `f32`; the
        // gradient they write is `f32` and never crosses ranks (the last stage's own backward).
        let out = output.widen(la)?.ok_or_else(|| empty("loss input"))?;
        let t = target
            .slice()
            .ok_or_else(|| empty("loss target (f32 values or labels)"))?;
        let n = output.len();
        let alloc = |n: usize| {
            la.stream()
                .alloc_zeros::<f32>(n)
                .map_err(CudaError::driver("cuMemAllocAsync"))
        };
        let mut grad = alloc(n)?;
        let (partial, divisor) = match self.kind {
            LossKind::Mse => {
                let mut partial = alloc(Launcher::mse_partials(n))?;
                la.mse_forward(&out, t, &mut partial)?;
                la.mse_grad(&out, t, &mut grad, 1.0 / n as f32)?;
                (partial, n as f64)
            }
            LossKind::CrossEntropy => {
                let rows = target.len();
                // SAFETY: the labels' bits are `u32`s (`DeviceTensor::labels`), same size as `f32`.
                let labels = unsafe { t.transmute::<u32>(rows) }.ok_or_else(|| empty("labels"))?;
                let mut row_loss = alloc(rows)?;
                la.softmax_ce_forward(&out, &labels, output.cols(), &mut row_loss)?;
                la.softmax_ce_grad(&out, &labels, &mut grad, output.cols(), 1.0 / rows as f32)?;
                (row_loss, rows as f64)
            }
        };
        Ok((
            DeviceLoss { partial, divisor },
            DeviceTensor::from_slice(output.shape().to_vec(), Some(grad))?,
        ))
    }
}

impl StreamLoss<Launcher, DeviceTensor> for CudaLoss {
    fn loss(
        &self,
        on: &Launcher,
        output: &DeviceTensor,
        target: &DeviceTensor,
    ) -> Result<(DeviceLoss, DeviceTensor), StageError> {
        self.compute(on, output, target).map_err(stage_error)
    }
}
