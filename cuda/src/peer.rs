//! [`NcclPeer`]: the stream runtime's [`Transport`] between GPU ranks in separate processes, over
//! NCCL point-to-point ([`NcclLink`]) on one communication stream per process.
//!
//! The per-rank runner ([`RankStreams`](pipefill_host::runtime::streams::RankStreams)) posts every
//! send and receive of its rank on this one stream in the order all ranks share (receives in the
//! sender's order, [`PostOrder::Sender`](pipefill_host::runtime::streams::PostOrder)), which NCCL
//! matches right and cannot deadlock on; the CPU twin
//! ([`CpuPeers`](pipefill_host::runtime::streams::CpuPeers)) checks exactly that without a GPU.
//! Ordering against the compute streams is by events: a send waits for the event the runner
//! recorded after its producer; a receive records an event its consumer's stream waits on.
//!
//! Buffers: a sent payload is re-homed to the communication stream (any pending scale applied
//! there) and dropped after the send is enqueued, so its stream-ordered free follows the send; a
//! received buffer is allocated on the communication stream and re-homed to its consumer's stream
//! when consumed ([`DeviceTensor::into_scaled`]).
//!
//! Storage type: the link carries one type, the activations' ([`NcclPeer::set_activations`]): BF16
//! payloads go as `ncclBfloat16` (2 bytes a value) and receives allocate BF16 buffers. Every edge
//! between ranks is a stage's output or input gradient (the loss gradient never leaves its rank),
//! so all of them have that type; a send of another type is refused (its receiver would expect
//! another byte count).
//!
//! Capture (`train --backend cuda --launcher mpi --graph`): the communication stream joins the
//! rank's capture by waiting on the fork event of its stream 0, so every send and receive of the
//! step (NCCL calls on a capturing stream, captured since NCCL 2.9: an older NCCL is refused by
//! name) and their buffers' allocations become nodes of the rank's graph; an event recorded on it
//! after the last one is the join stream 0 waits on. Replaying is launching the rank's graph: the
//! link has nothing more to do. What stays outside the graph is host work: [`Transport::complete`]
//! and [`Transport::finish`] (an all-reduce of the ranks' outcomes) run after each launch.
//! Not yet run on GPUs (UNVERIFIED).

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};
use pipefill_host::cost::ActivationDtype;
use pipefill_host::runtime::{Transport, TransportError};
use pipefill_host::schedule::deps::Edge;

use super::device::Gpu;
use super::error::CudaError;
use super::launch::Launcher;
use super::nccl::{check_graph_version, nccl_version, NcclError, NcclLink, UniqueId};
use super::tensor::{DeviceStored, DeviceTensor};

/// One GPU rank's NCCL link for the per-rank stream runner: its communicator and the
/// communication stream every send and receive of the rank is enqueued on.
pub struct NcclPeer {
    gpu: Arc<Gpu>,
    comm: Arc<CudaStream>,
    link: NcclLink,
    dtype: ActivationDtype,
}

/// Why an [`NcclPeer`] could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerOpenError {
    /// The communication stream could not be made.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// NCCL refused (no library, or the communicator's init failed).
    #[error(transparent)]
    Nccl(#[from] NcclError),
}

fn link_error(e: impl std::fmt::Display) -> TransportError {
    TransportError::Link {
        message: e.to_string(),
    }
}

impl NcclPeer {
    /// Joins the communicator `id` as `rank` of `ranks` on a new stream of `gpu` (every rank calls
    /// this at once; it returns when all have joined).
    pub fn open(
        gpu: &Arc<Gpu>,
        rank: usize,
        ranks: usize,
        id: UniqueId,
    ) -> Result<Self, PeerOpenError> {
        let comm = gpu.new_stream()?;
        let link = NcclLink::open(comm.clone(), rank, ranks, id)?;
        Ok(NcclPeer {
            gpu: gpu.clone(),
            comm,
            link,
            dtype: ActivationDtype::F32,
        })
    }

    /// Carries activations stored as `dtype` from now on (`f32` when opened): what receives
    /// allocate and what sends must hold. [`CudaRank::new`](super::CudaRank::new) sets it from the
    /// rank's stages.
    pub fn set_activations(&mut self, dtype: ActivationDtype) {
        self.dtype = dtype;
    }

    /// The storage type the link carries.
    pub fn activations(&self) -> ActivationDtype {
        self.dtype
    }

    /// The communication stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.comm
    }

    fn event(&self) -> Result<CudaEvent, TransportError> {
        self.comm
            .record_event(None)
            .map_err(|e| link_error(CudaError::driver("cuEventRecord")(e)))
    }
}

