//! `pipefill train --backend cuda`: the steps run by the stream runtime
//! ([`pipefill_host::runtime::streams::StreamExecutor`]) on [`CudaStreams`]: one host thread enqueues
//! each whole step (stage calls, event records and waits, timing marks) on per-rank CUDA streams of
//! GPU 0, then waits once; the measured timeline comes from the timing events.

use std::io::IsTerminal;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use pipefill_host::plan::Plan;
use pipefill_host::runtime::streams::StreamExecutor;
use pipefill_host::runtime::{StepReport, Tensor};

use super::{output, Format, Setup};
use crate::cli::CliError;
use crate::cuda::{CudaError, CudaStage, CudaStreams, DeviceTensor, Gpu};
use crate::layers::{LinearStage, LossKind};
use crate::model::Teacher;

fn failed(e: CudaError) -> CliError {
    CliError::Failed(format!("--backend cuda: {e}"))
}

/// A microbatch's target on the device: values (MSE) or class labels (cross-entropy).
fn target(stream: &Arc<CudaStream>, kind: LossKind, t: &Tensor) -> Result<DeviceTensor, CudaError> {
    match kind {
        LossKind::Mse => DeviceTensor::from_host(stream, t),
        LossKind::CrossEntropy => {
            // The teacher's classes are whole numbers in range; the loss kernel checks the range.
            let classes: Vec<u32> = t.data().iter().map(|&c| c.max(0.0) as u32).collect();
            DeviceTensor::labels(stream, &classes)
        }
    }
}

/// Runs `--steps` steps of `stages` (copied to GPU 0) with the stream runtime, showing progress.
pub fn run_steps(
    setup: &Setup,
    plan: &Plan,
    stages: &[LinearStage],
) -> Result<Vec<StepReport>, CliError> {
    let a = &setup.args;
    let gpu = Gpu::open(0).map_err(failed)?;
    let device = CudaStreams::new(gpu.clone());
    let on_gpu = stages
        .iter()
        .map(|s| CudaStage::from_host_in(&gpu, s, setup.precision).map(|c| device.stage(c)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed)?;
    // The weights were copied on each stage's own stream; the step runs on the program's streams.
    gpu.synchronize().map_err(failed)?;
    let mut ex = StreamExecutor::new(plan.schedule.clone(), on_gpu, device.clone())
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let loss = device.loss(setup.spec.loss);
    let upload = gpu.new_stream().map_err(failed)?;
    let teacher = Teacher::new(&setup.spec, a.seed);
    let mut progress = output::Progress::new(
        a.steps,
        a.format == Format::Text && std::io::stderr().is_terminal(),
    );
    let mut reports = Vec::with_capacity(a.steps);
    for step in 0..a.steps {
        let (x, t) = teacher.batch(step as u64, setup.spec.batch, a.microbatches);
        let inputs = x
            .iter()
            .map(|x| DeviceTensor::from_host(&upload, x))
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        let targets = t
            .iter()
            .map(|t| target(&upload, setup.spec.loss, t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        upload
            .synchronize()
            .map_err(|e| failed(CudaError::driver("cuStreamSynchronize")(e)))?;
        let r = ex
            .step(inputs, &targets, &loss)
            .map_err(|e| CliError::Failed(format!("step {step}: {e}")))?;
        progress.step(step, r.loss, r.seconds, a.format == Format::Text);
        reports.push(r);
    }
    progress.finish();
    Ok(reports)
}
