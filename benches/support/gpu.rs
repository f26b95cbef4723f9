//! The convention for benches that need a GPU: call [`gpu_or_skip`] first. Without a CUDA driver
//! and device it prints the GPU tests' skip line (`skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1
//! to fail instead)`) with the reason and exits with status 0, so a
//! `cargo bench` on a machine without a GPU passes; with `PIPEFILL_REQUIRE_GPU=1` (a GPU runner in
//! CI) it fails with status 1 instead.
//!
//! The driver is found by loading `libcuda.so.1` at run time, so the benches build anywhere. Root
//! crate benches only (it uses `libc`, which `pipefill-host` does not depend on): include it with
//! `#[path = "support/gpu.rs"] mod gpu;`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// `CUresult (*)(unsigned int)`.
type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
/// `CUresult (*)(int *)`.
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;

/// A loaded CUDA driver with at least one device.
pub struct Driver {
    handle: *mut c_void,
    /// Devices the driver reports.
    pub devices: usize,
}

impl Driver {
    /// The driver function `name` (a NUL-terminated C string), or `None` if it does not export it.
    ///
    /// # Safety
    /// `T` must be the function's exact C signature.
    pub unsafe fn symbol<T: Copy>(&self, name: &CStr) -> Option<T> {
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        let p = libc::dlsym(self.handle, name.as_ptr());
        (!p.is_null()).then(|| std::mem::transmute_copy(&p))
    }
}

/// Loads the CUDA driver and counts its devices; the error says what is missing.
#[cfg(unix)]
pub fn probe() -> Result<Driver, String> {
    let mut handle = std::ptr::null_mut();
    for lib in [c"libcuda.so.1", c"libcuda.so"] {
        // SAFETY: dlopen with a valid C string; the handle is never closed (the bench keeps it).
        handle = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            break;
        }
    }
    if handle.is_null() {
        return Err(format!("no CUDA driver found ({})", dl_error()));
    }
    let driver = Driver { handle, devices: 0 };
    // SAFETY: the signatures are the CUDA driver API's (cuda.h).
    let (init, count) = unsafe {
        (
            driver.symbol::<CuInit>(c"cuInit"),
            driver.symbol::<CuDeviceGetCount>(c"cuDeviceGetCount"),
        )
    };
    let (Some(init), Some(count)) = (init, count) else {
        return Err("no CUDA driver found (libcuda lacks cuInit or cuDeviceGetCount)".into());
    };
    // SAFETY: plain driver calls with a valid out pointer.
    let rc = unsafe { init(0) };
    if rc != 0 {
        return Err(format!(
            "no CUDA driver found (cuInit failed with CUresult {rc})"
        ));
    }
    let mut n: c_int = 0;
    // SAFETY: as above.
    let rc = unsafe { count(&mut n) };
    if rc != 0 || n <= 0 {
        return Err(format!(
            "no CUDA device found (cuDeviceGetCount: CUresult {rc}, {n} devices)"
        ));
    }
    Ok(Driver {
        devices: n as usize,
        ..driver
    })
}

/// Loads the CUDA driver and counts its devices; the error says what is missing.
#[cfg(not(unix))]
pub fn probe() -> Result<Driver, String> {
    Err("no CUDA driver found (the benches look for it only on Unix)".into())
}

#[cfg(unix)]
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a C string valid until the next dl call on this thread.
    let e: *const c_char = unsafe { libc::dlerror() };
    if e.is_null() {
        "libcuda.so.1 not found".into()
    } else {
        // SAFETY: non-null, NUL-terminated, read before any other dl call.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The driver, or the end of the process: the shared skip line (`pipefill::cuda::SKIP_LINE`, as
/// the GPU tests print it) and status 0, or with `PIPEFILL_REQUIRE_GPU=1` an error and status 1.
pub fn gpu_or_skip(bench: &str) -> Driver {
    use pipefill::cuda::skip::{gpu_required, REQUIRE_GPU_VAR, SKIP_LINE};
    match probe() {
        Ok(d) => d,
        Err(why) => {
            let required = std::env::var(REQUIRE_GPU_VAR).ok();
            if gpu_required(required.as_deref()) {
                eprintln!(
                    "error: bench {bench}: {why}, and {REQUIRE_GPU_VAR}=1 asks for a GPU: \
                     run on a machine with the NVIDIA driver, or unset {REQUIRE_GPU_VAR}"
                );
                std::process::exit(1);
            }
            println!("{SKIP_LINE}\n  ({bench}: {why})");
            std::process::exit(0);
        }
    }
}
