//! What the CUDA backend finds on this machine, for `pipefill device` and the GPU check's first
//! steps: the driver, every device (name, architecture, memory, compute mode), NCCL's version, the
//! path of every CUDA library the process actually loaded, and a load of the kernels with the
//! JIT's own report (wall time, info and error logs) plus each kernel's registers and memory.
//!
//! [`inspect`] fails only when there is no driver or no device ([`CudaError::is_unavailable`]); a
//! module that does not load is reported in [`ModuleReport::load_error`] with the JIT's log, so
//! the caller can print everything found before giving up.

use std::ffi::CString;

use cudarc::driver::sys;
use serde::Serialize;

use super::device::{device_count, Gpu};
use super::error::CudaError;
use super::module::{jit_load, named_cubin, ModuleSource};
use crate::ptx::entry;

/// Everything [`inspect`] found.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// The driver's CUDA version (`cuDriverGetVersion`), as `major.minor`.
    pub driver_cuda_version: String,
    /// Every device the driver reports.
    pub devices: Vec<DeviceEntry>,
    /// NCCL's version (`ncclGetVersion`, `major.minor.patch`); `None` when NCCL is not usable.
    pub nccl_version: Option<String>,
    /// Why NCCL is not usable (`None` when it is).
    pub nccl_note: Option<String>,
    /// The CUDA libraries mapped into this process, by path (`/proc/self/maps`).
    pub libraries: Vec<String>,
    /// The kernels loaded on device 0.
    pub module: ModuleReport,
}

/// One device.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceEntry {
    /// Its ordinal.
    pub ordinal: usize,
    /// Its name.
    pub name: String,
    /// Compute capability `[major, minor]`.
    pub capability: [i32; 2],
    /// Device memory in bytes.
    pub memory_bytes: usize,
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// `default`, `exclusive-process` or `prohibited` (`CU_DEVICE_ATTRIBUTE_COMPUTE_MODE`).
    pub compute_mode: String,
}

/// The kernels' load on device 0.
#[derive(Debug, Clone, Serialize)]
pub struct ModuleReport {
    /// The image the backend loads ([`ModuleSource`], as text).
    pub source: String,
    /// The JIT's wall time for that image, in milliseconds.
    pub jit_wall_ms: f32,
    /// The JIT's info log (verbose).
    pub jit_info_log: String,
    /// The JIT's error log.
    pub jit_error_log: String,
    /// Why the module could not be loaded (`None`: it loaded).
    pub load_error: Option<String>,
    /// Each kernel's resources, as the driver reports them for the loaded module.
    pub kernels: Vec<KernelEntry>,
}

/// One kernel's resources (`cuFuncGetAttribute`).
#[derive(Debug, Clone, Serialize)]
pub struct KernelEntry {
    /// The entry point.
    pub name: &'static str,
    /// Registers per thread.
    pub registers: i32,
    /// Static shared memory in bytes.
    pub static_shared_bytes: i32,
    /// Local memory (stack, spills) per thread in bytes.
    pub local_bytes: i32,
    /// The most threads a block of it may have.
    pub max_threads_per_block: i32,
}

/// Inspects the driver, the devices, NCCL and device 0's load of the kernels.
pub fn inspect() -> Result<DeviceReport, CudaError> {
    let count = device_count()?;
    let gpu = Gpu::open(0)?;
    let mut version = 0;
    // SAFETY: an out-pointer to a live `c_int`; the driver is loaded (device_count succeeded).
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(CudaError::driver("cuDriverGetVersion"))?;
    let devices = (0..count).map(device_entry).collect::<Result<_, _>>()?;
    let module = module_report(&gpu);
    let (nccl_version, nccl_note) = match nccl_version() {
        Ok(v) => (Some(v), None),
        Err(why) => (None, Some(why)),
    };
    Ok(DeviceReport {
        driver_cuda_version: format!("{}.{}", version / 1000, (version % 1000) / 10),
        devices,
        nccl_version,
        nccl_note,
        libraries: mapped_libraries(),
        module,
    })
}

fn device_entry(ordinal: usize) -> Result<DeviceEntry, CudaError> {
    let ordinal_i32 = i32::try_from(ordinal).map_err(|_| CudaError::TooLarge {
        what: "device ordinal",
        value: ordinal,
    })?;
    let mut dev = 0;
    // SAFETY: an out-pointer to a live device handle; `ordinal` is below the device count.
    unsafe { sys::cuDeviceGet(&mut dev, ordinal_i32) }
        .result()
        .map_err(CudaError::driver("cuDeviceGet"))?;
    let attribute = |a: sys::CUdevice_attribute| -> Result<i32, CudaError> {
        let mut v = 0;
        // SAFETY: a valid device handle and an out-pointer to a live `c_int`.
        unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) }
            .result()
            .map_err(CudaError::driver("cuDeviceGetAttribute"))?;
        Ok(v)
    };
    use sys::CUdevice_attribute as A;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer is as long as the length passed.
    unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) }
        .result()
        .map_err(CudaError::driver("cuDeviceGetName"))?;
    // SAFETY: the driver wrote a NUL-terminated name into the buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    let mut memory_bytes = 0;
    // SAFETY: a valid device handle and an out-pointer to a live `usize`.
    unsafe { sys::cuDeviceTotalMem_v2(&mut memory_bytes, dev) }
        .result()
        .map_err(CudaError::driver("cuDeviceTotalMem"))?;
    Ok(DeviceEntry {
        ordinal,
        name: name.to_string_lossy().into_owned(),
        capability: [
            attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ],
        memory_bytes,
        multiprocessors: attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        compute_mode: compute_mode(attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)?),
    })
}

