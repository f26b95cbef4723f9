//! `pipefill train --backend cuda --launcher mpi`: one GPU rank per process. Each process opens its
//! node-local GPU (`local rank mod device count`), process 0 makes the NCCL unique id and MPI
//! broadcasts its bytes, every process joins the NCCL communicator and copies only its own stages
//! to its GPU ([`CudaRank`]), then runs its rank of each step with the per-rank stream runner, the
//! activations and gradients crossing ranks over NCCL. The outcomes go to process 0 over MPI as on
//! the CPU path, which prints what the threaded run prints. Checkpoints copy each rank's stages back
//! to the host and save them as the CPU ranks do; `--resume` copies the saved state to the GPU.
//! With `--data-parallel`, each replica's ranks reduce their gradients over MPI. With `--graph`,
//! each process captures its rank's step (its NCCL sends and receives included) after
//! [`GRAPH_PLAIN_STEPS`](crate::trainer::streams::GRAPH_PLAIN_STEPS) plain steps and replays it;
//! a captured or replayed step reports the last plain step's timeline (nothing is timed inside a
//! graph). Not yet run on GPUs (UNVERIFIED).

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaStream;

use super::{gather, save, stopped, train_job, Job};
use crate::cli::train::{build_where, Chosen, Setup};
use crate::cli::CliError;
use crate::cuda::nccl::{UniqueId, ID_BYTES};
use crate::cuda::{device_count, CudaError, CudaRank, Gpu, NcclPeer, RankModel};
use crate::model::stage_ranges;
use crate::mpi::{Comm, GradientMean, Place, World};
use crate::trainer::cuda::upload_batch;
use crate::trainer::streams::{mode, Mode};
use crate::trainer::{
    optimizer_failed, states_of, HostBatch, Saver, StepResult, StepRunner, TrainError,
};
use pipefill_host::runtime::{RankOutcome, Reducer};

fn cuda_failed(e: impl std::fmt::Display) -> CliError {
    CliError::Failed(format!("--backend cuda: {e}"))
}

/// This process's GPU: its index among the processes of its node, modulo the devices there.
fn local_gpu(world: &World) -> Result<Arc<Gpu>, CliError> {
    let local = world.local_rank();
    let count = device_count().map_err(cuda_failed)?;
    if count == 0 {
        return Err(cuda_failed(CudaError::NoDevice {
            ordinal: local,
            count,
            reason: None,
        }));
    }
    Gpu::open(local % count).map_err(cuda_failed)
}

/// The NCCL id of a replica's pipeline, made by its process 0 and broadcast over `pipe`, the
/// replica's communicator (every process of it calls this at once; if process 0 cannot make one,
/// its error ends the job through the launcher's abort).
fn shared_id(pipe: &Comm) -> Result<UniqueId, CliError> {
    let mut bytes = [0u8; ID_BYTES];
    if pipe.rank() == 0 {
        bytes = UniqueId::new().map_err(cuda_failed)?.to_bytes();
    }
    pipe.broadcast(0, &mut bytes);
    UniqueId::from_bytes(&bytes).ok_or_else(|| cuda_failed("the NCCL id from rank 0 is malformed"))
}

/// The output width of each stage of `plan` (its last layer's): what crosses each boundary.
fn stage_widths(setup: &Setup, plan: &pipefill_host::plan::Plan) -> Vec<usize> {
    stage_ranges(&plan.layers_per_stage)
        .iter()
        .map(|r| {
            let last = r.end.checked_sub(1).and_then(|l| setup.spec.layers.get(l));
            last.map_or(0, |l| l.width)
        })
        .collect()
}

