//! `pipefill train --backend cuda`: the [stream runner](crate::trainer::Streams) on
//! [`CudaStreams`]: one host thread enqueues each whole step (stage calls, event records and waits,
//! timing marks) on per-rank CUDA streams, then waits once; the measured timeline comes from the
//! timing events. The ranks' streams are all on GPU 0 or each on its rank's GPU (`--devices`,
//! [`super::devices`]): each stage is built on its rank's GPU, the inputs go to stage 0's GPU and
//! the targets to the last stage's. With `--graph` the whole step is captured once as a CUDA graph
//! and replayed (one GPU only). With `--data-parallel D`, `D` replicas of the stages and streams on
//! the same GPUs, their gradients averaged before each optimizer step; `--resume` starts from the
//! checkpoint's weights and optimizer state, and checkpoints copy them back to the host.

use std::sync::Arc;

use pipefill_host::plan::Plan;

use super::{build, Setup};
use crate::cli::CliError;
use crate::cuda::{CudaError, CudaStage, CudaStreams, Gpu};
use crate::trainer::cuda::CudaUpload;
use crate::trainer::{StepRunner, Streams};

fn failed(e: CudaError) -> CliError {
    CliError::Failed(format!("--backend cuda: {e}"))
}

/// The GPUs of the run: one [`Gpu`] per GPU used (GPU 0 alone without a per-rank choice).
fn open_gpus(setup: &Setup) -> Result<Vec<Arc<Gpu>>, CudaError> {
    let used = setup
        .devices
        .as_ref()
        .filter(|d| !d.shared())
        .map_or(1, |d| d.gpus_used());
    (0..used).map(Gpu::open).collect()
}

/// Streams over `gpus` for the run's ranks (all on GPU 0 without a per-rank choice).
fn streams(setup: &Setup, gpus: &[Arc<Gpu>]) -> Result<CudaStreams, CudaError> {
    match setup.devices.as_ref().filter(|d| !d.shared()) {
        Some(choice) => CudaStreams::on_devices(gpus.to_vec(), choice.rank_gpus.clone()),
        None => Ok(CudaStreams::new(gpus[0].clone())),
    }
}

/// The stream runner of the run: per replica, the model's stages (the seed's weights or
/// `--resume`'s state) each copied to its rank's GPU, its streams and its loss; the steps already
/// trained.
pub fn runner(setup: &Setup, plan: &Plan) -> Result<(Box<dyn StepRunner>, usize), CliError> {
    let a = &setup.args;
    let gpus = open_gpus(setup).map_err(failed)?;
    let rank_gpu = |rank: usize| {
        let choice = setup.devices.as_ref().filter(|d| !d.shared());
        &gpus[choice.map_or(0, |c| c.rank_gpus.get(rank).copied().unwrap_or(0))]
    };
    let mut replicas = Vec::with_capacity(a.data_parallel.max(1));
    let mut first_step = 0;
    for _ in 0..a.data_parallel.max(1) {
        let (stages, first) = build(setup, plan)?;
        first_step = first;
        let device = streams(setup, &gpus).map_err(failed)?;
        let on_gpu = stages
            .iter()
            .enumerate()
            .map(|(s, st)| {
                let gpu = rank_gpu(plan.schedule.rank_of(s));
                CudaStage::from_host_in(gpu, st, setup.precision).map(|c| device.stage(c))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        let loss = device.loss(setup.spec.loss);
        replicas.push((on_gpu, device, loss));
    }
    // The weights were copied on each stage's own stream; the steps run on the program's streams.
    for gpu in &gpus {
        gpu.synchronize().map_err(failed)?;
    }
    let upload = CudaUpload {
        streams: gpus
            .iter()
            .map(|g| g.new_stream())
            .collect::<Result<_, _>>()
            .map_err(failed)?,
        loss: setup.spec.loss,
    };
    let runner = Streams::new(&plan.schedule, replicas, upload, a.microbatches, a.graph)?
        .recomputing(&plan.cost.recompute());
    Ok((Box::new(runner), first_step))
}
