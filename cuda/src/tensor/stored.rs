//! [`DeviceStored`]: a device buffer in its storage type (`f32`, or BF16 bits under
//! `--activations bf16`), and [`Widened`], an `f32` view of one.

use std::ops::Deref;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use pipefill_host::cost::ActivationDtype;
use pipefill_host::runtime::Tensor;

use super::rehome;
use crate::error::CudaError;
use crate::launch::Launcher;

/// An activation a device stage keeps or hands on: `f32`, or BF16 bits under `--activations bf16`
/// (2 bytes a value; made by the conversion kernel, `pf_f32_to_bf16`, which rounds to nearest, ties
/// to even, as the CPU layers' [`pipefill_model::layers::store`] does).
#[derive(Debug)]
pub enum DeviceStored {
    /// 4 bytes a value.
    F32(CudaSlice<f32>),
    /// BF16 bit patterns, 2 bytes a value.
    Bf16(CudaSlice<u16>),
}

/// An `f32` view of a [`DeviceStored`]: the buffer itself, or a widened copy of BF16 bits.
#[derive(Debug)]
pub enum Widened<'a> {
    /// The stored `f32` buffer.
    Borrowed(&'a CudaSlice<f32>),
    /// A new `f32` buffer widened from BF16 (freed when dropped, in its stream's order).
    Owned(CudaSlice<f32>),
}

impl Deref for Widened<'_> {
    type Target = CudaSlice<f32>;

    fn deref(&self) -> &CudaSlice<f32> {
        match self {
            Widened::Borrowed(s) => s,
            Widened::Owned(s) => s,
        }
    }
}

impl DeviceStored {
    /// `x` stored as `dtype`: for BF16, rounded on the launcher's stream, and the `f32` buffer freed
    /// (stream-ordered, after the conversion).
    pub fn store(
        la: &Launcher,
        dtype: ActivationDtype,
        x: CudaSlice<f32>,
    ) -> Result<Self, CudaError> {
        Ok(match dtype {
            ActivationDtype::F32 => DeviceStored::F32(x),
            ActivationDtype::Bf16 => DeviceStored::Bf16(la.to_bf16(&x)?),
        })
    }

    /// The host tensor `t` on the device (`None` when empty): a BF16 tensor's bits are copied as
    /// they are (2 bytes a value); an `f32` tensor is copied, then stored as `dtype`.
    pub fn from_host(
        la: &Launcher,
        t: &Tensor,
        dtype: ActivationDtype,
    ) -> Result<Option<Self>, CudaError> {
        if t.is_empty() {
            return Ok(None);
        }
        let stream = la.stream();
        let up = CudaError::driver("memcpy to device");
        Ok(Some(match t.bf16_bits() {
            Some(bits) => DeviceStored::Bf16(stream.clone_htod(&bits).map_err(up)?),
            None => Self::store(la, dtype, stream.clone_htod(t.data()).map_err(up)?)?,
        }))
    }

    /// A stored value handed over as `dtype`: kept when it already is (no kernel), rounded to BF16
    /// or widened to `f32` (exact) on the launcher's stream otherwise, the old buffer freed there.
    pub fn into_dtype(self, la: &Launcher, dtype: ActivationDtype) -> Result<Self, CudaError> {
        match (self, dtype) {
            (DeviceStored::F32(s), ActivationDtype::Bf16) => {
                Ok(DeviceStored::Bf16(la.to_bf16(&s)?))
            }
            (DeviceStored::Bf16(s), ActivationDtype::F32) => Ok(DeviceStored::F32(la.to_f32(&s)?)),
            (kept, _) => Ok(kept),
        }
    }

    /// The stream that owns the buffer (frees it, in its order).
    pub fn stream(&self) -> &Arc<CudaStream> {
        match self {
            DeviceStored::F32(s) => s.stream(),
            DeviceStored::Bf16(s) => s.stream(),
        }
    }

