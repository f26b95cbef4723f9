//! Launches of the tensor-core kernels ([`crate::ptx::entry::TENSOR_CORE`]) and of the BF16 conversions
//! ([`entry::F32_TO_BF16`], [`entry::BF16_TO_F32`]), as more [`Launcher`] methods.
//!
//! The GEMMs are generic over their element type [`TcElem`]: `f32` buffers run the TF32 kernels, `u16`
//! buffers (BF16 bits) the BF16 ones; bias, `dW` and `db` are `f32` in both. Grid and dynamic shared
//! memory come from [`tc::launch`]; every one of these kernels needs more than the 48 KiB a launch gets
//! by default, so the first launch of each function on a device raises its limit
//! (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, [`allow_shared`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr};
use pipefill_kernels::elementwise_grid;
use pipefill_kernels::tc::{self, Product};

use super::device::Gpu;
use super::error::{arg_u32, CudaError};
use super::launch::{need, Arg, Launcher, LinearDims};
use crate::ptx::entry;

/// Dynamic shared memory a kernel may use without raising its limit (48 KiB on every GPU).
pub const DEFAULT_SHARED_BYTES: u32 = 48 << 10;

/// Raises kernel `name`'s dynamic shared memory limit to `bytes` on `f`, a function loaded into
/// `gpu`'s context, once per context and kernel (later calls asking for no more are a lookup).
///
/// The record of what was raised lives in the [`Gpu`] whose module `f` came from
/// ([`Gpu::shared_limits`]): a second context on the same device (`Gpu::open_separate`) loads
/// its own module, whose functions start at the default limit and are raised again.
pub fn allow_shared(
    gpu: &Arc<Gpu>,
    name: &'static str,
    f: &CudaFunction,
    bytes: u32,
) -> Result<(), CudaError> {
    let limits = gpu.shared_limits();
    if limits.allows(name, bytes) {
        return Ok(());
    }
    let op = format!("cuFuncSetAttribute {name} (max dynamic shared memory {bytes} bytes)");
    let value = i32::try_from(bytes).map_err(|_| CudaError::TooLarge {
        what: "dynamic shared memory",
        value: bytes as usize,
    })?;
    gpu.context()
        .bind_to_thread()
        .map_err(CudaError::driver(op.clone()))?;
    f.set_attribute(
        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        value,
    )
    .map_err(CudaError::driver(op))?;
    limits.raised(name, bytes);
    Ok(())
}

/// The dynamic shared memory limits raised so far for the functions of one loaded module (one per
/// [`Gpu`], that is per context): kernel name -> bytes.
#[derive(Debug, Default)]
pub struct SharedLimits(Mutex<HashMap<&'static str, u32>>);

impl SharedLimits {
    /// Whether `name` may already launch with `bytes` of dynamic shared memory: at most the
    /// default, or at most what was raised for it.
    pub fn allows(&self, name: &'static str, bytes: u32) -> bool {
        bytes <= DEFAULT_SHARED_BYTES
            || self
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
                .is_some_and(|&b| b >= bytes)
    }

    /// Records that `name`'s limit is now `bytes`.
    pub fn raised(&self, name: &'static str, bytes: u32) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, bytes);
    }
}

/// The element type of a tensor-core GEMM's matrices: `f32` (TF32 kernels) or `u16` (BF16 bits).
pub trait TcElem: DeviceRepr {
    /// The kernels' input precision for this element.
    const PRECISION: tc::Precision;
}

impl TcElem for f32 {
    const PRECISION: tc::Precision = tc::Precision::Tf32;
}

impl TcElem for u16 {
    const PRECISION: tc::Precision = tc::Precision::Bf16;
}

/// What ends a size error's label, so the precision shows (`"<what> (tf32)"`).
fn tag(p: tc::Precision) -> &'static str {
    match p {
        tc::Precision::Tf32 => " (tf32)",
        tc::Precision::Bf16 => " (bf16)",
    }
}

impl Launcher {
    /// Enqueues `product` in `E`'s precision for the layer `d` with `args`.
    ///
    /// # Safety
    /// `args` must be the kernel's argument list with every buffer's size checked.
    unsafe fn launch_tc<E: TcElem>(
        &self,
        product: Product,
        d: &LinearDims,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let l = tc::launch(product, E::PRECISION, d.rows, d.inputs, d.outputs);
        let name = tc::entry_name(product, E::PRECISION);
        self.launch_shared(name, l.grid, l.shared_bytes, args)
    }

    /// Tensor-core forward: `y = act(x w + b)`, storing `z = x w + b` when given. `E = f32` runs the TF32
    /// kernel ([`entry::LINEAR_FORWARD_TF32`]), `E = u16` (BF16 bits) the BF16 one; `b` is `f32`.
    pub fn linear_forward_tc<E: TcElem>(
        &self,
        x: &CudaSlice<E>,
        w: &CudaSlice<E>,
        b: &CudaSlice<f32>,
        y: &mut CudaSlice<E>,
        z: Option<&mut CudaSlice<E>>,
        d: LinearDims,
    ) -> Result<(), CudaError> {
        let tag = tag(E::PRECISION);
        let args = self.forward_args(tag, x, w, b, y, z.as_deref(), &d)?;
        // SAFETY: the argument list is the kernel's (`entry::LINEAR_FORWARD`'s, in `E`); every buffer's
        // size was checked above.
        unsafe { self.launch_tc::<E>(Product::Forward, &d, &args) }
    }

