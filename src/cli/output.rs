//! Writing output files safely: a temporary file in the same folder, then a rename, so a reader
//! never sees a half-written file and a failed run leaves the old file (or none) in place.

use std::fs;
use std::io::Write;
use std::path::Path;

use super::CliError;

/// Writes `contents` to `path` atomically (temp file + rename in the same folder).
///
/// Errors are [`CliError::Usage`] naming the path: the usual causes (missing folder, no permission)
/// are fixed by the user choosing another `--out`.
pub fn write_atomic(path: &Path, contents: &str) -> Result<(), CliError> {
    let fail = |what: &str, e: std::io::Error| {
        CliError::Usage(format!(
            "cannot {what} `{}`: {e}; check the --out path",
            path.display()
        ))
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| CliError::Usage(format!("--out `{}` is not a file path", path.display())))?;
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
            fs::File::create(&tmp).map_err(|e| fail("create a temporary file next to", e))?;
        f.write_all(contents.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| fail("write", e))?;
        fs::rename(&tmp, path).map_err(|e| fail("replace", e))
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
        write_atomic(&p, "one").unwrap();
        write_atomic(&p, "two").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        let missing = dir.join("no/such/dir/x.json");
        assert!(matches!(
            write_atomic(&missing, "x"),
            Err(CliError::Usage(_))
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}
