//! Writing output files safely: a temporary file in the same folder, then a rename, so a reader
//! never sees a half-written file and a failed run leaves the old file (or none) in place.

use std::fs;
use std::io::Write;
use std::path::Path;

use super::CliError;

/// Writes `contents` to `path` atomically (temp file + rename in the same folder).
///
/// `flag` names the option the path came from (`--out`, `--svg`, `--trace`): errors are
/// [`CliError::Usage`] naming it and the path, since the usual causes (missing folder, no permission)
/// are fixed by the user choosing another path.
pub fn write_atomic(flag: &str, path: &Path, contents: impl AsRef<[u8]>) -> Result<(), CliError> {
    let fail = |what: &str, e: std::io::Error| {
        CliError::Usage(format!(
            "{flag}: cannot write `{}` ({what}): {e}; check that the folder exists and is writable",
            path.display()
        ))
    };
    let file_name = path.file_name().ok_or_else(|| {
        CliError::Usage(format!("{flag} `{}` is not a file path", path.display()))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f =
            fs::File::create(&tmp).map_err(|e| fail("creating a temporary file beside it", e))?;
        f.write_all(contents.as_ref())
            .and_then(|()| f.sync_all())
            .map_err(|e| fail("writing", e))?;
        fs::rename(&tmp, path).map_err(|e| fail("renaming the temporary file onto it", e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
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
}
