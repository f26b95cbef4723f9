//! Capture and replay on [`CpuStreams`]: while capturing, every job the device and the wrapped
//! stages send is *kept* by its stream's worker instead of run; a replay makes every worker run its
//! kept jobs again, in order. The events recorded during the capture are flags lowered before each
//! replay, so a replayed wait waits for the replayed record, as a CUDA graph's edges do.
//!
//! This is honest in the sense that matters for testing the executor's capture: the host does not
//! call any stage method on replay, so a replayed step computes only through the [`Pending`] slots
//! the captured jobs were given; an input or target read from anywhere else would be stale.

use std::sync::atomic::Ordering;

use super::joins::Joins;
use super::{CpuStreams, Job, Pending};
use crate::runtime::streams::DeviceError;
use crate::runtime::Tensor;

impl CpuStreams {
    pub(super) fn start_capture(&mut self) -> Result<(), DeviceError> {
        if self.captured || self.link.capturing.load(Ordering::SeqCst) {
            return Err(DeviceError::new(
                "this device already holds a captured step (one capture per device)",
            ));
        }
        self.captured_flags.clear();
        *self.link.joins() = Some(Joins::begin(self.workers.len()));
        self.link.capturing.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Ends the capture; refused (nothing kept for replay) when a stream that joined it was not
    /// joined back into stream 0, as CUDA refuses it (`cpu/joins.rs`).
    pub(super) fn finish_capture(&mut self) -> Result<(), DeviceError> {
        if !self.link.capturing.swap(false, Ordering::SeqCst) {
            return Err(DeviceError::new("end_capture without begin_capture"));
        }
        if let Some(joins) = self.link.joins().take() {
            joins.end()?;
        }
        self.captured = true;
        Ok(())
    }

    /// Lowers the captured flags (every worker is idle: the previous step was synchronised), then
    /// tells every worker to run its kept jobs.
    pub(super) fn replay_captured(&mut self) -> Result<(), DeviceError> {
        if !self.captured {
            return Err(DeviceError::new("replay before a capture"));
        }
        self.captured_flags.iter().for_each(|f| f.lower());
        for s in 0..self.workers.len() {
            self.link.send(s, Job::Replay)?;
        }
        Ok(())
    }

    /// A new pending tensor that a job on `stream` fills with `src`'s value at the time it runs.
    pub(super) fn copy_on(
        &self,
        stream: usize,
        src: &Pending<Tensor>,
    ) -> Result<Pending<Tensor>, DeviceError> {
        let out = Pending::empty_on(self.link.device_of(stream));
        let (o, x, scale) = (out.share(), src.share(), src.scale);
        self.link.enqueue_on(stream, move || {
            let mut v = x.lock().clone().ok_or("no value to copy")?;
            if scale != 1.0 {
                v.scale(scale);
            }
            o.fill(v);
            Ok(())
        })?;
        Ok(out)
    }
}

/// Puts `src`'s value into `dst` (between steps: no worker is running), refusing another shape.
pub(super) fn refresh(dst: &mut Pending<Tensor>, src: Pending<Tensor>) -> Result<(), DeviceError> {
    let value = src.take_tensor().map_err(DeviceError::new)?;
    let mut slot = dst.lock();
    if let Some(old) = slot.as_ref() {
        if old.shape() != value.shape() {
            return Err(DeviceError::new(format!(
                "refresh: a {:?} value for a {:?} buffer",
                value.shape(),
                old.shape()
            )));
        }
    }
    *slot = Some(value);
    drop(slot);
    dst.scale = 1.0;
    Ok(())
}
