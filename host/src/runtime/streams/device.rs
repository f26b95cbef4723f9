//! [`Device`]: what a backend with streams and events provides to the [`StreamExecutor`](super::StreamExecutor).

use thiserror::Error;

use super::StreamId;

/// An error reported by a device (a failed launch, an error found at synchronisation, a missing
/// driver), with the device's own message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct DeviceError {
    /// What the device reported.
    pub message: String,
}

/// A payload handed to work on a stream of another device than the one it lives on (what
/// [`Device::adopt`] exists to prevent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error(
    "a payload on device {payload_device} was handed to stream {stream} of device \
     {stream_device} without being adopted there (a peer copy)"
)]
pub struct Misplaced {
    /// The stream the work is enqueued on.
    pub stream: usize,
    /// The device of that stream.
    pub stream_device: usize,
    /// The device the payload lives on.
    pub payload_device: usize,
}

impl DeviceError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        DeviceError {
            message: message.into(),
        }
    }
}

/// A device with in-order streams and events, driven from one host thread.
///
/// The [`StreamExecutor`](super::StreamExecutor) calls [`make_streams`](Device::make_streams) once,
/// then per step hands each stage call the [`Stream`](Device::Stream) it runs on (a
/// [`StreamStage`](super::StreamStage) enqueues its work there; nothing is bound in between),
/// records and waits on events as the [`StreamProgram`](super::StreamProgram) says, puts timing
/// [`mark`](Device::mark)s around each action, and finally [`synchronize`](Device::synchronize)s and
/// reads the marks.
///
/// Implementations: [`CpuStreams`](super::CpuStreams) (worker threads, flags as events) in this crate;
/// CUDA (cudarc streams and events, tracking disabled) in the `pipefill` crate.
pub trait Device {
    /// What stages exchange on this device.
    type Payload: crate::runtime::Payload;
    /// What a stage call is given to enqueue its work on one stream (a CUDA stream with its
    /// device; `()` for a device that runs work at once).
    type Stream: Sync;
    /// A recorded event.
    type Event;
    /// A recorded timing mark.
    type Mark;

    /// Creates the streams (index `i` is `streams[i]`); called once, before any step.
    fn make_streams(&mut self, streams: &[StreamId]) -> Result<(), DeviceError>;

    /// Stream `index` (of those [`make_streams`](Device::make_streams) made), for the stage calls
    /// enqueued on it; `None` for a stream it does not have.
    fn stream(&self, index: usize) -> Option<&Self::Stream>;

    /// Records an event on `stream`: it completes when the work enqueued there before it has.
    fn record(&mut self, stream: usize) -> Result<Self::Event, DeviceError>;

    /// Makes `stream` wait for `event` before the work enqueued after this call.
    fn wait(&mut self, stream: usize, event: &Self::Event) -> Result<(), DeviceError>;

    /// Enqueues a timing mark on `stream`.
    fn mark(&mut self, stream: usize) -> Result<Self::Mark, DeviceError>;

    /// Waits until every stream has run everything enqueued; reports the first failure.
    fn synchronize(&mut self) -> Result<(), DeviceError>;

    /// Seconds from `origin` to `mark` (both completed: call after [`synchronize`](Device::synchronize)).
    /// `origin` is what [`origin`](Device::origin) returned; `mark` may be on any stream.
    fn seconds(&self, origin: &Self::Mark, mark: &Self::Mark) -> Result<f64, DeviceError>;

    /// The time origin of a step: a mark the step's other marks are read against by
    /// [`seconds`](Device::seconds). By default a [`mark`](Device::mark) on stream 0; a device with
    /// several clocks (one per GPU) also marks an origin on each of its other devices here.
    fn origin(&mut self) -> Result<Self::Mark, DeviceError> {
        self.mark(0)
    }

    // Several devices (one per rank, or ranks spread round robin). A device that drives one
    // device keeps the defaults: every stream on device 0, payloads usable anywhere, nothing to
    // adopt.

    /// The device that stream `stream` runs on (an index among the devices this one drives;
    /// 0 when it drives one).
    fn stream_device(&self, stream: usize) -> usize {
        let _ = stream;
        0
    }

    /// The device `payload` lives on, or `None` when it may be used on any (an empty payload, or a
    /// device that does not tag its payloads).
    fn payload_device(&self, payload: &Self::Payload) -> Option<usize> {
        let _ = payload;
        None
    }

