//! Writing output files safely: a temporary file in the same folder, then a rename, so a reader
//! never sees a half-written file and a failed run leaves the old file (or none) in place.
//!
//! Only regular files are replaced that way. A path that is a symlink is followed (the file it
//! points at is replaced, the link stays); a device, FIFO or socket (`/dev/null`, `/dev/stdout`, a
//! shell's `>(...)`) is written through, never renamed over; a folder is refused. [`check_output`]
//! makes the same decisions before any work, so a bad output path is refused before a run spends
//! its time. Temporary files left by a process that died (interrupted) are removed by the next
//! write of the same file.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::CliError;

/// What is at an output path, after following symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Nothing yet: written through a temporary file and a rename.
    Absent,
    /// A regular file: replaced through a temporary file and a rename.
    Regular,
    /// A device, FIFO or socket: written through, never replaced.
    Special,
}

/// The path to write and what is there: symlinks followed, folders refused.
fn resolve(flag: &str, path: &Path) -> Result<(PathBuf, Target), CliError> {
    let folder = || {
        CliError::Usage(format!(
            "{flag} `{}` is a folder; give a file path, e.g. `{}`",
            path.display(),
            path.join("out.txt").display()
        ))
    };
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((path.to_path_buf(), Target::Absent))
        }
        Err(e) => {
            return Err(CliError::Usage(format!(
                "{flag}: cannot look at `{}`: {e}",
                path.display()
            )))
        }
    };
    if meta.file_type().is_symlink() {
        return match fs::canonicalize(path) {
            Ok(real) => resolve(flag, &real),
            // A dangling link: write the file it names.
            Err(_) => {
                let to = fs::read_link(path).map_err(|e| {
                    CliError::Usage(format!(
                        "{flag}: cannot read the link `{}`: {e}",
                        path.display()
                    ))
                })?;
                let to = match path.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
                Ok((to, Target::Absent))
            }
        };
    }
    if meta.is_dir() {
        Err(folder())
    } else if meta.is_file() {
        Ok((path.to_path_buf(), Target::Regular))
    } else {
        Ok((path.to_path_buf(), Target::Special))
    }
}

/// The folder a file path lives in (`.` for a bare file name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Checks, before any work, that `path` can be written by [`write_atomic`]: not a folder, its
/// folder existing and writable (a temporary file is made and removed there). A device or FIFO is
/// not opened (a FIFO would wait for its reader).
pub fn check_output(flag: &str, path: &Path) -> Result<(), CliError> {
    let (real, target) = resolve(flag, path)?;
    if target == Target::Special {
        return Ok(());
    }
    let probe = temp_path(flag, &real)?;
    fs::File::create(&probe).map_err(|e| {
        CliError::Usage(format!(
            "{flag}: cannot write `{}`: {e}; check that the folder `{}` exists and is writable",
            path.display(),
            folder_of(&real).display()
        ))
    })?;
    let _ = fs::remove_file(&probe);
    Ok(())
}

/// The temporary file beside `path` for this process.
fn temp_path(flag: &str, path: &Path) -> Result<PathBuf, CliError> {
    let file_name = path.file_name().ok_or_else(|| {
        CliError::Usage(format!("{flag} `{}` is not a file path", path.display()))
    })?;
    Ok(folder_of(path).join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    )))
}

