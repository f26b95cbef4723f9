//! `--checkpoint`, `--checkpoint-every` and `--resume` of `pipefill train`: the flags, their checks
//! (a checkpoint that does not fit the run is refused here, before any work, with exit code 2), and
//! the run's [`Saver`] (the loop saves). The format and the files are [`crate::checkpoint`].

use std::path::{Path, PathBuf};

use pipefill_host::plan::Plan;

use super::{Args, Setup, TrainPlan};
use crate::checkpoint::{
    self, learning_rate, store, CheckpointError, Field, Manifest, ModelShape, RankState,
    RunIdentity, FORMAT, FORMAT_VERSION,
};
use crate::cli::CliError;
use crate::layers::{LinearStage, Optimizer};
use crate::model::ModelSpec;
use crate::trainer::Saver;

/// The checkpoint flags of `pipefill train`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CheckpointArgs {
    /// Save every rank's weights and optimizer state into this folder (`step-N/` per checkpoint:
    /// one file per rank, then `manifest.json`), every `--checkpoint-every` steps and after the
    /// last step.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Save a checkpoint every N steps (default: only after the last step).
    #[arg(long, value_name = "N", requires = "checkpoint")]
    pub checkpoint_every: Option<usize>,
    /// Continue from the latest complete checkpoint in this folder, up to `--steps` steps in all,
    /// with its schedule and partition. The model, `--ranks`, `--microbatches`, `--seed`,
    /// `--optimizer` and `--lr` must be those of the run that saved it.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
}

/// A checkpoint to resume from, loaded and checked.
#[derive(Debug, Clone)]
pub struct Resume {
    /// The `--resume` folder.
    pub dir: PathBuf,
    /// The checkpoint's own folder (`step-N/`).
    pub folder: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Every rank's saved state.
    pub ranks: Vec<RankState>,
}

impl Resume {
    /// Steps already trained.
    pub fn step(&self) -> usize {
        self.manifest.step as usize
    }
}

/// The flag a user changes to fix a mismatch in `field`.
fn flag_of(field: Field) -> &'static str {
    match field {
        Field::Model => "--model or --layers/--hidden/--outputs/--activation/--loss",
        Field::Batch => "--batch",
        Field::Ranks => "--ranks",
        Field::Microbatches => "--microbatches",
        Field::Chunks => "--chunks",
        Field::Schedule => "--schedule or --schedule-file",
        Field::Partition => "--plan",
        Field::Seed => "--seed",
        Field::Optimizer => "--optimizer",
        Field::LearningRate => "--lr",
        Field::Activations => "--activations",
    }
}

/// A [`CheckpointError`] met at `flag DIR`, as a usage error with the fix.
fn refuse(flag: &str, dir: &Path, e: CheckpointError) -> CliError {
    let fix = match &e {
        CheckpointError::Mismatch { field, .. } => format!(
            "give the {} of the run that saved it, or train afresh without --resume",
            flag_of(*field)
        ),
        CheckpointError::Corrupt { .. } => {
            "delete that step folder to resume from the checkpoint before it".into()
        }
        CheckpointError::NoCheckpoint { .. } => {
            "give the --checkpoint folder of an earlier run".into()
        }
        CheckpointError::NotEmpty { .. } => format!(
            "give --resume {} to continue that run, or an empty folder",
            dir.display()
        ),
        CheckpointError::Io { .. } => "check the path and its permissions".into(),
        CheckpointError::Busy { .. } => {
            "wait for that run to end, or give another --checkpoint folder".into()
        }
        _ => "check the folder, or train afresh without --resume".into(),
    };
    CliError::Usage(format!("{flag} `{}`: {e}; {fix}", dir.display()))
}

/// Checks the checkpoint flags, makes the `--checkpoint` folder and loads the `--resume`
/// checkpoint, refusing one that does not fit this run.
pub fn prepare(setup: &Setup) -> Result<Option<Resume>, CliError> {
    let c = &setup.args.checkpoint;
    if c.checkpoint_every == Some(0) {
        return Err(CliError::Usage(
            "--checkpoint-every must be at least 1 (steps between checkpoints)".into(),
        ));
    }
    let resume = match &c.resume {
        Some(dir) => Some(load(setup, dir)?),
        None => None,
    };
    if let Some(dir) = &c.checkpoint {
        check_target(dir, resume.as_ref())?;
    }
    Ok(resume)
}

