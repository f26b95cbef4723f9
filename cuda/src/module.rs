//! Loading the kernels into a context: a cubin assembled ahead of time when one is given and fits,
//! the embedded PTX (compiled by the driver's JIT at load time) otherwise, and the JIT's own logs
//! when a load fails.
//!
//! **The cubin.** `PIPEFILL_CUBIN` ([`CUBIN_VAR`]) may name a cubin assembled with `ptxas` from
//! this binary's PTX for the device's architecture (`scripts/gpu-check.sh build` makes
//! `kernels.sm_90.cubin` for the H200). It is used only when the file `kernels.ptx` beside it is
//! byte for byte the PTX embedded in this binary (the proof that the cubin's kernels are this
//! binary's kernels); otherwise, or when the driver refuses it (another architecture), the
//! embedded PTX is loaded and [`ModuleSource::Ptx`] says why the cubin was not used.
//!
//! **The logs.** cudarc loads with `cuModuleLoadData`, which returns only an error code. When a
//! load fails, [`jit_load`] loads the same image again with `cuModuleLoadDataEx` and the JIT's
//! info and error log buffers, and the error ([`CudaError::ModuleLoad`]) carries what the JIT said.
//! `pipefill device` runs [`jit_load`] on purpose, to print the JIT's report and wall time.

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaModule, DriverError};
use cudarc::nvrtc::Ptx;

use super::error::CudaError;

/// The environment variable that names a cubin to load before the embedded PTX.
pub const CUBIN_VAR: &str = "PIPEFILL_CUBIN";

/// The file that must sit beside the cubin: the PTX it was assembled from.
pub const CUBIN_PTX: &str = "kernels.ptx";

/// Bytes of each JIT log buffer.
const LOG_BYTES: usize = 1 << 16;

/// Which image a context's kernels were loaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleSource {
    /// The cubin named by [`CUBIN_VAR`].
    Cubin(PathBuf),
    /// The embedded PTX, compiled by the driver; `cubin_note` says why a cubin was named but not
    /// used (`None` when none was named).
    Ptx {
        /// Why the named cubin was not used.
        cubin_note: Option<String>,
    },
}

impl std::fmt::Display for ModuleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModuleSource::Cubin(path) => write!(f, "cubin {}", path.display()),
            ModuleSource::Ptx { cubin_note: None } => write!(f, "PTX (JIT-compiled by the driver)"),
            ModuleSource::Ptx {
                cubin_note: Some(note),
            } => write!(
                f,
                "PTX (JIT-compiled by the driver; cubin not used: {note})"
            ),
        }
    }
}

/// What the driver's JIT reported for one load.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JitLog {
    /// The info log (with `CU_JIT_LOG_VERBOSE`: registers and memory per kernel).
    pub info: String,
    /// The error log.
    pub error: String,
    /// The JIT's own wall time in milliseconds (`CU_JIT_WALL_TIME`).
    pub wall_ms: f32,
}

impl JitLog {
    /// Both logs as one text (the error log first), or a note that the JIT said nothing.
    pub fn text(&self) -> String {
        match (self.error.trim(), self.info.trim()) {
            ("", "") => "(the JIT wrote no log)".into(),
            (e, "") => e.to_string(),
            ("", i) => i.to_string(),
            (e, i) => format!("{e}\n{i}"),
        }
    }
}

/// The cubin named by [`CUBIN_VAR`], when it may be used with `ptx`: `Ok(None)` when none is
/// named, `Err(why not)` when one is named but unusable.
pub fn named_cubin(ptx: &str) -> Result<Option<(PathBuf, Vec<u8>)>, String> {
    let Some(path) = std::env::var_os(CUBIN_VAR).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let path = PathBuf::from(path);
    cubin_for(&path, ptx).map(|bytes| Some((path, bytes)))
}

/// The bytes of the cubin at `path`, when the [`CUBIN_PTX`] beside it is `ptx`.
fn cubin_for(path: &Path, ptx: &str) -> Result<Vec<u8>, String> {
    let beside = path.with_file_name(CUBIN_PTX);
    let source = std::fs::read(&beside).map_err(|e| {
        format!(
            "{CUBIN_VAR}={}: cannot read {} beside it ({e}); a cubin is used only beside the PTX it \
             was assembled from",
            path.display(),
            beside.display()
        )
    })?;
    if source != ptx.as_bytes() {
        return Err(format!(
            "{CUBIN_VAR}={}: {} beside it is not this binary's PTX (assembled from another build)",
            path.display(),
            beside.display()
        ));
    }
    std::fs::read(path).map_err(|e| format!("{CUBIN_VAR}={}: {e}", path.display()))
}

