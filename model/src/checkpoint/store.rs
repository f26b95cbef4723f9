//! The checkpoint folder: `DIR/step-NNNNNNNN/` per checkpoint, holding `rank-R.bin` for each rank
//! and `manifest.json`, written in that order. Every file goes through a temporary file that is
//! synced and renamed into place, then the folder is synced, so after a crash a file is either
//! whole or absent; the manifest comes last, so a folder without one is incomplete and skipped.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::file::{self, RankState};
use super::manifest::{Manifest, RankFile};
use super::CheckpointError;

/// The manifest's file name in a checkpoint folder.
pub const MANIFEST: &str = "manifest.json";

/// The folder of the checkpoint after `step` steps in `dir`.
pub fn step_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:08}"))
}

/// The name of rank `rank`'s file.
pub fn rank_file_name(rank: usize) -> String {
    format!("rank-{rank}.bin")
}

/// Writes `bytes` to `path` atomically and durably: a temporary file beside it, written and
/// synced, renamed onto `path`, then the folder synced.
pub fn write_durable(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let result = (|| {
        let mut f = fs::File::create(&tmp).map_err(CheckpointError::io("create", &tmp))?;
        f.write_all(bytes)
            .map_err(CheckpointError::io("write", &tmp))?;
        f.sync_all().map_err(CheckpointError::io("sync", &tmp))?;
        fs::rename(&tmp, path).map_err(CheckpointError::io("rename into place", path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    sync_dir(dir)
}

/// Syncs a folder, so the names created or renamed in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(CheckpointError::io("sync the folder", dir))
}

/// Writes rank `state.rank`'s file into the checkpoint folder of `state.step` under `dir`
/// (creating the folder) and returns its manifest entry. Each process of a multi-process run calls
/// this for its own rank; [`write_manifest`] comes after all of them.
pub fn write_rank(dir: &Path, state: &RankState) -> Result<RankFile, CheckpointError> {
    let folder = step_dir(dir, state.step);
    fs::create_dir_all(&folder).map_err(CheckpointError::io("create", &folder))?;
    sync_dir(dir)?;
    let bytes = file::encode(state);
    let name = rank_file_name(state.rank);
    write_durable(&folder.join(&name), &bytes)?;
    Ok(RankFile {
        rank: state.rank,
        file: name,
        bytes: bytes.len() as u64,
        checksum: file::fnv1a(&bytes),
    })
}

/// Writes the manifest, which completes the checkpoint of `manifest.step` (its rank files must be
/// written already).
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), CheckpointError> {
    let folder = step_dir(dir, manifest.step);
    let path = folder.join(MANIFEST);
    let text = serde_json::to_string_pretty(manifest).map_err(|e| {
        CheckpointError::corrupt(&path, format!("cannot serialise the manifest: {e}"))
    })?;
    write_durable(&path, text.as_bytes())
}

/// Saves a whole checkpoint from one process: every rank's file, then the manifest
/// (`manifest.files` is filled in here).
pub fn save(
    dir: &Path,
    mut manifest: Manifest,
    ranks: &[RankState],
) -> Result<(), CheckpointError> {
    fs::create_dir_all(dir).map_err(CheckpointError::io("create", dir))?;
    manifest.files = ranks
        .iter()
        .map(|r| write_rank(dir, r))
        .collect::<Result<_, _>>()?;
    write_manifest(dir, &manifest)
}

/// The complete checkpoint with the most steps in `dir` (folder and manifest), or `None` when
/// there is none. Folders without a manifest (a save cut short) are skipped; a manifest that does
/// not parse or check is an error, since manifests are written whole.
pub fn latest(dir: &Path) -> Result<Option<(PathBuf, Manifest)>, CheckpointError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CheckpointError::io("read the folder", dir)(e)),
    };
    let mut steps: Vec<u64> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.parse().ok())
        .collect();
    steps.sort_unstable_by(|a, b| b.cmp(a));
    for step in steps {
        let path = step_dir(dir, step).join(MANIFEST);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(CheckpointError::io("read", &path)(e)),
        };
        let manifest = Manifest::parse(&text, &path)?;
        if manifest.step != step {
            return Err(CheckpointError::corrupt(
                &path,
                format!("it says step {}, its folder step {step}", manifest.step),
            ));
        }
        return Ok(Some((step_dir(dir, step), manifest)));
    }
    Ok(None)
}

/// Reads and checks every rank file of the checkpoint in `folder` against its manifest: length,
/// checksum, rank and step.
pub fn load_ranks(folder: &Path, manifest: &Manifest) -> Result<Vec<RankState>, CheckpointError> {
    manifest
        .files
        .iter()
        .map(|f| {
            let path = folder.join(&f.file);
            // Its kind and length first: a FIFO or a device would never end, a huge file would be
            // read whole before the length check.
            let meta = fs::symlink_metadata(&path).map_err(CheckpointError::io("read", &path))?;
            if !meta.is_file() {
                return Err(CheckpointError::corrupt(&path, "not a regular file"));
            }
            if meta.len() != f.bytes {
                return Err(CheckpointError::corrupt(
                    &path,
                    format!("{} bytes, its manifest says {}", meta.len(), f.bytes),
                ));
            }
            let bytes = fs::read(&path).map_err(CheckpointError::io("read", &path))?;
            if bytes.len() as u64 != f.bytes {
                return Err(CheckpointError::corrupt(
                    &path,
                    format!("{} bytes, its manifest says {}", bytes.len(), f.bytes),
                ));
            }
            if file::fnv1a(&bytes) != f.checksum {
                return Err(CheckpointError::corrupt(
                    &path,
                    "checksum differs from its manifest's",
                ));
            }
            let state = file::decode(&bytes, &path)?;
            if (state.rank, state.step) != (f.rank, manifest.step) {
                return Err(CheckpointError::corrupt(
                    &path,
                    format!(
                        "it holds rank {} at step {}, its manifest says rank {} at step {}",
                        state.rank, state.step, f.rank, manifest.step
                    ),
                ));
            }
            Ok(state)
        })
        .collect()
}

/// The lock file a run holds in its `--checkpoint` folder.
pub const LOCK: &str = ".lock";

/// A held lock on a checkpoint folder: one writer at a time. The lock is the operating system's
/// (`flock` on `DIR/.lock`), so it is released when the holder ends in any way, a crash or a kill
/// included, and a stale lock file never blocks a later run.
#[derive(Debug)]
pub struct FolderLock {
    _file: fs::File,
}

impl FolderLock {
    /// Takes the lock on `dir` (made if missing), or [`CheckpointError::Busy`] when another
    /// process holds it. Where the platform has no `flock`, the lock is not taken (always `Ok`).
    pub fn take(dir: &Path) -> Result<FolderLock, CheckpointError> {
        fs::create_dir_all(dir).map_err(CheckpointError::io("create", dir))?;
        let path = dir.join(LOCK);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(CheckpointError::io("open", &path))?;
        #[cfg(unix)]
        {
            use std::os::unix::io::AsRawFd;
            // SAFETY: a valid open descriptor; LOCK_NB makes the call return at once.
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    return Err(CheckpointError::Busy {
                        dir: dir.to_path_buf(),
                    });
                }
                return Err(CheckpointError::io("lock", &path)(e));
            }
        }
        Ok(FolderLock { _file: file })
    }
}
