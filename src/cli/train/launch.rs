//! `pipefill train --launcher mpi` (feature `mpi`): one process per rank of each data-parallel
//! replica under `mpirun`.
//!
//! Every process checks the flags; the world must have `P * D` processes (`--ranks P`,
//! `--data-parallel D`); process `w` is rank `w % P` of replica `w / P`. Process 0 profiles and
//! plans (or takes the `--resume` checkpoint's plan) and sends the plans to the others, so all run
//! one schedule and partition. Each process builds (and restores from a `--resume` checkpoint) only
//! the stages the schedule places on its rank and runs that rank's lowered list with the runtime's per-rank runner over
//! [`MpiTransport`] on its replica's communicator; with replicas, each stage's gradients are
//! averaged over the replicas of its rank ([`GradientMean`], an MPI all-reduce) as soon as the
//! stage's last `W`/`B` is done. The data of a step is the `(seed, step)` global batch, split as in
//! the threaded run: replica `d` takes microbatches `d*M .. (d+1)*M` of `M * D`. After each step
//! the processes send their outcome to process 0, which assembles each replica's step report and
//! prints what the threaded run prints. Checkpoints: replica 0's processes write their rank files,
//! then process 0 the manifest; process 0 holds the `--checkpoint` folder's lock from the setup to
//! the end of the job, so a second run (MPI or not) on the folder is refused. A rank that fails
//! (an error or a panic) reports its error naming the rank and aborts the job (no process waits
//! forever). With `--backend cuda` each process runs one GPU rank over NCCL instead ([`cuda`]),
//! replicas included.

mod cuda;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use pipefill_host::cost::Recompute;
use pipefill_host::plan::{Candidates, Plan};
use pipefill_host::runtime::{
    assemble, optimizer_steps, run_rank, RankOutcome, RankProgram, RankStep, RankStop, Reducer,
    StepReport, Tensor,
};
use pipefill_host::schedule::Item;

use super::checkpoint::lock_folder;
use super::{build_where, candidates, choose, report, run_loop, setup, Args, Setup};
use crate::checkpoint::{store, RankFile, RankState, StageState};
use crate::cli::CliError;
use crate::layers::LinearStage;
use crate::mpi::{GradientMean, MpiError, MpiTransport, Place, World};
use crate::trainer::{
    combine, optimizer_failed, states_of, HostBatch, Saver, StepResult, StepRunner, TrainError,
};

/// Tag of the plans process 0 sends.
const PLANS: i32 = 21;
/// Tag of a rank's step outcome sent to process 0.
const OUTCOME: i32 = 22;
/// Tag of a rank file's length and checksum sent to process 0.
const SAVED: i32 = 23;

/// Runs `pipefill train --launcher mpi` in this process.
pub fn run(args: Args) -> Result<(), CliError> {
    let world = World::init().map_err(|e| CliError::Failed(format!("--launcher mpi: {e}")))?;
    let checked = setup(args).and_then(|s| {
        let (p, d) = (s.args.ranks, s.args.data_parallel);
        world.expect_size(p, d).map_err(|e| world_size(e, p, d))?;
        // One job writes a `--checkpoint` folder at a time: process 0 holds its lock for the
        // whole job, taken before any process writes there; a refusal ends every process below.
        // A crash of process 0 releases it (and ends the job).
        let lock = match &s.args.checkpoint.checkpoint {
            Some(dir) if world.rank() == 0 => Some(lock_folder(dir)?),
            _ => None,
        };
        Ok((s, lock))
    });
    let (mut world, (setup, _lock)) = agree_on_setup(world, checked);
    // After `setup`: `--schedule-file` may have set the rank count.
    let place = Place::of(world.rank(), setup.args.ranks, setup.args.data_parallel);
    let result = catch_unwind(AssertUnwindSafe(|| train_rank(&mut world, &setup, place)))
        .unwrap_or_else(|p| Err(CliError::Failed(format!("panicked: {}", panic_text(&*p)))));
    if let Err(e) = result {
        eprintln!("error: {}: {e}", place.name());
        world.abort(e.exit_code().max(1));
    }
    Ok(())
}