/// Loads the kernels into `ctx`: the named cubin when it fits, else the embedded PTX.
pub fn load(ctx: &Arc<CudaContext>) -> Result<(Arc<CudaModule>, ModuleSource), CudaError> {
    let ptx = crate::ptx::ptx()?;
    let cubin_note = match named_cubin(ptx) {
        Ok(None) => None,
        Err(why) => Some(why),
        Ok(Some((path, bytes))) => match ctx.load_module(Ptx::from_binary(bytes)) {
            Ok(module) => return Ok((module, ModuleSource::Cubin(path))),
            Err(e) => Some(format!("the driver refused {}: {e}", path.display())),
        },
    };
    match ctx.load_module(Ptx::from_src(ptx)) {
        Ok(module) => Ok((module, ModuleSource::Ptx { cubin_note })),
        Err(source) => {
            let log = match CString::new(ptx) {
                Ok(image) => jit_load(ctx, image.as_bytes_with_nul()).1.text(),
                Err(_) => "(the PTX holds a NUL byte)".into(),
            };
            Err(CudaError::ModuleLoad {
                what: "the embedded PTX".into(),
                source,
                log,
            })
        }
    }
}

/// Loads `image` (a NUL-terminated PTX text, or a cubin) into `ctx` with the JIT's logs on
/// (`cuModuleLoadDataEx` with info and error log buffers, verbose), then unloads it: the load's
/// result and what the JIT said. A diagnostic: the kernels are used through [`load`].
pub fn jit_load(ctx: &Arc<CudaContext>, image: &[u8]) -> (Result<(), DriverError>, JitLog) {
    if let Err(e) = ctx.bind_to_thread() {
        return (Err(e), JitLog::default());
    }
    let mut info = vec![0u8; LOG_BYTES];
    let mut error = vec![0u8; LOG_BYTES];
    let mut wall_ms: f32 = 0.0;
    use sys::CUjit_option as O;
    let mut options = [
        O::CU_JIT_INFO_LOG_BUFFER,
        O::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        O::CU_JIT_ERROR_LOG_BUFFER,
        O::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        O::CU_JIT_LOG_VERBOSE,
        O::CU_JIT_WALL_TIME,
    ];
    // Option values are passed as pointer-sized words: buffers by address, sizes and flags by
    // value; the wall time is written back into the word itself as a float.
    let mut values: [*mut c_void; 6] = [
        info.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(LOG_BYTES),
        error.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(LOG_BYTES),
        std::ptr::without_provenance_mut(1),
        std::ptr::null_mut(),
    ];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `image` outlives the call; the option and value arrays have the same length and
    // every buffer is as long as its size option says.
    let result = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            image.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    }
    .result();
    if result.is_ok() {
        let word = values[5] as usize;
        wall_ms = f32::from_bits(word as u32);
        // SAFETY: the module was just loaded into the current context and is not used again.
        let _ = unsafe { sys::cuModuleUnload(module) };
    }
    let log = JitLog {
        info: c_text(&info),
        error: c_text(&error),
        wall_ms,
    };
    (result, log)
}

/// The text of a NUL-terminated log buffer.
fn c_text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cubin_is_used_only_beside_this_binarys_ptx() {
        let dir = std::env::temp_dir().join(format!("pipefill-cubin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cubin = dir.join("kernels.sm_90.cubin");
        std::fs::write(&cubin, b"\x7fELF cubin bytes").unwrap();
        let missing = cubin_for(&cubin, "ptx text").unwrap_err();
        assert!(missing.contains("kernels.ptx"), "{missing}");
        std::fs::write(dir.join(CUBIN_PTX), "other ptx").unwrap();
        let other = cubin_for(&cubin, "ptx text").unwrap_err();
        assert!(other.contains("not this binary's PTX"), "{other}");
        std::fs::write(dir.join(CUBIN_PTX), "ptx text").unwrap();
        assert_eq!(
            cubin_for(&cubin, "ptx text").unwrap(),
            b"\x7fELF cubin bytes"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_log_buffer_ends_at_its_nul() {
        assert_eq!(
            c_text(b"ptxas info: 40 registers\n\0garbage"),
            "ptxas info: 40 registers"
        );
        assert_eq!(c_text(b"\0\0"), "");
        let both = JitLog {
            info: "i".into(),
            error: "e".into(),
            wall_ms: 0.0,
        };
        assert_eq!(both.text(), "e\ni");
        assert_eq!(JitLog::default().text(), "(the JIT wrote no log)");
    }
}