/// The name of a `CUcomputemode` value.
fn compute_mode(mode: i32) -> String {
    match mode {
        0 => "default".into(),
        2 => "prohibited".into(),
        3 => "exclusive-process".into(),
        other => format!("unknown ({other})"),
    }
}

/// The JIT's report for the image [`Gpu::module`] loads, then that load and each kernel.
fn module_report(gpu: &Gpu) -> ModuleReport {
    let mut report = ModuleReport {
        source: String::new(),
        jit_wall_ms: 0.0,
        jit_info_log: String::new(),
        jit_error_log: String::new(),
        load_error: None,
        kernels: Vec::new(),
    };
    let ptx = match crate::ptx::ptx() {
        Ok(p) => p,
        Err(e) => {
            report.load_error = Some(e.to_string());
            return report;
        }
    };
    let image = match named_cubin(ptx) {
        Ok(Some((_, bytes))) => bytes,
        _ => CString::new(ptx)
            .map(CString::into_bytes_with_nul)
            .unwrap_or_default(),
    };
    let (_, log) = jit_load(gpu.context(), &image);
    report.jit_wall_ms = log.wall_ms;
    report.jit_info_log = log.info;
    report.jit_error_log = log.error;
    match gpu.module_source() {
        Ok(source) => report.source = source.to_string(),
        Err(e) => {
            report.source = ModuleSource::Ptx { cubin_note: None }.to_string();
            report.load_error = Some(e.to_string());
            return report;
        }
    }
    for name in entry::ALL {
        match kernel_entry(gpu, name) {
            Ok(k) => report.kernels.push(k),
            Err(e) => {
                report.load_error = Some(format!("kernel {name}: {e}"));
                break;
            }
        }
    }
    report
}

fn kernel_entry(gpu: &Gpu, name: &'static str) -> Result<KernelEntry, CudaError> {
    let f = gpu.function(name)?;
    let attribute = |a: sys::CUfunction_attribute| -> Result<i32, CudaError> {
        let mut v = 0;
        // SAFETY: a function of a loaded module and an out-pointer to a live `c_int`.
        unsafe { sys::cuFuncGetAttribute(&mut v, a, f.cu_function()) }
            .result()
            .map_err(CudaError::driver(format!("cuFuncGetAttribute {name}")))?;
        Ok(v)
    };
    use sys::CUfunction_attribute as A;
    Ok(KernelEntry {
        name,
        registers: attribute(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
        static_shared_bytes: attribute(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        local_bytes: attribute(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        max_threads_per_block: attribute(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
    })
}

/// NCCL's version as `major.minor.patch`, or why it cannot be had.
fn nccl_version() -> Result<String, String> {
    if !super::nccl::nccl_present() {
        return Err(super::nccl::NcclError::NoLibrary.to_string());
    }
    let mut v = 0;
    // SAFETY: libnccl is present (checked above); an out-pointer to a live `c_int`.
    let r = unsafe { cudarc::nccl::sys::ncclGetVersion(&mut v) };
    if r != cudarc::nccl::sys::ncclResult_t::ncclSuccess {
        return Err(format!("ncclGetVersion failed: {r:?}"));
    }
    Ok(crate::nccl::version_name(v))
}

/// The CUDA and NCCL libraries mapped into this process, by path.
fn mapped_libraries() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    cuda_libraries(&maps)
}

/// The paths of the CUDA libraries in a `/proc/<pid>/maps` text, each once, in order.
fn cuda_libraries(maps: &str) -> Vec<String> {
    const NAMES: [&str; 6] = [
        "libcuda.so",
        "libnccl.so",
        "libcublas.so",
        "libcublasLt.so",
        "libnvrtc.so",
        "libcudart.so",
    ];
    let mut found: Vec<String> = Vec::new();
    for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
        let file = path.rsplit('/').next().unwrap_or(path);
        if NAMES.iter().any(|n| file.starts_with(n)) && !found.iter().any(|f| f == path) {
            found.push(path.to_string());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cuda_libraries_are_listed_once_each() {
        let maps = "\
7f00-7f01 r--p 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159
7f01-7f02 r-xp 00001000 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159
7f02-7f03 r--p 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6
7f03-7f04 r--p 00000000 08:01 3 /opt/py/nvidia/nccl/lib/libnccl.so.2
7f04-7f05 rw-p 00000000 00:00 0
7f05-7f06 r--p 00000000 08:01 4 /opt/py/nvidia/cublas/lib/libcublasLt.so.13
";
        assert_eq!(
            cuda_libraries(maps),
            [
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159",
                "/opt/py/nvidia/nccl/lib/libnccl.so.2",
                "/opt/py/nvidia/cublas/lib/libcublasLt.so.13",
            ]
        );
        assert_eq!(compute_mode(3), "exclusive-process");
    }
}