    /// Tensor-core input gradient: `dz = dy act'(z)`, `dx = dz w^T`, storing `dz` when given (`z` may be
    /// `None` only for the identity). `E` as for [`Launcher::linear_forward_tc`].
    pub fn linear_backward_input_tc<E: TcElem>(
        &self,
        dy: &CudaSlice<E>,
        z: Option<&CudaSlice<E>>,
        w: &CudaSlice<E>,
        dx: &mut CudaSlice<E>,
        dz: Option<&mut CudaSlice<E>>,
        d: LinearDims,
    ) -> Result<(), CudaError> {
        let tag = tag(E::PRECISION);
        let args = self.backward_input_args(tag, dy, z, w, dx, dz.as_deref(), &d)?;
        // SAFETY: as in `linear_forward_tc`.
        unsafe { self.launch_tc::<E>(Product::BackwardInput, &d, &args) }
    }

    /// Tensor-core weight gradient: `dw += x^T dz`, and `db += colsum(dz)` when given (`dw`, `db` in
    /// `f32`). `E` as for [`Launcher::linear_forward_tc`].
    pub fn linear_backward_weight_tc<E: TcElem>(
        &self,
        x: &CudaSlice<E>,
        dz: &CudaSlice<E>,
        dw: &mut CudaSlice<f32>,
        db: Option<&mut CudaSlice<f32>>,
        d: LinearDims,
    ) -> Result<(), CudaError> {
        let tag = tag(E::PRECISION);
        let args = self.backward_weight_args(tag, x, dz, dw, db.as_deref(), &d)?;
        // SAFETY: as in `linear_forward_tc`.
        unsafe { self.launch_tc::<E>(Product::BackwardWeight, &d, &args) }
    }

    /// `x` rounded to BF16 into a new buffer on the stream ([`entry::F32_TO_BF16`]).
    pub fn to_bf16(&self, x: &CudaSlice<f32>) -> Result<CudaSlice<u16>, CudaError> {
        // SAFETY: `to_bf16_into` writes all `x.len()` values before anything on the stream reads them.
        let mut y = unsafe { self.stream().alloc::<u16>(x.len()) }
            .map_err(CudaError::driver("cuMemAllocAsync (bf16)"))?;
        self.to_bf16_into(x, &mut y)?;
        Ok(y)
    }

    /// `x` rounded to BF16 into `y` (same length), on the stream ([`entry::F32_TO_BF16`]).
    pub fn to_bf16_into(
        &self,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<u16>,
    ) -> Result<(), CudaError> {
        let n = x.len();
        need("bf16 conversion output", Some(&*y), n)?;
        let args = [
            self.ptr(Some(x)),
            self.ptr(Some(&*y)),
            Arg::U32(arg_u32("n", n)?),
        ];
        // SAFETY: the kernel's argument list; both buffers hold `n` values.
        unsafe { self.launch_shared(entry::F32_TO_BF16, elementwise_grid(n), 0, &args) }
    }

    /// BF16 `x` widened to `f32` into a new buffer on the stream ([`entry::BF16_TO_F32`], exact).
    pub fn to_f32(&self, x: &CudaSlice<u16>) -> Result<CudaSlice<f32>, CudaError> {
        let n = x.len();
        // SAFETY: as in `to_bf16`.
        let y = unsafe { self.stream().alloc::<f32>(n) }
            .map_err(CudaError::driver("cuMemAllocAsync (f32)"))?;
        let args = [
            self.ptr(Some(x)),
            self.ptr(Some(&y)),
            Arg::U32(arg_u32("n", n)?),
        ];
        // SAFETY: as in `to_bf16`.
        unsafe { self.launch_shared(entry::BF16_TO_F32, elementwise_grid(n), 0, &args)? };
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::{SharedLimits, DEFAULT_SHARED_BYTES};

    #[test]
    fn limits_are_per_module_and_only_grow() {
        let (a, b) = (SharedLimits::default(), SharedLimits::default());
        let big = DEFAULT_SHARED_BYTES + 4096;
        assert!(
            a.allows("k", DEFAULT_SHARED_BYTES),
            "the default needs no raise"
        );
        assert!(!a.allows("k", big));
        a.raised("k", big);
        assert!(a.allows("k", big) && a.allows("k", big - 1));
        assert!(!a.allows("k", big + 1), "more than was raised");
        assert!(!a.allows("other", big), "another kernel");
        assert!(
            !b.allows("k", big),
            "another context's module starts at the default limit"
        );
    }
}
