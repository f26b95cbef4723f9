//! Kernel time measured on the device: a [`Span`] is a pair of timing-enabled events recorded on a
//! stream around some enqueued work; its length is read once the work is done.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

use super::error::CudaError;

/// Records a timing-enabled event on `stream` now (after everything enqueued so far).
pub fn mark(stream: &CudaStream) -> Result<CudaEvent, CudaError> {
    stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(CudaError::driver("cuEventRecord"))
}

/// The device time between two events on one stream.
#[derive(Debug)]
pub struct Span {
    start: CudaEvent,
    end: CudaEvent,
}

impl Span {
    /// Enqueues `work` on `stream` between two timing events.
    pub fn around<T>(
        stream: &CudaStream,
        work: impl FnOnce() -> Result<T, CudaError>,
    ) -> Result<(T, Span), CudaError> {
        let start = mark(stream)?;
        let out = work()?;
        let end = mark(stream)?;
        Ok((out, Span { start, end }))
    }

    /// A span between two events already recorded (timing-enabled, same context).
    pub fn between(start: CudaEvent, end: CudaEvent) -> Span {
        Span { start, end }
    }

    /// Seconds from start to end (waits until the end event has completed).
    pub fn seconds(&self) -> Result<f64, CudaError> {
        self.start
            .elapsed_ms(&self.end)
            .map(|ms| f64::from(ms) / 1e3)
            .map_err(CudaError::driver("cuEventElapsedTime"))
    }
}