impl Transport<DeviceTensor, CudaEvent> for NcclPeer {
    fn send(
        &mut self,
        _edge: Edge,
        to: usize,
        data: DeviceTensor,
        after: CudaEvent,
    ) -> Result<(), TransportError> {
        self.comm
            .wait(&after)
            .map_err(|e| link_error(CudaError::driver("cuStreamWaitEvent")(e)))?;
        let la = Launcher::new(self.gpu.clone(), self.comm.clone());
        // An empty payload sends nothing; its receiver, posted with the same (empty) shape,
        // receives nothing either.
        let Some(buf) = data.into_scaled(&la).map_err(link_error)? else {
            return Ok(());
        };
        if buf.dtype() != self.dtype {
            return Err(link_error(format!(
                "a payload stored as {} on a link that carries {} (every stage of the model must \
                 store activations alike)",
                buf.dtype(),
                self.dtype
            )));
        }
        match &buf {
            DeviceStored::F32(x) => self.link.send(x, to),
            DeviceStored::Bf16(x) => self.link.send_bf16(x, to),
        }
        .map_err(link_error)
    }

    /// Posts the receive into a new buffer of `shape` (required: NCCL needs the byte count).
    fn recv(
        &mut self,
        edge: Edge,
        from: usize,
        shape: Option<&[usize]>,
    ) -> Result<(DeviceTensor, CudaEvent), TransportError> {
        let shape = shape.ok_or_else(|| {
            link_error(format!(
                "a receive of {} posted without its shape",
                edge.recv()
            ))
        })?;
        let n: usize = shape.iter().product();
        let alloc = |e| link_error(CudaError::driver("cuMemAllocAsync")(e));
        // SAFETY (both allocations): NCCL writes all `n` values before the event recorded next
        // completes, and the consumer's stream reads the buffer only after waiting on that event.
        let buf = match (n, self.dtype) {
            (0, _) => None,
            (_, ActivationDtype::F32) => {
                let mut buf = unsafe { self.comm.alloc::<f32>(n) }.map_err(alloc)?;
                self.link.recv(&mut buf, from).map_err(link_error)?;
                Some(DeviceStored::F32(buf))
            }
            (_, ActivationDtype::Bf16) => {
                let mut buf = unsafe { self.comm.alloc::<u16>(n) }.map_err(alloc)?;
                self.link.recv_bf16(&mut buf, from).map_err(link_error)?;
                Some(DeviceStored::Bf16(buf))
            }
        };
        let data = DeviceTensor::from_stored(shape.to_vec(), buf).map_err(link_error)?;
        Ok((data, self.event()?))
    }

    fn complete(&mut self) -> Result<(), TransportError> {
        if self.link.aborted() {
            return Err(TransportError::Aborted);
        }
        self.comm
            .synchronize()
            .map_err(|e| link_error(CudaError::driver("cuStreamSynchronize")(e)))
    }

    /// Aborts the communicator (`ncclCommAbort`): this rank's pending sends and receives are
    /// abandoned, so it does not wait on operations its peers will never match; its later
    /// operations, [`complete`](Transport::complete) included, are [`TransportError::Aborted`], and
    /// [`finish`](Transport::finish) reports the failure without another collective. A peer
    /// still waiting on this rank's messages is ended by the launcher (`MPI_Abort`; the GPU
    /// test's harness kills the other rank once one has failed).
    fn abort(&mut self) {
        self.link.abort();
    }

    /// The number of failed ranks, summed by an NCCL all-reduce on the communication stream.
    fn finish(&mut self, ok: bool) -> bool {
        if self.link.aborted() {
            return false;
        }
        let flag = [if ok { 0.0f32 } else { 1.0 }];
        let summed = self
            .comm
            .clone_htod(&flag)
            .map_err(CudaError::driver("memcpy to device"))
            .map_err(link_error)
            .and_then(|mut buf| {
                self.link.all_reduce_sum(&mut buf).map_err(link_error)?;
                let v = self
                    .comm
                    .clone_dtoh(&buf)
                    .map_err(|e| link_error(CudaError::driver("memcpy to host")(e)))?;
                self.complete()?;
                Ok(v)
            });
        matches!(summed.as_deref(), Ok([failed]) if *failed == 0.0)
    }

    /// The communication stream waits on `fork` (recorded on the capturing stream 0), so the
    /// NCCL calls enqueued next are captured; refused for an NCCL older than 2.9.
    fn begin_capture(&mut self, fork: CudaEvent) -> Result<(), TransportError> {
        nccl_version()
            .and_then(check_graph_version)
            .map_err(link_error)?;
        self.comm
            .wait(&fork)
            .map_err(|e| link_error(CudaError::driver("cuStreamWaitEvent")(e)))
    }

    /// An event after the link's last captured call (stream 0 waits on it: the join).
    fn end_capture(&mut self) -> Result<CudaEvent, TransportError> {
        self.event()
    }

    /// Nothing: the link's calls are nodes of the rank's graph, launched with it.
    fn replay(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}
