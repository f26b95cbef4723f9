//! Several devices for [`CudaStreams`]: the rank -> device map, one time origin per device, and
//! [`Device::adopt`](pipefill_host::runtime::streams::Device::adopt) as a peer copy.
//!
//! - Each rank's streams are created on its device's context; a stage must be built on its rank's
//!   device (the stage wrapper refuses a stream of another device).
//! - Events are recorded on the producer's device and waited on by the consumer's stream, which may
//!   be on another device: `cuStreamWaitEvent` accepts an event of any device of the process.
//! - A payload that crosses devices is copied with `cuMemcpyPeerAsync` on the consumer's stream
//!   (`cuMemcpyDtoDAsync` while it captures a graph: a capture refuses the peer call),
//!   right after that stream's wait for the transfer's event (so after the producer's kernels); the
//!   copy is a new buffer owned by the consumer's stream. The source stays allocated until the
//!   next device-wide [`synchronize`](pipefill_host::runtime::streams::Device::synchronize): its
//!   stream-ordered free belongs to the producer's device, and ordering it after the consumer's
//!   copy would make the producer's stream wait for the consumer's. The cost: a step keeps every
//!   crossing source buffer until it ends (at most the step's crossing bytes).
//! - Peer access is enabled between distinct GPUs where `cuDeviceCanAccessPeer` allows it (direct
//!   copies over NVLink / PCIe); elsewhere the driver stages `cuMemcpyPeerAsync` itself.
//! - Timing: CUDA times events of one context only, so the step's origin is marked on every
//!   device (on the first stream of each, at the same host moment, each stream idle after the
//!   previous step's synchronisation), and each mark is read against its own device's origin. The
//!   skew between devices is how far apart the devices reach their origin marks: the host's
//!   enqueue gap between them plus the launch latency, microseconds; it is not corrected.

use std::sync::{Arc, MutexGuard};

use cudarc::driver::sys::{CUevent_flags, CUstreamCaptureStatus};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
};
use pipefill_host::runtime::streams::StreamId;

use super::{CudaStreams, Link};
use crate::error::CudaError;
use crate::tensor::{DeviceStored, DeviceTensor};
use crate::Gpu;

impl CudaStreams {
    /// Streams over several devices: rank `r`'s streams on `gpus[rank_devices[r]]` (for example one
    /// GPU per rank, or `r % gpus.len()`). Enables peer access between distinct GPUs where the
    /// hardware allows it. Refuses an empty `gpus` and a map entry without a GPU.
    pub fn on_devices(gpus: Vec<Arc<Gpu>>, rank_devices: Vec<usize>) -> Result<Self, CudaError> {
        if gpus.is_empty() {
            return Err(CudaError::DeviceMap {
                rank: 0,
                device: 0,
                devices: 0,
            });
        }
        if let Some((rank, &device)) = rank_devices
            .iter()
            .enumerate()
            .find(|(_, &d)| d >= gpus.len())
        {
            return Err(CudaError::DeviceMap {
                rank,
                device,
                devices: gpus.len(),
            });
        }
        for a in &gpus {
            for b in &gpus {
                if a.context() != b.context() {
                    a.enable_peer_access(b)?;
                }
            }
        }
        Ok(Self::build(gpus, rank_devices))
    }

    /// The devices, by index.
    pub fn gpus(&self) -> &[Arc<Gpu>] {
        &self.link.gpus
    }

    /// Bytes peer-copied between devices so far (by [`Device::adopt`](pipefill_host::runtime::streams::Device::adopt)).
    pub fn copied_bytes(&self) -> usize {
        self.link.copied.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The device index of each stream, from the rank map (all 0 without one).
    pub(super) fn map_streams(&self, streams: &[StreamId]) -> Result<Vec<usize>, CudaError> {
        let map = &self.link.rank_devices;
        streams
            .iter()
            .map(|s| match (map.is_empty(), map.get(s.rank)) {
                (true, _) => Ok(0),
                (false, Some(&d)) => Ok(d),
                (false, None) => Err(CudaError::DeviceMap {
                    rank: s.rank,
                    device: usize::MAX,
                    devices: self.link.gpus.len(),
                }),
            })
            .collect()
    }

    /// The step's origin: a timing mark on stream 0, and one on the first stream of every other
    /// device (kept for [`CudaStreams::origin_for`]).
    pub(super) fn mark_origins(&mut self) -> Result<CudaEvent, CudaError> {
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let mark = |i: usize| -> Result<CudaEvent, CudaError> {
            self.link
                .stream(i)?
                .record_event(timing)
                .map_err(CudaError::driver("cuEventRecord (origin)"))
        };
        let origin = mark(0)?;
        let devices = self.link.stream_devices().clone();
        let mut origins: Vec<Option<CudaEvent>> = (0..self.link.gpus.len()).map(|_| None).collect();
        for (i, &d) in devices.iter().enumerate() {
            if d != devices[0] && origins[d].is_none() {
                origins[d] = Some(mark(i)?);
            }
        }
        self.origins = origins;
        Ok(origin)
    }

    /// What `mark` is read against: `origin` on its device, else the origin marked on `mark`'s
    /// device (`origin` when there is none: reading it then fails with the driver's error).
    pub(super) fn origin_for<'a>(
        &'a self,
        origin: &'a CudaEvent,
        mark: &CudaEvent,
    ) -> &'a CudaEvent {
        if origin.context() == mark.context() {
            return origin;
        }
        self.link
            .gpus
            .iter()
            .position(|g| g.context() == mark.context())
            .and_then(|d| self.origins.get(d)?.as_ref())
            .unwrap_or(origin)
    }
}