/// The message of a caught panic.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// The checked setup (and what came with it) when every process has one; otherwise the job ends here: the lowest rank
/// that failed reports its error (the flags are the same everywhere, so usually every rank fails
/// alike) and every process exits with the highest exit code.
fn agree_on_setup<T>(world: World, checked: Result<T, CliError>) -> (World, T) {
    let me = world.rank() as u64;
    let size = world.size() as u64;
    let (reporter, code) = match &checked {
        Ok(_) => (0, 0),
        Err(e) => (size - me, e.exit_code().max(1) as u64),
    };
    // The lowest failing rank, as the highest `size - rank`.
    let reporter = size - world.max_over(reporter);
    let code = world.max_over(code);
    match checked {
        Ok(s) if code == 0 => return (world, s),
        Err(e) if reporter == me => eprintln!("error: {e}"),
        _ => {}
    }
    world.barrier();
    drop(world); // finalises MPI
    std::process::exit(code as i32)
}

/// The world-size error with its fix.
fn world_size(e: MpiError, ranks: usize, replicas: usize) -> CliError {
    let fix = if replicas == 1 {
        "give --ranks equal to the process count".to_string()
    } else {
        format!("give --ranks x --data-parallel equal to the process count ({ranks} x {replicas})")
    };
    // Under Slurm (`srun` sets SLURM_STEP_ID in every task) the fix names srun, else mpirun.
    let launcher = if std::env::var_os("SLURM_STEP_ID").is_some() {
        "srun"
    } else {
        "mpirun"
    };
    CliError::Usage(format!(
        "--launcher mpi: {e}; launch with `{launcher} -n {}`, or {fix}",
        ranks * replicas
    ))
}

/// A failed step or message, as the CLI reports it.
fn failed(e: impl std::fmt::Display) -> CliError {
    CliError::Failed(e.to_string())
}

/// Process 0's candidate plans (best first) and its profile's spread, sent to every process.
fn agree_on_plans(world: &World, setup: &Setup) -> Result<Candidates, CliError> {
    if world.rank() == 0 {
        let plans = candidates(setup)?;
        let bytes = serde_json::to_vec(&plans).map_err(failed)?;
        for r in 1..world.size() {
            world.send_slice(r, PLANS, &bytes[..]);
        }
        Ok(plans)
    } else {
        let bytes: Vec<u8> = world.recv_vec(0, PLANS);
        serde_json::from_slice(&bytes).map_err(|e| failed(format!("the plans from rank 0: {e}")))
    }
}

/// Send-buffer bytes so that none of this rank's sends in a step waits for its receiver.
fn send_buffer(setup: &Setup, program: &RankProgram, rank: usize) -> usize {
    let sends = program
        .list(rank)
        .iter()
        .filter(|i| matches!(i, Item::Comm(c) if c.op.is_send()))
        .count();
    let a = &setup.args;
    let rows = setup.spec.batch / (a.microbatches * a.data_parallel).max(1);
    let widest = setup
        .spec
        .dims()
        .map(|(i, o, _)| i.max(o))
        .max()
        .unwrap_or(0);
    MpiTransport::buffer_bytes(sends, rows * widest, 2)
}

/// This process's rank through every step; process 0 reports.
fn train_rank(world: &mut World, setup: &Setup, place: Place) -> Result<(), CliError> {
    let candidates = agree_on_plans(world, setup)?;
    let chosen = choose(&candidates)?;
    let plans = candidates.plans;
    if setup.backend == super::Backend::Cuda {
        return cuda::train_rank(world, setup, place, &plans, &chosen);
    }
    let schedule = &chosen.plan.schedule;
    world.reserve_send_buffer(send_buffer(setup, &RankProgram::of(schedule), place.rank));
    let (pipe, grads) = world.split(&place).map_err(failed)?;
    let reducer = grads
        .map(GradientMean::new)
        .map(|mean| move |_stage: usize, g: Vec<&mut [f32]>| mean.reduce(g));
    let me = place.rank;
    let (stages, first_step) = build_where(setup, &chosen.plan, |s| schedule.rank_of(s) == me)?;
    let mut runner = CpuRank {
        job: Job::new(world, setup, place, &chosen.plan)
            .reducing(reducer.as_ref().map(|r| r as &Reducer)),
        stages,
        transport: MpiTransport::new(&pipe),
    };
    train_job(setup, (&plans, &chosen), first_step, &mut runner, place)
}

