//! `pipefill train --backend cuda`: the steps run by the stream runtime
//! ([`pipefill_host::runtime::streams::StreamExecutor`]) on [`CudaStreams`]: one host thread enqueues
//! each whole step (stage calls, event records and waits, timing marks) on per-rank CUDA streams,
//! then waits once; the measured timeline comes from the timing events. The ranks' streams are all
//! on GPU 0 or each on its rank's GPU (`--devices`, [`super::devices`]): each stage is built on its
//! rank's GPU, the inputs go to stage 0's GPU and the targets to the last stage's. With `--graph`
//! the whole step is captured once as a CUDA graph and replayed ([`StreamExecutor::capture`]; one
//! GPU only).

use std::io::IsTerminal;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use pipefill_host::plan::Plan;
use pipefill_host::runtime::streams::StreamExecutor;
use pipefill_host::runtime::{StepReport, Tensor};

use super::setup::GRAPH_PLAIN_STEPS;
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

/// Host seconds spent enqueuing each step, per action (`--backend cuda`): what `--graph` saves.
#[derive(Debug, Clone, Default)]
pub struct HostEnqueue {
    /// Actions per step (the host's per-action divisor).
    pub actions: usize,
    /// Per plain step after the warm-up (step 0): enqueue seconds / actions.
    pub plain: Vec<f64>,
    /// Per replayed step (`--graph`): seconds to refresh the inputs and launch the graph / actions.
    pub graph: Vec<f64>,
    /// Wall seconds of the same plain steps.
    pub plain_steps: Vec<f64>,
    /// Wall seconds of the same replayed steps.
    pub graph_steps: Vec<f64>,
    /// The step captured as a graph (`None` without `--graph`).
    pub captured_at: Option<usize>,
}

/// How step `step` runs: plain, captured, or replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Capture,
    Replay,
}

fn mode(graph: bool, step: usize) -> Mode {
    if !graph || step < GRAPH_PLAIN_STEPS {
        Mode::Plain
    } else if step == GRAPH_PLAIN_STEPS {
        Mode::Capture
    } else {
        Mode::Replay
    }
}

/// The devices of the run: one [`Gpu`] per GPU used and the streams over them (all ranks on GPU 0
/// without a per-rank choice).
fn open_devices(setup: &Setup) -> Result<(Vec<Arc<Gpu>>, CudaStreams), CudaError> {
    let Some(choice) = setup.devices.as_ref().filter(|d| !d.shared()) else {
        let gpu = Gpu::open(0)?;
        return Ok((vec![gpu.clone()], CudaStreams::new(gpu)));
    };
    let gpus = (0..choice.gpus_used())
        .map(Gpu::open)
        .collect::<Result<Vec<_>, _>>()?;
    let device = CudaStreams::on_devices(gpus.clone(), choice.rank_gpus.clone())?;
    Ok((gpus, device))
}

/// Runs `--steps` steps of `stages` (each copied to its rank's GPU) with the stream runtime, showing progress;
/// with `--graph`, steps from [`GRAPH_PLAIN_STEPS`] on are captured once and replayed. A captured or
/// replayed step has no per-action timing (nothing is marked inside a graph): its report carries
/// the last plain step's timeline and action times, and its own losses and wall time.
pub fn run_steps(
    setup: &Setup,
    plan: &Plan,
    stages: &[LinearStage],
) -> Result<(Vec<StepReport>, HostEnqueue), CliError> {
    let a = &setup.args;
    let (gpus, device) = open_devices(setup).map_err(failed)?;
    let rank_gpu = |rank: usize| {
        let choice = setup.devices.as_ref().filter(|d| !d.shared());
        &gpus[choice.map_or(0, |c| c.rank_gpus.get(rank).copied().unwrap_or(0))]
    };
    let on_gpu = stages
        .iter()
        .enumerate()
        .map(|(s, st)| {
            let gpu = rank_gpu(plan.schedule.rank_of(s));
            CudaStage::from_host_in(gpu, st, setup.precision).map(|c| device.stage(c))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed)?;
    // The weights were copied on each stage's own stream; the step runs on the program's streams.
    for gpu in &gpus {
        gpu.synchronize().map_err(failed)?;
    }
    let mut ex = StreamExecutor::new(plan.schedule.clone(), on_gpu, device.clone())
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let loss = device.loss(setup.spec.loss);
    let last = plan.schedule.stages() - 1;
    let on = |stage: usize| &gpus[ex.stage_device(stage).unwrap_or(0)];
    let upload = (
        on(0).new_stream().map_err(failed)?,
        on(last).new_stream().map_err(failed)?,
    );
    let teacher = Teacher::new(&setup.spec, a.seed);
    let mut progress = output::Progress::new(
        a.steps,
        a.format == Format::Text && std::io::stderr().is_terminal(),
    );
    let mut host = HostEnqueue {
        actions: ex.actions(),
        ..HostEnqueue::default()
    };
    let mut reports: Vec<StepReport> = Vec::new();
    for step in 0..a.steps {
        let (x, t) = teacher.batch(step as u64, setup.spec.batch, a.microbatches);
        let (inputs, targets) = upload_batch(&upload, setup.spec.loss, &x, &t).map_err(failed)?;
        let m = mode(a.graph, step);
        let r = match m {
            Mode::Plain => ex.step(inputs, &targets, &loss),
            Mode::Capture => ex.capture(inputs, targets, &loss),
            Mode::Replay => ex.replay(inputs, targets),
        };
        let mut r = r.map_err(|e| CliError::Failed(format!("step {step}: {e}")))?;
        let per_action = ex.enqueue_seconds() / host.actions.max(1) as f64;
        match m {
            Mode::Plain if step > 0 || a.steps == 1 => {
                host.plain.push(per_action);
                host.plain_steps.push(r.seconds);
            }
            Mode::Replay => {
                host.graph.push(per_action);
                host.graph_steps.push(r.seconds);
            }
            Mode::Capture => host.captured_at = Some(step),
            Mode::Plain => {}
        }
        if m != Mode::Plain {
            if let Some(last) = reports.last() {
                r.timeline = last.timeline.clone();
                r.action_seconds = last.action_seconds.clone();
            }
        }
        progress.step(step, r.loss, r.seconds, a.format == Format::Text);
        reports.push(r);
    }
    progress.finish();
    Ok((reports, host))
}

/// A step's inputs copied to stage 0's device on `upload.0` and its targets to the last stage's
/// on `upload.1` (waits for the copies).
pub(super) fn upload_batch(
    upload: &(Arc<CudaStream>, Arc<CudaStream>),
    kind: LossKind,
    x: &[Tensor],
    t: &[Tensor],
) -> Result<(Vec<DeviceTensor>, Vec<DeviceTensor>), CudaError> {
    let inputs = x
        .iter()
        .map(|x| DeviceTensor::from_host(&upload.0, x))
        .collect::<Result<Vec<_>, _>>()?;
    let targets = t
        .iter()
        .map(|t| target(&upload.1, kind, t))
        .collect::<Result<Vec<_>, _>>()?;
    for s in [&upload.0, &upload.1] {
        s.synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))?;
    }
    Ok((inputs, targets))
}
