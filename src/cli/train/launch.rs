//! `pipefill train --launcher mpi` (feature `mpi`): one process per rank under `mpirun`.
//!
//! Every process checks the flags; the world must have one process per rank. Process 0 profiles
//! and plans (or takes the `--resume` checkpoint's plan) and sends the plans to the others, so all
//! run one schedule and partition. Each process builds the model, keeps the stages the schedule
//! places on its rank and runs that rank's lowered list with the runtime's per-rank runner over
//! [`MpiTransport`]; the data of a step is the same `(seed, step)` batch everywhere. After each step
//! the ranks send their outcome to process 0, which assembles the step report and prints what the
//! threaded run prints. Checkpoints: each process writes its own rank file, then process 0 the
//! manifest. A rank that fails reports its error and aborts the job (no process waits forever).

use std::time::Instant;

use pipefill_host::plan::Plan;
use pipefill_host::runtime::{
    assemble, run_rank, RankOutcome, RankProgram, RankStep, RankStop, StepReport,
};
use pipefill_host::schedule::{Action, Item, Schedule};
use pipefill_host::timeline::{Span, Transfer};
use serde::{Deserialize, Serialize};

use super::checkpoint::Saver;
use super::{build, candidates, choose, outcome, progress, report, setup, Args, Format, Setup};
use crate::checkpoint::{store, RankFile, RankState, StageState};
use crate::cli::CliError;
use crate::layers::LinearStage;
use crate::model::Teacher;
use crate::mpi::{MpiError, MpiTransport, World};

/// Tag of the plans process 0 sends.
const PLANS: i32 = 21;
/// Tag of a rank's step outcome sent to process 0.
const OUTCOME: i32 = 22;
/// Tag of a rank file's length and checksum sent to process 0.
const SAVED: i32 = 23;

/// Runs `pipefill train --launcher mpi` in this process.
pub fn run(args: Args) -> Result<(), CliError> {
    let world = World::init().map_err(|e| CliError::Failed(format!("--launcher mpi: {e}")))?;
    let me = world.rank();
    let checked = setup(args).and_then(|s| {
        world
            .expect_size(s.args.ranks)
            .map_err(|e| world_size(e, s.args.ranks))?;
        Ok(s)
    });
    let (mut world, setup) = agree_on_setup(world, checked);
    if let Err(e) = train_rank(&mut world, &setup) {
        eprintln!("error: rank {me}: {e}");
        world.abort(e.exit_code());
    }
    Ok(())
}

