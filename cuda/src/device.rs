//! Device discovery and the per-device state: [`Gpu`] (a context, the embedded PTX loaded once, and
//! the kernels found lazily by name).
//!
//! Every entry point first checks that the driver library can be loaded
//! ([`cudarc::driver::sys::is_culib_present`]): cudarc panics inside its first call otherwise. A
//! machine without the driver gets [`CudaError::NoDriver`], one with the driver and no GPU gets
//! [`CudaError::NoDevice`]; neither ever panics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};

use super::error::CudaError;
use super::module::ModuleSource;

/// What [`probe`] found: the device count and the first device's name and compute capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Devices the driver reports.
    pub count: usize,
    /// Device 0's name.
    pub name: String,
    /// Device 0's compute capability `(major, minor)`.
    pub capability: (i32, i32),
}

/// Whether the CUDA driver library can be loaded (no driver call is made).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library names cudarc would use; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The number of CUDA devices, or why there is none usable.
pub fn device_count() -> Result<usize, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    let count = CudaContext::device_count().map_err(|e| CudaError::NoDevice {
        ordinal: 0,
        count: 0,
        reason: Some(format!("cuInit or cuDeviceGetCount failed: {e}")),
    })?;
    match usize::try_from(count) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(CudaError::NoDevice {
            ordinal: 0,
            count: 0,
            reason: None,
        }),
    }
}

/// Checks that device 0 is usable and describes it.
pub fn probe() -> Result<DeviceInfo, CudaError> {
    let gpu = Gpu::open(0)?;
    let count = device_count()?;
    let ctx = gpu.context();
    Ok(DeviceInfo {
        count,
        name: ctx.name().map_err(CudaError::driver("cuDeviceGetName"))?,
        capability: ctx
            .compute_capability()
            .map_err(CudaError::driver("compute capability"))?,
    })
}

/// One device: its context (event tracking off: the order between streams is the caller's), the
/// embedded PTX module (loaded on first use, once) and the kernels looked up so far.
///
/// [`Gpu::open`] hands out one shared `Gpu` per device for the whole process.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    module: OnceLock<(Arc<CudaModule>, ModuleSource)>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    /// The dynamic shared memory limits raised for this context's kernels.
    shared_limits: super::tc_launch::SharedLimits,
    /// Read-only zeros for [`Gpu::zeros`]: every buffer ever made (a smaller one may still be in use
    /// by enqueued work when a larger one is needed), the largest last.
    zeros: Mutex<Vec<CudaSlice<f32>>>,
}

/// The process's `Gpu` per device ordinal.
static OPENED: Mutex<Vec<(usize, Arc<Gpu>)>> = Mutex::new(Vec::new());

/// The device count, when device `ordinal` is one of the devices; else [`CudaError::NoDevice`].
fn existing(ordinal: usize) -> Result<usize, CudaError> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(CudaError::NoDevice {
            ordinal,
            count,
            reason: None,
        });
    }
    Ok(count)
}

/// The default memory pool of `ctx`'s device, where cudarc's stream-ordered `cuMemAllocAsync`
/// allocates; `None` where the device has no stream-ordered allocation.
fn default_pool(ctx: &CudaContext) -> Result<Option<cudarc::driver::sys::CUmemoryPool>, CudaError> {
    use cudarc::driver::sys;
    if !ctx.has_async_alloc() {
        return Ok(None);
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a valid device handle and an out-pointer to a live pool handle.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .map_err(CudaError::driver("cuDeviceGetDefaultMemPool"))?;
    Ok(Some(pool))
}

/// Sets the release threshold of the device's default memory pool (where cudarc's stream-ordered
/// `cuMemAllocAsync` allocates) to "never": with the driver's default of 0, every synchronize hands
/// the pool's free memory back to the system, so each plain step maps its activations again while
/// a replayed CUDA graph keeps its own, which makes steps slower than they need be and biases the
/// plain-against-graph comparison. Memory freed by a step stays in the pool for the next one; the
/// pool still gives memory back when another allocation on the device needs it.
fn keep_pool_memory(ctx: &CudaContext) -> Result<(), CudaError> {
    use cudarc::driver::sys;
    let Some(pool) = default_pool(ctx)? else {
        return Ok(());
    };
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the attribute takes a `cuuint64_t` value, passed by pointer to a live `u64`.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    }
    .result()
    .map_err(CudaError::driver(
        "cuMemPoolSetAttribute (release threshold)",
    ))
}

