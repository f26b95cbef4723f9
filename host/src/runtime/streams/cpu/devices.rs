//! Several devices on [`CpuStreams`]: a map from rank to device, payloads tagged with the device
//! they live on, refusals of a payload from another device, and [`Device::adopt`](super::Device::adopt)
//! as a counted move between devices.
//!
//! This is the CPU twin of one GPU per rank: what the CUDA backend relies on (every payload that
//! crosses devices is adopted on the consumer's stream after the transfer's wait, and nothing else
//! crosses) is checked here, on any machine. A payload's device is decided when its work is
//! enqueued (the device of the bound stream), as a CUDA buffer's is when it is allocated; the
//! bytes are counted when the copy job runs (once per replay of a captured step).

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use super::{CpuStreams, Link, Pending};
use crate::runtime::streams::{DeviceError, Misplaced, StreamId};
use crate::runtime::{StageError, Tensor};

impl CpuStreams {
    /// A device standing for several: rank `r`'s streams run on device `rank_devices[r]` (for
    /// example `r % 2` for four ranks on two devices). A schedule with more ranks than the map is
    /// refused when the executor makes the streams.
    pub fn with_devices(rank_devices: Vec<usize>) -> Self {
        let mut device = CpuStreams::new();
        device.rank_devices = rank_devices;
        device
    }

    /// Bytes copied between devices by [`adopt`](super::Device::adopt) so far (every step, and
    /// every replay of a captured step, adds its copies; read after a synchronised step).
    pub fn copied_bytes(&self) -> usize {
        self.link.copied.load(Ordering::SeqCst)
    }

    /// Records each stream's device from the rank map (all 0 without one).
    pub(super) fn map_streams(&self, streams: &[StreamId]) -> Result<(), DeviceError> {
        let devices = streams
            .iter()
            .map(
                |s| match (self.rank_devices.is_empty(), self.rank_devices.get(s.rank)) {
                    (true, _) => Ok(0),
                    (false, Some(&d)) => Ok(d),
                    (false, None) => Err(DeviceError::new(format!(
                        "rank {} has no device: the device map covers {} ranks",
                        s.rank,
                        self.rank_devices.len()
                    ))),
                },
            )
            .collect::<Result<Vec<_>, _>>()?;
        *self
            .link
            .devices
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = devices;
        Ok(())
    }

    /// `payload` itself when it lives on `stream`'s device; else a new payload on that device,
    /// filled by a job on `stream` that moves the value (and counts its bytes). The pending scale
    /// travels with it.
    pub(super) fn adopt_on(
        &mut self,
        stream: usize,
        payload: Pending<Tensor>,
    ) -> Result<Pending<Tensor>, DeviceError> {
        let device = self.link.device_of(stream);
        if payload.device == device {
            return Ok(payload);
        }
        let mut out = Pending::empty_on(device);
        out.scale = payload.scale;
        let (o, src, link) = (out.share(), payload.share(), Arc::clone(&self.link));
        self.link.enqueue_on(stream, move || {
            let value = src.take()?;
            link.copied.fetch_add(value.bytes(), Ordering::SeqCst);
            o.fill(value);
            Ok(())
        })?;
        Ok(out)
    }
}

impl Link {
    /// The device of stream `stream` (0 without a map, or for a stream the map does not cover).
    pub(super) fn device_of(&self, stream: usize) -> usize {
        let devices = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        devices.get(stream).copied().unwrap_or(0)
    }

    /// The device of stream `stream`, when `payload` lives there; a [`Misplaced`] error otherwise.
    pub(super) fn placed<T>(
        &self,
        stream: usize,
        payload: &Pending<T>,
    ) -> Result<usize, StageError> {
        let device = self.device_of(stream);
        if payload.device != device {
            let m = Misplaced {
                stream,
                stream_device: device,
                payload_device: payload.device,
            };
            return Err(StageError::new(m.to_string()));
        }
        Ok(device)
    }
}