/// The loop over this process's `runner`; process 0 reports.
fn train_job(
    setup: &Setup,
    (plans, chosen): (&[Plan], &super::Chosen),
    first_step: usize,
    runner: &mut dyn StepRunner,
    place: Place,
) -> Result<(), CliError> {
    let reporting = place.world == 0;
    if let Some(o) = run_loop(setup, &chosen.plan, first_step, runner, reporting)? {
        report(setup, plans, chosen, &o)?;
    }
    Ok(())
}

/// A CPU rank of an MPI job: its stages, run by the runtime's per-rank runner over MPI.
struct CpuRank<'a> {
    job: Job<'a>,
    stages: Vec<(usize, LinearStage)>,
    transport: MpiTransport<'a>,
}

impl StepRunner for CpuRank<'_> {
    fn step(&mut self, step: usize, (x, t): HostBatch) -> StepResult {
        let (out, seconds) = self
            .job
            .step(step, &mut self.stages, x, t, &mut self.transport)?;
        gather(&self.job, out, seconds)
    }

    /// This rank's stages' optimizer steps (the step succeeded on every rank, or it failed).
    fn optimizer_step(&mut self, step: usize) -> Result<(), TrainError> {
        let (rank, stages) = (self.job.place.rank, &mut self.stages);
        optimizer_steps(stages.iter_mut().map(|(s, st)| (*s, st)), |_| rank)
            .map_err(|e| optimizer_failed(step, e))
    }

    fn save(&mut self, saver: &Saver, done: usize) -> Result<(), TrainError> {
        let states = states_of(self.stages.iter().map(|(s, st)| (*s, st)), done)?;
        save(&self.job, saver, done, states)
    }
}

/// What every step of this process shares.
struct Job<'a> {
    world: &'a World,
    setup: &'a Setup,
    place: Place,
    plan: &'a Plan,
    program: RankProgram,
    /// The gradient mean over replicas, with more than one.
    reduce: Option<&'a Reducer>,
    /// Each stage's recomputation mode (from the plan's costs).
    recompute: Vec<Recompute>,
}

impl<'a> Job<'a> {
    /// The job of this process (`place`) in `world`, running `plan`.
    fn new(world: &'a World, setup: &'a Setup, place: Place, plan: &'a Plan) -> Self {
        Job {
            world,
            setup,
            place,
            plan,
            program: RankProgram::of(&plan.schedule),
            reduce: None,
            recompute: plan.cost.recompute(),
        }
    }

    /// With the gradient mean over replicas `reduce`.
    fn reducing(self, reduce: Option<&'a Reducer>) -> Self {
        Job { reduce, ..self }
    }

    /// This replica's microbatches of a step's `M * D` (replica `d` takes `d*M .. (d+1)*M`).
    fn mine<T>(&self, v: Vec<T>) -> Vec<T> {
        let m = self.setup.args.microbatches;
        v.into_iter().skip(self.place.replica * m).take(m).collect()
    }

    /// Runs this rank's part of step `step` on this replica's microbatches of the global batch
    /// `x`, `t` (`M * D` microbatches); its outcome and wall seconds.
    fn step(
        &self,
        step: usize,
        stages: &mut [(usize, LinearStage)],
        x: Vec<Tensor>,
        t: Vec<Tensor>,
        transport: &mut MpiTransport<'_>,
    ) -> Result<(RankOutcome, f64), TrainError> {
        let me = self.place.rank;
        let (x, t) = (self.mine(x), self.mine(t));
        let inputs = if self.plan.schedule.rank_of(0) == me {
            x
        } else {
            Vec::new()
        };
        let schedule = &self.plan.schedule;
        self.world.barrier();
        let epoch = Instant::now();
        let rank_step = RankStep {
            schedule,
            program: &self.program,
            rank: me,
            stages: stages.iter_mut().map(|(s, stage)| (*s, stage)).collect(),
            inputs,
            targets: &t,
            loss: &self.setup.spec.loss,
            epoch,
            exclusive: None,
            hook: None,
            reduce: self.reduce,
            recompute: &self.recompute,
        };
        let out = run_rank(rank_step, transport);
        let seconds = epoch.elapsed().as_secs_f64();
        stopped(step, out, seconds)
    }
}