impl Gpu {
    /// The device `ordinal`, opened on first use (the same `Arc` afterwards).
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, gpu)) = opened.iter().find(|(o, _)| *o == ordinal) {
            return Ok(gpu.clone());
        }
        let count = existing(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::NoDevice {
            ordinal,
            count,
            reason: Some(format!("creating its context failed: {e}")),
        })?;
        let gpu = Gpu::over(ctx)?;
        opened.push((ordinal, gpu.clone()));
        Ok(gpu)
    }

    /// A new, separate context on device `ordinal` (not the primary one [`Gpu::open`] shares, and
    /// not shared: each call makes another). Memory of one context is not usable by another without
    /// a copy, so two of these on one GPU stand for two devices: how the multi-device path
    /// (`CudaStreams::on_devices`, peer copies) is exercised on a machine with one GPU. Kernels of
    /// different contexts time-slice the GPU rather than run together.
    pub fn open_separate(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        let count = existing(ordinal)?;
        let ctx = CudaContext::new_non_primary(ordinal, 0).map_err(|e| CudaError::NoDevice {
            ordinal,
            count,
            reason: Some(format!("creating a separate context failed: {e}")),
        })?;
        Gpu::over(ctx)
    }

    /// The `Gpu` of a fresh context, with event tracking off and the device's memory pool told to
    /// keep what it has ([`keep_pool_memory`]).
    fn over(ctx: Arc<CudaContext>) -> Result<Arc<Gpu>, CudaError> {
        keep_pool_memory(&ctx)?;
        // SAFETY: done before this context allocates anything; from here on every cross-stream
        // order is made explicit by the caller with events (the stream program), as graph capture
        // requires anyway.
        unsafe { ctx.disable_event_tracking() };
        Ok(Arc::new(Gpu {
            ctx,
            module: OnceLock::new(),
            functions: Mutex::new(HashMap::new()),
            shared_limits: Default::default(),
            zeros: Mutex::new(Vec::new()),
        }))
    }

    /// Lets this context's kernels and copies reach `peer`'s memory directly where the hardware
    /// allows it (`cuDeviceCanAccessPeer`, then `cuCtxEnablePeerAccess`, and `cuMemPoolSetAccess`
    /// on `peer`'s default pool for this device); returns whether direct access is on. Without
    /// it, `cuMemcpyPeerAsync` still copies between the two (staged by the driver). Two contexts of one GPU have nothing to enable (returns `false`).
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<bool, CudaError> {
        let (me, other) = (self.ctx.cu_device(), peer.ctx.cu_device());
        if me == other {
            return Ok(false);
        }
        let mut can = 0;
        // SAFETY: two valid device handles and an out-pointer to a live `c_int`.
        unsafe { cudarc::driver::sys::cuDeviceCanAccessPeer(&mut can, me, other) }
            .result()
            .map_err(CudaError::driver("cuDeviceCanAccessPeer"))?;
        if can == 0 {
            return Ok(false);
        }
        self.ctx
            .bind_to_thread()
            .map_err(CudaError::driver("cuCtxSetCurrent"))?;
        // SAFETY: `peer`'s context is alive (held by `peer`); flags must be 0.
        let r = unsafe { cudarc::driver::sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) };
        use cudarc::driver::sys::cudaError_enum as E;
        match r {
            E::CUDA_SUCCESS | E::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
            other => {
                return Err(CudaError::driver("cuCtxEnablePeerAccess")(
                    cudarc::driver::DriverError(other),
                ))
            }
        }
        peer.share_pool_with(self)?;
        Ok(true)
    }

    /// Lets `other`'s device read and write the allocations of this device's default memory pool
    /// (where cudarc's stream-ordered `cuMemAllocAsync` allocates): pool allocations do not follow
    /// `cuCtxEnablePeerAccess`, only `cuMemPoolSetAccess`.
    fn share_pool_with(&self, other: &Gpu) -> Result<(), CudaError> {
        use cudarc::driver::sys;
        let Some(pool) = default_pool(&self.ctx)? else {
            return Ok(());
        };
        let id = i32::try_from(other.ordinal()).map_err(|_| CudaError::TooLarge {
            what: "device ordinal",
            value: other.ordinal(),
        })?;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `pool` is this device's default pool; one descriptor is passed.
        unsafe { sys::cuMemPoolSetAccess(pool, &access, 1) }
            .result()
            .map_err(CudaError::driver("cuMemPoolSetAccess"))
    }

    /// What dynamic shared memory limits have been raised for this context's kernels
    /// ([`allow_shared`](super::tc_launch::allow_shared)).
    pub fn shared_limits(&self) -> &super::tc_launch::SharedLimits {
        &self.shared_limits
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// A new non-blocking stream on this device.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>, CudaError> {
        self.ctx
            .new_stream()
            .map_err(CudaError::driver("cuStreamCreate"))
    }

    /// The kernels' module, loaded into this device's context on the first call: the cubin named
    /// by `PIPEFILL_CUBIN` when it fits, else the embedded PTX ([`super::module`]).
    pub fn module(&self) -> Result<Arc<CudaModule>, CudaError> {
        self.loaded().map(|(m, _)| m.clone())
    }

    /// Which image [`module`](Self::module) loaded (loading it first if needed).
    pub fn module_source(&self) -> Result<ModuleSource, CudaError> {
        self.loaded().map(|(_, s)| s.clone())
    }

    fn loaded(&self) -> Result<&(Arc<CudaModule>, ModuleSource), CudaError> {
        if let Some(m) = self.module.get() {
            return Ok(m);
        }
        let loaded = super::module::load(&self.ctx)?;
        // Two threads may both have loaded it; the first one stored wins, the other is dropped.
        Ok(self.module.get_or_init(|| loaded))
    }

    /// The kernel `name` (one of [`crate::ptx::entry`]), looked up on first use.
    pub fn function(&self, name: &'static str) -> Result<CudaFunction, CudaError> {
        let mut functions = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = functions.get(name) {
            return Ok(f.clone());
        }
        let f = self
            .module()?
            .load_function(name)
            .map_err(CudaError::driver(format!("cuModuleGetFunction {name}")))?;
        functions.insert(name, f.clone());
        Ok(f)
    }

    /// The device address of at least `n` zeros that stay allocated and unwritten for the life of the
    /// device (a constant operand for kernels). The first call for a larger `n` allocates and waits
    /// for the zeroing; later calls are a lookup.
    pub fn zeros(&self, n: usize) -> Result<u64, CudaError> {
        let mut zeros = self.zeros.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(z) = zeros.last().filter(|z| z.len() >= n) {
            return Ok(z.device_ptr(z.stream()).0);
        }
        let stream = self.new_stream()?;
        let size = n.max(1).next_power_of_two();
        let z = stream
            .alloc_zeros::<f32>(size)
            .map_err(CudaError::driver("cuMemAllocAsync (zeros)"))?;
        stream
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))?;
        let at = z.device_ptr(&stream).0;
        zeros.push(z);
        Ok(at)
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx
            .synchronize()
            .map_err(CudaError::driver("cuCtxSynchronize"))
    }
}
