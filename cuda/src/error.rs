//! [`CudaError`]: everything the CUDA backend can report, typed, with the fields a caller matches on.

use cudarc::driver::DriverError;

use crate::ptx::PtxError;

/// Why the CUDA backend could not do what it was asked.
///
/// The first two are the "not here" answers a caller turns into "use the CPU" (`--backend auto`) or
/// into a usage error (`--backend cuda` on a machine without a GPU): see [`CudaError::is_unavailable`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The NVIDIA driver library (`libcuda.so.1`) cannot be loaded.
    #[error("no CUDA driver found: libcuda.so.1 cannot be loaded (install the NVIDIA driver)")]
    NoDriver,
    /// The driver loaded but reports no usable device (`ordinal` is the device asked for).
    #[error("no CUDA device: device {ordinal} is not available (the driver reports {count}{})", .reason.as_deref().map(|r| format!("; {r}")).unwrap_or_default())]
    NoDevice {
        /// The device asked for.
        ordinal: usize,
        /// Devices the driver reports (0 when it could not be asked).
        count: usize,
        /// What the driver said, when it refused.
        reason: Option<String>,
    },
    /// The embedded PTX is missing (the build could not make it).
    #[error("{0}")]
    Ptx(#[from] PtxError),
    /// A CUDA driver call failed.
    #[error("CUDA {op} failed: {source}")]
    Driver {
        /// What was being done (`"launch pf_linear_forward"`, `"memcpy to device"`, ...).
        op: String,
        /// The driver's error code.
        source: DriverError,
    },
    /// The driver could not load the kernels; `log` is what its JIT said
    /// ([`jit_load`](super::module::jit_load)).
    #[error("CUDA could not load {what}: {source}; the JIT's log:\n{log}")]
    ModuleLoad {
        /// The image (`"the embedded PTX"`).
        what: String,
        /// The driver's error code.
        source: DriverError,
        /// The JIT's error and info logs.
        log: String,
    },
    /// A buffer does not have the size a kernel or layer needs.
    #[error("shape mismatch in {what}: expected {expected} values, got {got}")]
    Shape {
        /// Which buffer.
        what: String,
        /// Values it must hold.
        expected: usize,
        /// Values it holds.
        got: usize,
    },
    /// A rank is mapped to a device the multi-device streams were not given (or a stream has no
    /// rank in the map).
    #[error("rank {rank} is mapped to device {device}, but {devices} devices were given")]
    DeviceMap {
        /// The rank.
        rank: usize,
        /// Its device index in the map (`usize::MAX`: the map has no entry for it).
        device: usize,
        /// Devices given.
        devices: usize,
    },
    /// A size does not fit the kernels' 32-bit size arguments.
    #[error("{what} = {value} does not fit a 32-bit kernel argument")]
    TooLarge {
        /// Which size.
        what: &'static str,
        /// Its value.
        value: usize,
    },
}

impl CudaError {
    /// `true` for [`CudaError::NoDriver`] and [`CudaError::NoDevice`]: CUDA is not usable on this
    /// machine at all (as opposed to a failure while using it).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, CudaError::NoDriver | CudaError::NoDevice { .. })
    }

    /// A driver failure while doing `op`.
    pub fn driver(op: impl Into<String>) -> impl FnOnce(DriverError) -> CudaError {
        let op = op.into();
        move |source| CudaError::Driver { op, source }
    }
}

/// `value` as a `u32` kernel argument, or [`CudaError::TooLarge`].
pub fn arg_u32(what: &'static str, value: usize) -> Result<u32, CudaError> {
    u32::try_from(value).map_err(|_| CudaError::TooLarge { what, value })
}