/// This process's rank through every step on its GPU; process 0 reports.
pub(super) fn train_rank(
    world: &mut World,
    setup: &Setup,
    place: Place,
    plans: &[pipefill_host::plan::Plan],
    chosen: &Chosen,
) -> Result<(), CliError> {
    let schedule = &chosen.plan.schedule;
    let gpu = local_gpu(world)?;
    let (pipe, grads) = world.split(&place).map_err(cuda_failed)?;
    let id = shared_id(&pipe)?;
    let peer = NcclPeer::open(&gpu, place.rank, place.ranks, id).map_err(cuda_failed)?;
    let (stages, first_step) =
        build_where(setup, &chosen.plan, |s| schedule.rank_of(s) == place.rank)?;
    let model = RankModel {
        stages: stages.iter().map(|(s, st)| (*s, st)).collect(),
        widths: stage_widths(setup, &chosen.plan),
        precision: setup.precision,
        loss: setup.spec.loss,
    };
    let mut me =
        CudaRank::new(&gpu, schedule.clone(), place.rank, model, peer).map_err(cuda_failed)?;
    me.set_recompute(&chosen.plan.cost.recompute());
    drop(stages);
    me.set_reducer(grads.map(|comm| {
        let mean = GradientMean::new(comm);
        Arc::new(move |_stage: usize, g: Vec<&mut [f32]>| mean.reduce(g)) as Arc<Reducer>
    }));
    let upload = gpu.new_stream().map_err(cuda_failed)?;
    let mut runner = GpuRank {
        job: Job::new(world, setup, place, &chosen.plan),
        me,
        upload,
        graph: setup.args.graph,
        ran: 0,
        last_plain: None,
    };
    train_job(setup, (plans, chosen), first_step, &mut runner, place)
}

/// A GPU rank of an MPI job: its stages on its GPU, the data crossing ranks over NCCL.
struct GpuRank<'a> {
    job: Job<'a>,
    me: CudaRank,
    upload: Arc<CudaStream>,
    /// `--graph`: capture the rank's step and replay it.
    graph: bool,
    /// Steps run so far (what [`mode`] decides by).
    ran: usize,
    /// The last plain step's spans and action times (what a graph step reports).
    last_plain: Option<RankOutcome>,
}

impl StepRunner for GpuRank<'_> {
    /// One step of this rank on its GPU: stage 0's inputs uploaded on its rank, the targets on
    /// the last stage's.
    fn step(&mut self, step: usize, (x, t): HostBatch) -> StepResult {
        let job = &self.job;
        let (x, t) = (job.mine(x), job.mine(t));
        let (schedule, rank) = (&job.plan.schedule, job.place.rank);
        let first = schedule.rank_of(0) == rank;
        let last = schedule.rank_of(schedule.stages() - 1) == rank;
        let rows: Vec<usize> = x
            .iter()
            .map(|x| x.shape().first().copied().unwrap_or(0))
            .collect();
        // One GPU per process: inputs and targets both go up on this rank's upload stream.
        let (inputs, targets) = upload_batch(
            (&self.upload, &self.upload),
            job.setup.spec.loss,
            if first { &x } else { &[] },
            if last { &t } else { &[] },
        )
        .map_err(|e| TrainError::Runner(cuda_failed(e).to_string()))?;
        job.world.barrier();
        let epoch = Instant::now();
        let m = mode(self.graph, self.ran);
        let mut out = match m {
            Mode::Plain => self.me.step(inputs, &targets, &rows),
            Mode::Capture => self.me.capture(inputs, targets, &rows),
            Mode::Replay => self.me.replay(inputs, targets),
        };
        self.ran += 1;
        match (&self.last_plain, m) {
            (_, Mode::Plain) => self.last_plain = Some(out.clone()),
            (Some(last), _) => {
                out.spans = last.spans.clone();
                out.action_seconds = last.action_seconds.clone();
            }
            (None, _) => {}
        }
        let (out, seconds) = stopped(step, out, epoch.elapsed().as_secs_f64())?;
        gather(job, out, seconds)
    }

    fn optimizer_step(&mut self, step: usize) -> Result<(), TrainError> {
        self.me
            .optimizer_step()
            .map_err(|e| optimizer_failed(step, e))
    }

    /// This rank's stages copied back to the host and written as its file of the checkpoint.
    fn save(&mut self, saver: &Saver, done: usize) -> Result<(), TrainError> {
        let states = states_of(self.me.stages().iter().map(|(s, st)| (*s, st)), done)?;
        save(&self.job, saver, done, states)
    }
}