/// The checked setup when every process has one; otherwise the job ends here: the lowest rank
/// that failed reports its error (the flags are the same everywhere, so usually every rank fails
/// alike) and every process exits with the highest exit code.
fn agree_on_setup(world: World, checked: Result<Setup, CliError>) -> (World, Setup) {
    let me = world.rank() as u64;
    let size = world.size() as u64;
    let (reporter, code) = match &checked {
        Ok(_) => (0, 0),
        Err(e) => (size - me, e.exit_code().max(1) as u64),
    };
    // The lowest failing rank, as the highest `size - rank`.
    let reporter = size - world.max_over_world(reporter);
    let code = world.max_over_world(code);
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
fn world_size(e: MpiError, ranks: usize) -> CliError {
    CliError::Usage(format!(
        "--launcher mpi: {e}; launch with `mpirun -n {ranks}`, or give --ranks equal to the \
         process count"
    ))
}

/// A failed step or message, as the CLI reports it.
fn failed(e: impl std::fmt::Display) -> CliError {
    CliError::Failed(e.to_string())
}

/// Process 0's candidate plans, sent to every process (best first).
fn agree_on_plans(world: &World, setup: &Setup) -> Result<Vec<Plan>, CliError> {
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
    let rows = setup.spec.batch / setup.args.microbatches.max(1);
    let widest = setup
        .spec
        .dims()
        .map(|(i, o, _)| i.max(o))
        .max()
        .unwrap_or(0);
    MpiTransport::buffer_bytes(sends, rows * widest, 2)
}

/// This process's rank through every step; process 0 reports.
fn train_rank(world: &mut World, setup: &Setup) -> Result<(), CliError> {
    let me = world.rank();
    let a = &setup.args;
    let plans = agree_on_plans(world, setup)?;
    let chosen = choose(&plans)?;
    let schedule = &chosen.plan.schedule;
    let program = RankProgram::of(schedule);
    world.reserve_send_buffer(send_buffer(setup, &program, me));
    let (mut stages, first_step) = build(setup, &chosen.plan)?;
    let saver = Saver::new(setup, &chosen.plan);
    let teacher = Teacher::new(&setup.spec, a.seed);
    let mut transport = MpiTransport::new(world);
    let mut progress = (me == 0).then(|| progress(setup, first_step));
    let mut reports = Vec::with_capacity(a.steps - first_step);
    for step in first_step..a.steps {
        let (x, t) = teacher.batch(step as u64, setup.spec.batch, a.microbatches);
        world.barrier();
        let epoch = Instant::now();
        let mine: Vec<(usize, &mut LinearStage)> = stages
            .iter_mut()
            .enumerate()
            .filter(|(s, _)| schedule.rank_of(*s) == me)
            .collect();
        let inputs = if schedule.rank_of(0) == me {
            x
        } else {
            Vec::new()
        };
        let rank_step = RankStep {
            schedule,
            program: &program,
            rank: me,
            stages: mine,
            inputs,
            targets: &t,
            loss: &setup.spec.loss,
            epoch,
            exclusive: None,
            hook: None,
        };
        let out = run_rank(rank_step, &mut transport);
        let seconds = epoch.elapsed().as_secs_f64();
        match &out.result {
            Ok(()) => {}
            Err(RankStop::Failed(e)) => return Err(failed(format!("step {step}: {e}"))),
            Err(RankStop::Aborted) => return Err(failed(format!("step {step}: aborted"))),
        }
        if let Some(r) = gather(world, &chosen.plan, out, seconds)? {
            if let Some(p) = progress.as_mut() {
                p.step(step, r.loss, r.seconds, a.format == Format::Text);
            }
            reports.push(r);
        }
        if let Some(s) = saver.as_ref().filter(|s| s.due(step + 1)) {
            save(world, s, step + 1, schedule, &stages)?;
        }
    }
    if let Some(mut p) = progress {
        p.finish();
        let outcome = outcome(setup, &chosen.plan, first_step, &reports)?;
        report(setup, &plans, &chosen, &outcome)?;
    }
    Ok(())
}

/// A [`RankOutcome`] of a rank that succeeded, as it travels to process 0.
#[derive(Serialize, Deserialize)]
struct Wire {
    spans: Vec<Span>,
    transfers: Vec<Transfer>,
    /// `(microbatch, loss bits)`: exact.
    losses: Vec<(usize, u32)>,
    peak_held: usize,
    action_seconds: Vec<(String, f64)>,
}

impl Wire {
    fn of(o: RankOutcome) -> Self {
        Wire {
            spans: o.spans,
            transfers: o.transfers,
            losses: o.losses.iter().map(|&(k, l)| (k, l.to_bits())).collect(),
            peak_held: o.peak_held,
            action_seconds: o
                .action_seconds
                .iter()
                .map(|(a, t)| (a.to_string(), *t))
                .collect(),
        }
    }

    fn outcome(self) -> Result<RankOutcome, String> {
        let action_seconds = self
            .action_seconds
            .into_iter()
            .map(|(a, t)| {
                a.parse::<Action>()
                    .map(|a| (a, t))
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<_, _>>()?;
        Ok(RankOutcome {
            spans: self.spans,
            transfers: self.transfers,
            losses: self
                .losses
                .into_iter()
                .map(|(k, b)| (k, f32::from_bits(b)))
                .collect(),
            peak_held: self.peak_held,
            action_seconds,
            result: Ok(()),
        })
    }
}

/// Sends this rank's outcome to process 0; on process 0, gathers every rank's into the step
/// report (`None` elsewhere).
fn gather(
    world: &World,
    plan: &Plan,
    out: RankOutcome,
    seconds: f64,
) -> Result<Option<StepReport>, CliError> {
    if world.rank() != 0 {
        let bytes = serde_json::to_vec(&Wire::of(out)).map_err(failed)?;
        world.send_slice(0, OUTCOME, &bytes[..]);
        return Ok(None);
    }
    let mut outcomes = vec![out];
    for r in 1..world.size() {
        let bytes: Vec<u8> = world.recv_vec(r, OUTCOME);
        let wire: Wire = serde_json::from_slice(&bytes)
            .map_err(|e| failed(format!("the step outcome of rank {r}: {e}")))?;
        outcomes.push(wire.outcome().map_err(failed)?);
    }
    assemble(&plan.schedule, outcomes, seconds)
        .map(Some)
        .map_err(failed)
}

/// Writes this rank's file of the checkpoint after step `done`; process 0 then writes the manifest
/// once every rank's file is written and synced.
fn save(
    world: &World,
    saver: &Saver,
    done: usize,
    schedule: &Schedule,
    stages: &[LinearStage],
) -> Result<(), CliError> {
    let me = world.rank();
    let state = RankState {
        rank: me,
        step: done as u64,
        stages: stages
            .iter()
            .enumerate()
            .filter(|(s, _)| schedule.rank_of(*s) == me)
            .map(|(s, stage)| StageState::of(s, stage))
            .collect(),
    };
    let file = store::write_rank(saver.dir(), &state).map_err(|e| saver.failed(done, e))?;
    if me != 0 {
        world.send_slice(0, SAVED, &[file.bytes, file.checksum][..]);
        return Ok(());
    }
    let mut files = vec![file];
    for r in 1..world.size() {
        let v: Vec<u64> = world.recv_vec(r, SAVED);
        let [bytes, checksum] = v[..] else {
            return Err(failed(format!(
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
