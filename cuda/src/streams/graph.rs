//! Whole-step capture on [`CudaStreams`], on one GPU or across several (`--devices per-rank`).
//!
//! - Capture begins on stream 0 (rank 0's main stream) in thread-local mode: one host thread
//!   enqueues the whole step, and no other thread's CUDA calls are affected.
//! - Every other stream joins the capture through the executor's fork (an event recorded on stream
//!   0, waited on by each stream first) and is joined back before the capture ends (an event recorded
//!   on each stream, waited on by stream 0); `cuStreamEndCapture` refuses anything else
//!   (`CUDA_ERROR_STREAM_CAPTURE_UNJOINED`). Stream capture follows event waits into streams of
//!   other devices, so one graph holds the kernels of every GPU, the cross-device event edges and
//!   the peer copies of [`Device::adopt`](pipefill_host::runtime::streams::Device::adopt) (memcpy
//!   nodes); its nodes run on their own devices when it is launched on stream 0.
//! - Buffers made during the capture are graph allocations on the device of the stream that makes
//!   them, so every device must support stream-ordered allocation (`cuMemAllocAsync`).
//! - The fixed inputs and targets are refreshed on a stream of the device each buffer lives on,
//!   and stream 0 waits for that copy before the next launch.
//!
//! The multi-device graph has not run on hardware here (UNVERIFIED: no machine with two GPUs was
//! available); the CPU twin checks the same fork/join rule (`CpuStreams`, `cpu/joins.rs`).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use pipefill_host::runtime::streams::DeviceError;

use super::{device_error, refresh_on, CudaStreams, Graph};
use crate::error::CudaError;
use crate::tensor::DeviceTensor;

impl CudaStreams {
    /// Starts capturing on stream 0 (refused while a graph is held, or when a device cannot
    /// allocate in stream order).
    pub(super) fn start_capture(&mut self) -> Result<(), DeviceError> {
        if self.graph.is_some() {
            return Err(DeviceError::new(
                "this device already holds a captured step (one capture per device)",
            ));
        }
        if let Some(gpu) = self
            .link
            .gpus
            .iter()
            .find(|g| !g.context().has_async_alloc())
        {
            return Err(DeviceError::new(format!(
                "graph capture needs stream-ordered allocation (cuMemAllocAsync) on every GPU of \
                 the step, which GPU {} does not support",
                gpu.ordinal()
            )));
        }
        let s = self.link.stream(0).map_err(device_error)?;
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| device_error(CudaError::driver("cuStreamBeginCapture")(e)))
    }

    /// Ends the capture on stream 0, instantiates the graph (auto-free on launch: the loss
    /// partials are graph allocations read after each launch) and uploads it.
    pub(super) fn finish_capture(&mut self) -> Result<(), DeviceError> {
        let s = self.link.stream(0).map_err(device_error)?;
        let flags = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        let graph = s
            .end_capture(flags)
            .map_err(|e| {
                device_error(CudaError::driver("cuStreamEndCapture / cuGraphInstantiate")(e))
            })?
            .ok_or_else(|| DeviceError::new("the capture recorded no work"))?;
        graph
            .upload()
            .map_err(|e| device_error(CudaError::driver("cuGraphUpload")(e)))?;
        self.graph = Some(Graph(graph));
        Ok(())
    }

    /// Launches the captured step on stream 0.
    pub(super) fn launch_graph(&mut self) -> Result<(), DeviceError> {
        let graph = self
            .graph
            .as_ref()
            .ok_or_else(|| DeviceError::new("replay before a capture"))?;
        graph
            .0
            .launch()
            .map_err(|e| device_error(CudaError::driver("cuGraphLaunch")(e)))
    }

    /// Copies `src` into `dst` on the first stream of `dst`'s device; stream 0 (where the graph
    /// launches next) waits for the copy when that is another stream.
    pub(super) fn refresh_fixed(
        &mut self,
        dst: &mut DeviceTensor,
        src: DeviceTensor,
    ) -> Result<(), CudaError> {
        let device = self.link.device_holding(dst).unwrap_or(0);
        let at = (0..self.launchers.len())
            .find(|&i| self.link.device_of(i) == device)
            .unwrap_or(0);
        let s = self.link.stream(at)?;
        refresh_on(&s, dst, src)?;
        if at != 0 {
            let done = s
                .record_event(None)
                .map_err(CudaError::driver("cuEventRecord"))?;
            self.link
                .stream(0)?
                .wait(&done)
                .map_err(CudaError::driver("cuStreamWaitEvent"))?;
        }
        Ok(())
    }
}