    /// A new buffer on `s` with the same values and storage type (a device-to-device copy
    /// enqueued on `s`; a graph allocation and copy node under capture).
    pub fn duplicate(&self, s: &Arc<CudaStream>) -> Result<Self, CudaError> {
        fn dup<T: cudarc::driver::DeviceRepr>(
            s: &Arc<CudaStream>,
            x: &CudaSlice<T>,
        ) -> Result<CudaSlice<T>, CudaError> {
            // SAFETY: every element is written by the copy enqueued next on the same stream.
            let mut out =
                unsafe { s.alloc::<T>(x.len()) }.map_err(CudaError::driver("cuMemAllocAsync"))?;
            s.memcpy_dtod(x, &mut out)
                .map_err(CudaError::driver("cuMemcpyDtoDAsync"))?;
            Ok(out)
        }
        Ok(match self {
            DeviceStored::F32(x) => DeviceStored::F32(dup(s, x)?),
            DeviceStored::Bf16(x) => DeviceStored::Bf16(dup(s, x)?),
        })
    }

    /// Copies the values into `dst` on `s` (same storage type and length, else
    /// [`CudaError::Shape`]).
    pub fn copy_into(&self, dst: &mut DeviceStored, s: &Arc<CudaStream>) -> Result<(), CudaError> {
        let copy = CudaError::driver("cuMemcpyDtoDAsync");
        match (self, dst) {
            (DeviceStored::F32(x), DeviceStored::F32(d)) if x.len() == d.len() => {
                s.memcpy_dtod(x, d).map_err(copy)
            }
            (DeviceStored::Bf16(x), DeviceStored::Bf16(d)) if x.len() == d.len() => {
                s.memcpy_dtod(x, d).map_err(copy)
            }
            (x, d) => Err(CudaError::Shape {
                what: format!(
                    "copy of a {} buffer into a {} buffer (same type and length)",
                    x.dtype().name(),
                    d.dtype().name()
                ),
                expected: d.len(),
                got: x.len(),
            }),
        }
    }

    /// The storage type.
    pub fn dtype(&self) -> ActivationDtype {
        match self {
            DeviceStored::F32(_) => ActivationDtype::F32,
            DeviceStored::Bf16(_) => ActivationDtype::Bf16,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            DeviceStored::F32(s) => s.len(),
            DeviceStored::Bf16(s) => s.len(),
        }
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of device memory it holds.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype().bytes() as usize
    }

    /// The buffer owned by `stream` from now on ([`rehome`]).
    pub fn rehome(self, stream: &Arc<CudaStream>) -> Self {
        match self {
            DeviceStored::F32(s) => DeviceStored::F32(rehome(s, stream)),
            DeviceStored::Bf16(s) => DeviceStored::Bf16(rehome(s, stream)),
        }
    }

    /// The values as `f32` for a kernel that reads `f32` (a BF16 buffer is widened, exactly, into a
    /// new buffer on the launcher's stream).
    pub fn widen(&self, la: &Launcher) -> Result<Widened<'_>, CudaError> {
        Ok(match self {
            DeviceStored::F32(s) => Widened::Borrowed(s),
            DeviceStored::Bf16(s) => Widened::Owned(la.to_f32(s)?),
        })
    }

    /// The values as an owned `f32` buffer (widened for BF16; the BF16 buffer is freed).
    pub fn into_f32(self, la: &Launcher) -> Result<CudaSlice<f32>, CudaError> {
        match self {
            DeviceStored::F32(s) => Ok(s),
            DeviceStored::Bf16(s) => la.to_f32(&s),
        }
    }

    /// A host tensor of `shape` with the values, copied on `stream` (waits for it): BF16 bits are
    /// copied as they are and make a BF16 [`Tensor`] (2 bytes a value).
    pub fn to_host(
        &self,
        stream: &Arc<CudaStream>,
        shape: Vec<usize>,
    ) -> Result<Tensor, CudaError> {
        let down = CudaError::driver("memcpy to host");
        let made = match self {
            DeviceStored::F32(s) => Tensor::new(shape, stream.clone_dtoh(s).map_err(down)?),
            DeviceStored::Bf16(s) => Tensor::from_bf16(shape, stream.clone_dtoh(s).map_err(down)?),
        };
        stream
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))?;
        made.map_err(|e| CudaError::Shape {
            what: format!("host copy ({e})"),
            expected: e.expected,
            got: e.got,
        })
    }
}