/// Removes the temporary files of `path` left by processes that no longer run (an interrupted
/// write). Only where `/proc` tells which processes run; elsewhere it leaves them.
fn remove_stale_temps(path: &Path) {
    let (Some(name), true) = (path.file_name(), Path::new("/proc/self").exists()) else {
        return;
    };
    let prefix = format!(".{}.tmp-", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(folder_of(path)) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(pid) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else {
            continue;
        };
        let alive = pid
            .parse::<u32>()
            .map(|p| Path::new(&format!("/proc/{p}")).exists());
        if alive == Ok(false) && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Writes `contents` to `path`: atomically (temp file + rename in the same folder) for a regular
/// or new file, through the symlink to the file it names, directly into a device or FIFO.
///
/// `flag` names the option the path came from (`--out`, `--svg`, `--trace`): errors are
/// [`CliError::Usage`] naming it and the path, since the usual causes (missing folder, no permission)
/// are fixed by the user choosing another path.
pub fn write_atomic(flag: &str, path: &Path, contents: impl AsRef<[u8]>) -> Result<(), CliError> {
    write_atomic_with(flag, path, |w| w.write_all(contents.as_ref()))
}

/// [`write_atomic`] of what `write` writes, streamed (buffered) into the file: nothing of it is
/// held in memory at once. The file appears (renamed) only when `write` succeeded.
pub fn write_atomic_with(
    flag: &str,
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), CliError> {
    let fail = |what: &str, e: std::io::Error| {
        CliError::Usage(format!(
            "{flag}: cannot write `{}` ({what}): {e}; check that the folder exists and is writable",
            path.display()
        ))
    };
    let (real, target) = resolve(flag, path)?;
    if target == Target::Special {
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&real)
            .map_err(|e| fail("opening it for writing", e))?;
        let mut w = std::io::BufWriter::new(f);
        return write(&mut w)
            .and_then(|()| w.flush())
            .map_err(|e| fail("writing", e));
    }
    remove_stale_temps(&real);
    let tmp = temp_path(flag, &real)?;
    let result = (|| {
        let f =
            fs::File::create(&tmp).map_err(|e| fail("creating a temporary file beside it", e))?;
        let mut w = std::io::BufWriter::new(f);
        write(&mut w)
            .and_then(|()| w.flush())
            .and_then(|()| w.get_ref().sync_all())
            .map_err(|e| fail("writing", e))?;
        fs::rename(&tmp, &real).map_err(|e| fail("renaming the temporary file onto it", e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Streams what `write` writes to `--out`'s file `path` ([`write_atomic_with`]) or, without one, to
/// standard output (buffered). A closed standard output (`| head`) ends the writing quietly.
pub fn write_out(
    path: Option<&Path>,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), CliError> {
    if let Some(path) = path {
        return write_atomic_with("--out", path, write);
    }
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    match write(&mut w).and_then(|()| w.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::Failed(format!("writing standard output: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_replaces_without_leaving_temp_files() {
        let dir = std::env::temp_dir().join(format!("pipefill-out-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.json");
        write_atomic("--out", &p, "one").unwrap();
        write_atomic("--out", &p, "two").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        let missing = dir.join("no/such/dir/x.json");
        assert!(matches!(
            write_atomic("--out", &missing, "x"),
            Err(CliError::Usage(_))
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn devices_are_written_through_links_followed_and_folders_refused() {
        let dir = std::env::temp_dir().join(format!("pipefill-special-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        // A device is written through, never replaced by a regular file.
        write_atomic("--svg", Path::new("/dev/null"), "x").unwrap();
        check_output("--svg", Path::new("/dev/null")).unwrap();
        let null = fs::metadata("/dev/null").unwrap();
        assert!(!null.is_file(), "/dev/null became a regular file");
        // A symlink stays a symlink; the file it names gets the contents.
        let real = dir.join("real.json");
        let link = dir.join("link.json");
        fs::write(&real, "old").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write_atomic("--out", &link, "new").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(&real).unwrap(), "new");
        // A dangling link: the file it names is created.
        let dangling = dir.join("dangling.json");
        std::os::unix::fs::symlink(dir.join("made.json"), &dangling).unwrap();
        write_atomic("--out", &dangling, "made").unwrap();
        assert_eq!(fs::read_to_string(dir.join("made.json")).unwrap(), "made");
        // A folder is refused, before and at writing.
        for r in [
            check_output("--out", &dir),
            write_atomic("--out", &dir, "x"),
        ] {
            let Err(CliError::Usage(e)) = r else {
                panic!("a folder accepted")
            };
            assert!(e.contains("is a folder"), "{e}");
        }
        // A missing folder is found before any work.
        assert!(check_output("--out", &dir.join("no/such/x.json")).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn temporary_files_of_dead_processes_are_removed() {
        let dir = std::env::temp_dir().join(format!("pipefill-stale-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.svg");
        // No process has pid 4194305 (above Linux's pid_max); this process is alive.
        let stale = dir.join(".a.svg.tmp-4194305");
        let live = dir.join(format!(".a.svg.tmp-{}-other", std::process::id()));
        fs::write(&stale, "half").unwrap();
        fs::write(&live, "keep").unwrap();
        write_atomic("--svg", &p, "done").unwrap();
        assert!(!stale.exists(), "the dead process's temporary file stayed");
        assert!(
            live.exists(),
            "a file that is not a dead process's temporary file went"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
