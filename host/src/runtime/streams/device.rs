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
/// then per step [`bind`](Device::bind)s a stream before each stage call (a stage enqueues its work on
/// the bound stream), records and waits on events as the [`StreamProgram`](super::StreamProgram) says,
/// puts timing [`mark`](Device::mark)s around each action, and finally
/// [`synchronize`](Device::synchronize)s and reads the marks.
///
/// Implementations: [`CpuStreams`](super::CpuStreams) (worker threads, flags as events) in this crate;
/// CUDA (cudarc streams and events, tracking disabled) in the `pipefill` crate.
pub trait Device {
    /// What stages exchange on this device.
    type Payload: crate::runtime::Payload;
    /// A recorded event.
    type Event;
    /// A recorded timing mark.
    type Mark;

    /// Creates the streams (index `i` is `streams[i]`); called once, before any step.
    fn make_streams(&mut self, streams: &[StreamId]) -> Result<(), DeviceError>;

    /// Stage calls from now on enqueue on stream `stream`.
    fn bind(&mut self, stream: usize) -> Result<(), DeviceError>;

    /// Records an event on `stream`: it completes when the work enqueued there before it has.
    fn record(&mut self, stream: usize) -> Result<Self::Event, DeviceError>;

    /// Makes `stream` wait for `event` before the work enqueued after this call.
    fn wait(&mut self, stream: usize, event: &Self::Event) -> Result<(), DeviceError>;

    /// Enqueues a timing mark on `stream`.
    fn mark(&mut self, stream: usize) -> Result<Self::Mark, DeviceError>;

    /// Waits until every stream has run everything enqueued; reports the first failure.
    fn synchronize(&mut self) -> Result<(), DeviceError>;

    /// Seconds from `origin` to `mark` (both completed: call after [`synchronize`](Device::synchronize)).
    fn seconds(&self, origin: &Self::Mark, mark: &Self::Mark) -> Result<f64, DeviceError>;

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
    fn copy(&mut self, stream: usize, src: &Self::Payload) -> Result<Self::Payload, DeviceError> {
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