/// The `--checkpoint` folder exists (made here) and holds no other run's checkpoints.
fn check_target(dir: &Path, resume: Option<&Resume>) -> Result<(), CliError> {
    let flag = "--checkpoint";
    std::fs::create_dir_all(dir)
        .map_err(|e| refuse(flag, dir, CheckpointError::io("create", dir)(e)))?;
    // Writable now, not only at the first save (a read-only folder would cost the steps before it).
    let probe = dir.join(format!(".write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .map_err(|e| refuse(flag, dir, CheckpointError::io("write in", dir)(e)))?;
    let _ = std::fs::remove_file(&probe);
    let same = |r: &Resume| same_folder(dir, &r.dir);
    if resume.is_some_and(same) {
        return Ok(());
    }
    match store::latest(dir).map_err(|e| refuse(flag, dir, e))? {
        Some((_, m)) => Err(refuse(
            flag,
            dir,
            CheckpointError::NotEmpty {
                dir: dir.to_path_buf(),
                step: m.step,
            },
        )),
        None => Ok(()),
    }
}

/// Whether two paths name the same folder.
fn same_folder(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The latest complete checkpoint in `dir`, checked against the run and read whole.
fn load(setup: &Setup, dir: &Path) -> Result<Resume, CliError> {
    let flag = "--resume";
    let a = &setup.args;
    let (folder, manifest) = store::latest(dir)
        .map_err(|e| refuse(flag, dir, e))?
        .ok_or_else(|| {
            let dir = dir.to_path_buf();
            refuse(flag, &dir.clone(), CheckpointError::NoCheckpoint { dir })
        })?;
    let uniform = (a.plan == TrainPlan::Uniform).then(|| {
        let stages = manifest.plan.schedule.stages();
        pipefill_host::cost::split_even(setup.spec.layers.len(), stages).unwrap_or_default()
    });
    let run = RunIdentity {
        spec: &setup.spec,
        ranks: a.ranks,
        microbatches: a.microbatches,
        chunks: a.chunks,
        schedule: a.schedule.as_deref(),
        given: setup.schedule_file.as_ref(),
        partition: uniform.as_deref(),
        seed: a.seed,
        optimizer: setup.optimizer,
        activations: a.numerics.activations()?,
    };
    manifest.check_run(&run).map_err(|e| refuse(flag, dir, e))?;
    if manifest.step as usize >= a.steps {
        return Err(CliError::Usage(format!(
            "--steps {}: the checkpoint in `{}` has trained {} steps already; give --steps above {}",
            a.steps,
            dir.display(),
            manifest.step,
            manifest.step
        )));
    }
    let ranks = store::load_ranks(&folder, &manifest).map_err(|e| refuse(flag, dir, e))?;
    Ok(Resume {
        dir: dir.to_path_buf(),
        folder,
        manifest,
        ranks,
    })
}

/// Puts the resumed state into freshly built `stages` (any misfit is a corrupt checkpoint, exit 2).
pub fn restore(
    r: &Resume,
    plan: &Plan,
    stages: &mut [(usize, LinearStage)],
) -> Result<(), CliError> {
    let stages = stages.iter_mut().map(|(s, st)| (*s, st)).collect();
    checkpoint::restore_some(&r.folder, r.ranks.clone(), &plan.schedule, stages)
        .map_err(|e| refuse("--resume", &r.dir, e))
}

/// Takes the lock of the `--checkpoint` folder `dir` (exit 2, naming the folder, when another run
/// holds it): held until the returned lock is dropped or the process ends in any way.
pub fn lock_folder(dir: &Path) -> Result<store::FolderLock, CliError> {
    store::FolderLock::take(dir).map_err(|e| refuse("--checkpoint", dir, e))
}

/// The saver of this run's checkpoints ([`crate::trainer::Saver`]), or `None` without
/// `--checkpoint` (the run holds the folder's lock: [`lock_folder`]).
pub fn saver(setup: &Setup, plan: &Plan) -> Option<Saver> {
    let a = &setup.args;
    let dir = a.checkpoint.checkpoint.clone()?;
    let base = base_manifest(&setup.spec, a, setup.optimizer, plan);
    Some(Saver::new(
        dir,
        a.checkpoint.checkpoint_every,
        a.steps,
        base,
    ))
}

/// The manifest of this run, without step and files.
fn base_manifest(spec: &ModelSpec, a: &Args, optimizer: Optimizer, plan: &Plan) -> Manifest {
    Manifest {
        format: FORMAT.into(),
        version: FORMAT_VERSION,
        step: 0,
        seed: a.seed,
        model: ModelShape::of(spec),
        optimizer: optimizer.name().into(),
        lr: learning_rate(&optimizer),
        // Checked at setup (the default, f32, is never taken here).
        activations: a.numerics.activations().unwrap_or_default().to_string(),
        plan: plan.clone(),
        files: Vec::new(),
    }
}