impl Link {
    pub(super) fn stream_devices(&self) -> MutexGuard<'_, Vec<usize>> {
        self.stream_devices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn parked(&self) -> MutexGuard<'_, Vec<DeviceStored>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The device index of stream `stream` (0 for one not made yet).
    pub(super) fn device_of(&self, stream: usize) -> usize {
        self.stream_devices().get(stream).copied().unwrap_or(0)
    }

    /// The device of stream `stream`.
    pub(super) fn gpu_of(&self, stream: usize) -> &Arc<Gpu> {
        &self.gpus[self.device_of(stream).min(self.gpus.len() - 1)]
    }

    /// The index of the device whose context holds `t`'s buffer (`None`: empty, or a context these
    /// streams do not drive).
    pub(super) fn device_holding(&self, t: &DeviceTensor) -> Option<usize> {
        let ctx = t.context()?;
        self.gpus.iter().position(|g| g.context() == ctx)
    }

    /// `t` itself when it is empty or on `stream`'s device; else a peer copy enqueued on `stream`
    /// (a new buffer owned by it, in `t`'s storage type: 2 bytes a value for BF16; the pending
    /// scale kept), the source parked until the next synchronisation.
    pub(super) fn adopt(&self, stream: usize, t: DeviceTensor) -> Result<DeviceTensor, CudaError> {
        let dst_gpu = self.gpu_of(stream);
        let Some(src_ctx) = t.context().cloned() else {
            return Ok(t);
        };
        if &src_ctx == dst_gpu.context() {
            return Ok(t);
        }
        let s = self.stream(stream)?;
        let (shape, scale) = (t.shape().to_vec(), t.pending_scale());
        let Some(src) = t.into_stored() else {
            return DeviceTensor::from_stored(shape, None);
        };
        let bytes = src.bytes();
        let out = match &src {
            DeviceStored::F32(x) => DeviceStored::F32(peer_copy(dst_gpu, &src_ctx, &s, x)?),
            DeviceStored::Bf16(x) => DeviceStored::Bf16(peer_copy(dst_gpu, &src_ctx, &s, x)?),
        };
        self.parked().push(src);
        self.copied
            .fetch_add(bytes, std::sync::atomic::Ordering::SeqCst);
        let mut adopted = DeviceTensor::from_stored(shape, Some(out))?;
        adopted.scale_later(scale);
        Ok(adopted)
    }
}

/// A copy of `src` (in context `src_ctx`) into a new buffer allocated on `s` (of `dst_gpu`),
/// enqueued on `s` with `cuMemcpyPeerAsync` (with `cuMemcpyDtoDAsync` while `s` is capturing a
/// graph, which refuses the peer call); the caller keeps `src` alive until `s` is done.
fn peer_copy<T: DeviceRepr>(
    dst_gpu: &Gpu,
    src_ctx: &Arc<CudaContext>,
    s: &Arc<CudaStream>,
    src: &CudaSlice<T>,
) -> Result<CudaSlice<T>, CudaError> {
    let bytes = src.len() * std::mem::size_of::<T>();
    // SAFETY: every element is written by the copy enqueued next on the same stream.
    let mut out =
        unsafe { s.alloc::<T>(src.len()) }.map_err(CudaError::driver("cuMemAllocAsync"))?;
    // Event tracking is off: taking the addresses records nothing.
    let (src_ptr, src_record) = src.device_ptr(src.stream());
    let (dst_ptr, dst_record) = out.device_ptr_mut(s);
    dst_gpu
        .context()
        .bind_to_thread()
        .map_err(CudaError::driver("cuCtxSetCurrent"))?;
    let capturing = s
        .capture_status()
        .map_err(CudaError::driver("cuStreamIsCapturing"))?
        == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    // A capturing stream refuses cuMemcpyPeerAsync (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, seen on
    // an H200); the unified-addressing copy infers both sides from the addresses and is captured as
    // a memcpy node.
    // SAFETY: both buffers are alive (the caller parks the source until the next synchronise, the
    // destination is owned by `out`) and hold `bytes` bytes; the stream waited for the producer's
    // event before this call.
    let (call, copied) = unsafe {
        if capturing {
            let r =
                cudarc::driver::result::memcpy_dtod_async(dst_ptr, src_ptr, bytes, s.cu_stream());
            ("cuMemcpyDtoDAsync", r)
        } else {
            let r = cudarc::driver::result::memcpy_peer_async(
                dst_gpu.context().cu_ctx(),
                dst_ptr,
                src_ctx.cu_ctx(),
                src_ptr,
                bytes,
                s.cu_stream(),
            );
            ("cuMemcpyPeerAsync", r)
        }
    };
    copied.map_err(CudaError::driver(call))?;
    drop((src_record, dst_record));
    Ok(out)
}
