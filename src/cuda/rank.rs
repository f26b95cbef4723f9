//! [`CudaRank`]: one GPU rank of a pipeline in its own process: the rank's stages copied to its
//! GPU, the per-rank stream runner ([`RankStreams`]) on [`CudaStreams`], and the transfers over
//! NCCL ([`NcclPeer`]). What `train --backend cuda --launcher mpi` runs in each process, and what
//! the two-process GPU test runs.

use std::sync::Arc;

use pipefill_host::runtime::streams::{PostOrder, RankBatch, RankStreams};
use pipefill_host::runtime::{RankOutcome, RuntimeError};
use pipefill_host::schedule::deps::Edge;
use pipefill_host::schedule::Schedule;

use super::device::Gpu;
use super::error::CudaError;
use super::peer::NcclPeer;
use super::precision::Precision;
use super::stage::CudaStage;
use super::streams::{CudaLoss, CudaStreams, OnCudaStreams};
use super::tensor::DeviceTensor;
use crate::layers::{LinearStage, LossKind};

/// Why a [`CudaRank`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CudaRankError {
    /// Copying the stages to the device failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The runner refused the schedule or the stages.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// One rank's stages on one GPU, run step by step over NCCL.
pub struct CudaRank {
    runner: RankStreams<CudaStreams, OnCudaStreams>,
    peer: NcclPeer,
    loss: CudaLoss,
    /// Width of the data crossing each stage boundary (`S - 1` of them).
    widths: Vec<usize>,
}

impl CudaRank {
    /// Rank `rank` of `schedule` on `gpu`: `stages` are the host stages of the whole model in
    /// global order (each process builds them from the same seed), of which only the rank's own
    /// are copied to the device, with their products in `precision`; `kind` is the loss after the
    /// last stage; `peer` the rank's NCCL link.
    pub fn new(
        gpu: &Arc<Gpu>,
        schedule: Schedule,
        rank: usize,
        stages: &[LinearStage],
        precision: Precision,
        kind: LossKind,
        peer: NcclPeer,
    ) -> Result<Self, CudaRankError> {
        let device = CudaStreams::new(gpu.clone());
        let mine = stages
            .iter()
            .enumerate()
            .filter(|(s, _)| *s < schedule.stages() && schedule.rank_of(*s) == rank)
            .map(|(s, st)| {
                Ok((
                    s,
                    device.stage(CudaStage::from_host_in(gpu, st, precision)?),
                ))
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        // The weights were copied on each stage's own stream; the steps run on the runner's.
        gpu.synchronize()?;
        let widths = stages.iter().map(LinearStage::outputs).collect();
        let loss = device.loss(kind);
        let runner = RankStreams::new(schedule, rank, mine, device, PostOrder::Sender)?;
        Ok(CudaRank {
            runner,
            peer,
            loss,
            widths,
        })
    }

    /// Runs the rank's part of one step: `inputs` are stage 0's microbatches (on its rank; empty
    /// elsewhere), `targets` the microbatch targets (read on the last stage's rank), `rows` the
    /// rows of each microbatch (what every rank posts its receives with). The outcome says how
    /// the rank ended; the optimizer steps ran only if every rank succeeded.
    pub fn step(
        &mut self,
        inputs: Vec<DeviceTensor>,
        targets: &[DeviceTensor],
        rows: &[usize],
    ) -> RankOutcome {
        let widths = &self.widths;
        let shape = |e: Edge| {
            vec![
                rows.get(e.microbatch).copied().unwrap_or(0),
                widths.get(e.boundary()).copied().unwrap_or(0),
            ]
        };
        let batch = RankBatch {
            inputs,
            targets,
            loss: &self.loss,
            shape: &shape,
        };
        self.runner.step(batch, &mut self.peer)
    }

    /// Gives back the NCCL link (to run another schedule over the same communicator).
    pub fn into_peer(self) -> NcclPeer {
        self.peer
    }

    /// The rank's device stages, `(global index, stage)`.
    pub fn stages(&self) -> &[(usize, OnCudaStreams)] {
        self.runner.stages()
    }
}