    /// Makes `payload` usable by work enqueued on `stream` from now on, and returns it: a peer copy
    /// enqueued on `stream` when `payload` lives on another device than `stream`'s (the copy is then
    /// owned by `stream`'s device), else `payload` itself. The
    /// [`StreamExecutor`](super::StreamExecutor) calls it for every payload that crosses ranks,
    /// right after the consumer's stream waited for the transfer's event (and so after the
    /// producer's work), also while capturing (the copy is then part of the captured step).
    ///
    /// The default returns `payload` unchanged (one device).
    fn adopt(
        &mut self,
        stream: usize,
        payload: Self::Payload,
    ) -> Result<Self::Payload, DeviceError> {
        let _ = stream;
        Ok(payload)
    }

    // Capture and replay (a CUDA graph; a recorded job list on the CPU). Devices that cannot
    // capture keep the defaults, which refuse. See `StreamExecutor::capture`.

    /// Starts capturing on stream 0: work enqueued from now on is recorded, not run. Other streams
    /// join the capture when they [`wait`](Device::wait) on an event recorded on a capturing stream.
    fn begin_capture(&mut self) -> Result<(), DeviceError> {
        Err(not_supported("graph capture"))
    }

    /// Ends the capture begun by [`begin_capture`](Device::begin_capture) (every stream must have
    /// been joined back into stream 0) and keeps the captured step for [`replay`](Device::replay).
    fn end_capture(&mut self) -> Result<(), DeviceError> {
        Err(not_supported("graph capture"))
    }

    /// Enqueues the captured step once more (on stream 0); [`synchronize`](Device::synchronize)
    /// waits for it.
    fn replay(&mut self) -> Result<(), DeviceError> {
        Err(not_supported("graph replay"))
    }

    /// A new payload holding `src`'s values, enqueued on `stream` (during capture: the copy is part
    /// of the captured step, so each replay copies `src`'s values *at that time*).
    ///
    /// The machine also calls it for what a stage run with full recomputation keeps of its input.
    fn copy(&self, stream: usize, src: &Self::Payload) -> Result<Self::Payload, DeviceError> {
        let _ = (stream, src);
        Err(not_supported("payload copies"))
    }

    /// Overwrites `dst`'s values with `src`'s (same size), ordered before the next
    /// [`replay`](Device::replay): how a captured step gets each step's inputs and targets.
    fn refresh(&mut self, dst: &mut Self::Payload, src: Self::Payload) -> Result<(), DeviceError> {
        let _ = (dst, src);
        Err(not_supported("payload refresh"))
    }

    /// The value of a loss produced during capture, as the latest replay left it (call after
    /// [`synchronize`](Device::synchronize)); the loss stays readable for the next replay.
    fn read_loss(
        &self,
        loss: &<Self::Payload as crate::runtime::Payload>::Loss,
    ) -> Result<f32, DeviceError> {
        let _ = loss;
        Err(not_supported("reading a captured loss"))
    }
}

/// The error of a capture method a device does not provide.
fn not_supported(what: &str) -> DeviceError {
    DeviceError::new(format!("this device does not support {what}"))
}

// The fork/join rule of a whole-step capture, shared by the runners that capture (see
// `StreamExecutor::capture`, `RankStreams::capture` and `cpu/joins.rs`).

/// The fork: an event recorded on stream 0 that streams `1..streams` wait on before their first
/// captured work (work a stream takes before it joined the capture would not be captured). The
/// event, to keep until the capture ends.
pub(super) fn fork<D: Device>(device: &mut D, streams: usize) -> Result<D::Event, DeviceError> {
    let fork = device.record(0)?;
    for s in 1..streams {
        device.wait(s, &fork)?;
    }
    Ok(fork)
}

/// The join: stream 0 waits on an event recorded on each of streams `1..streams` after their last
/// captured work (a capture cannot end with a stream not joined back). The events.
pub(super) fn join<D: Device>(
    device: &mut D,
    streams: usize,
) -> Result<Vec<D::Event>, DeviceError> {
    (1..streams)
        .map(|s| {
            let join = device.record(s)?;
            device.wait(0, &join)?;
            Ok(join)
        })
        .collect()
}

/// Copies of `inputs` on stream 0 (in a capture: copied anew from the fixed buffers on each replay).
pub(super) fn copies<D: Device>(
    device: &D,
    inputs: &[D::Payload],
) -> Result<Vec<D::Payload>, DeviceError> {
    inputs.iter().map(|x| device.copy(0, x)).collect()
}