/// A rank's outcome of step `step` and its wall seconds, or why it stopped.
fn stopped(step: usize, out: RankOutcome, seconds: f64) -> Result<(RankOutcome, f64), TrainError> {
    let message = match &out.result {
        Ok(()) => return Ok((out, seconds)),
        Err(RankStop::Failed(e)) => e.to_string(),
        Err(RankStop::Aborted) => "aborted".to_string(),
    };
    Err(TrainError::Step { step, message })
}

/// Sends this process's outcome to process 0; on process 0, gathers every process's into the
/// step report (`None` elsewhere): each replica's ranks assembled, the loss the mean over
/// replicas, the time the slowest process's, the timeline replica 0's (as the threaded run).
fn gather(job: &Job<'_>, out: RankOutcome, seconds: f64) -> Result<Option<StepReport>, TrainError> {
    let (world, place) = (job.world, job.place);
    let failed = TrainError::Runner;
    if place.world != 0 {
        // The outcome (serde data, losses exact) and the process's wall seconds of the step.
        let bytes = serde_json::to_vec(&(out, seconds)).map_err(|e| failed(e.to_string()))?;
        world.send_slice(0, OUTCOME, &bytes[..]);
        return Ok(None);
    }
    let mut replicas: Vec<Vec<RankOutcome>> = vec![vec![out]];
    let mut slowest = seconds;
    for w in 1..world.size() {
        let bytes: Vec<u8> = world.recv_vec(w, OUTCOME);
        let from = Place::of(w, place.ranks, place.replicas);
        let (o, s): (RankOutcome, f64) = serde_json::from_slice(&bytes)
            .map_err(|e| failed(format!("the step outcome of {}: {e}", from.name())))?;
        slowest = slowest.max(s);
        if from.rank == 0 {
            replicas.push(Vec::with_capacity(place.ranks));
        }
        replicas
            .last_mut()
            .ok_or_else(|| failed("no replica".into()))?
            .push(o);
    }
    let reports = replicas
        .into_iter()
        .map(|outcomes| {
            assemble(&job.plan.schedule, outcomes, slowest).map_err(|e| failed(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    combine(reports).map(Some)
}

/// Writes this rank's file of the checkpoint after step `done` (replica 0's processes only);
/// process 0 then writes the manifest once every rank's file is written and synced.
fn save(
    job: &Job<'_>,
    saver: &Saver,
    done: usize,
    stages: Vec<StageState>,
) -> Result<(), TrainError> {
    let (world, me) = (job.world, job.place.rank);
    if job.place.replica != 0 {
        return Ok(());
    }
    let state = RankState {
        rank: me,
        step: done as u64,
        stages,
    };
    let file = store::write_rank(saver.dir(), &state).map_err(|e| saver.failed(done, e))?;
    if me != 0 {
        world.send_slice(0, SAVED, &[file.bytes, file.checksum][..]);
        return Ok(());
    }
    let mut files = vec![file];
    // Replica 0's rank `r` is process `r`.
    for r in 1..job.place.ranks {
        let v: Vec<u64> = world.recv_vec(r, SAVED);
        let [bytes, checksum] = v[..] else {
            return Err(TrainError::Runner(format!(
                "rank {r} sent {} values for its file",
                v.len()
            )));
        };
        files.push(RankFile {
            rank: r,
            file: store::rank_file_name(r),
            bytes,
            checksum,
        });
    }
    store::write_manifest(saver.dir(), &saver.manifest(done, files))
        .map_err(|e| saver.failed(done, e))
}
