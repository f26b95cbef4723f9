//! [`DeviceTensor`]: an `f32` buffer on a device with a shape, the payload a device stage exchanges
//! (the device counterpart of the runtime's host [`Tensor`]).

use std::ops::Deref;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use pipefill_host::cost::ActivationDtype;
use pipefill_host::runtime::Tensor;

use super::error::CudaError;
use super::launch::Launcher;

/// A row-major `f32` tensor in device memory. An empty tensor (no values) owns no allocation.
///
/// Its memory belongs to the stream it was made on: it is freed on that stream (stream-ordered) when
/// dropped, so work on another stream that reads it must be ordered before the drop by the caller.
///
/// A pending scale factor ([`DeviceTensor::scale_later`], what the runtime's `Payload::scale_by` does)
/// is applied on the consumer's stream by [`DeviceTensor::into_scaled`].
#[derive(Debug)]
pub struct DeviceTensor {
    shape: Vec<usize>,
    data: Option<CudaSlice<f32>>,
    scale: f32,
}

/// `slice` owned by `stream` from now on: freed there, in that stream's order, when dropped.
///
/// A buffer made on one stream and consumed on another must be re-homed to the consumer before the
/// consumer drops it; otherwise it would be freed in the producer's stream order, possibly while the
/// consumer's kernels still read it (cudarc's event tracking, which would order this, is off).
pub fn rehome<T>(slice: CudaSlice<T>, stream: &Arc<CudaStream>) -> CudaSlice<T> {
    if slice.stream() == stream {
        return slice;
    }
    let len = slice.len();
    // SAFETY: `leak` gives up the allocation without freeing it; `upgrade_device_ptr` takes it over
    // with its length. The consumer stream is ordered after the producer's work (it waited on the
    // transfer's event), so the stream-ordered free on it comes after every use.
    unsafe { stream.upgrade_device_ptr(slice.leak(), len) }
}

/// A zeroed device buffer of `n` values on `stream` (`None` for `n == 0`: CUDA refuses empty
/// allocations).
pub fn zeros(stream: &Arc<CudaStream>, n: usize) -> Result<Option<CudaSlice<f32>>, CudaError> {
    if n == 0 {
        return Ok(None);
    }
    stream
        .alloc_zeros::<f32>(n)
        .map(Some)
        .map_err(CudaError::driver("cuMemAllocAsync"))
}

/// The raw device address of `slice` for a kernel argument (0 for `None`: an optional pointer).
///
/// The context runs without cudarc's event tracking ([`super::Gpu::open`]), so taking the address
/// records nothing; ordering the use is the caller's.
pub fn address<T>(slice: Option<&CudaSlice<T>>, stream: &CudaStream) -> u64 {
    slice.map_or(0, |s| s.device_ptr(stream).0)
}

impl DeviceTensor {
    /// A tensor of zeros of `shape` on `stream`.
    pub fn zeros(stream: &Arc<CudaStream>, shape: Vec<usize>) -> Result<Self, CudaError> {
        let n = shape.iter().product();
        Ok(DeviceTensor {
            data: zeros(stream, n)?,
            shape,
            scale: 1.0,
        })
    }

    /// A tensor of `shape` holding `values` (row-major), copied to the device on `stream`.
    pub fn from_values(
        stream: &Arc<CudaStream>,
        shape: Vec<usize>,
        values: &[f32],
    ) -> Result<Self, CudaError> {
        let n: usize = shape.iter().product();
        if n != values.len() {
            return Err(CudaError::Shape {
                what: format!("host values for shape {shape:?}"),
                expected: n,
                got: values.len(),
            });
        }
        let data = if n == 0 {
            None
        } else {
            Some(
                stream
                    .clone_htod(values)
                    .map_err(CudaError::driver("memcpy to device"))?,
            )
        };
        Ok(DeviceTensor {
            shape,
            data,
            scale: 1.0,
        })
    }

    /// Class indices (`rows x 1`) for the cross-entropy loss of the stream runtime, stored as the
    /// bits of `u32`s in the `f32` buffer (the loss reads them as `u32`).
    pub fn labels(stream: &Arc<CudaStream>, classes: &[u32]) -> Result<Self, CudaError> {
        let bits: Vec<f32> = classes.iter().map(|&c| f32::from_bits(c)).collect();
        Self::from_values(stream, vec![classes.len(), 1], &bits)
    }

    /// The host tensor `t` copied to the device on `stream`.
    pub fn from_host(stream: &Arc<CudaStream>, t: &Tensor) -> Result<Self, CudaError> {
        Self::from_values(stream, t.shape().to_vec(), t.data())
    }

    /// A tensor of `shape` over an existing buffer (`None` only when the shape holds no values).
    pub fn from_slice(shape: Vec<usize>, data: Option<CudaSlice<f32>>) -> Result<Self, CudaError> {
        let n: usize = shape.iter().product();
        let got = data.as_ref().map_or(0, CudaSlice::len);
        if n != got {
            return Err(CudaError::Shape {
                what: format!("device buffer for shape {shape:?}"),
                expected: n,
                got,
            });
        }
        Ok(DeviceTensor {
            shape,
            data,
            scale: 1.0,
        })
    }

    /// Multiplies the values by `by` when next consumed ([`DeviceTensor::into_scaled`]); nothing is
    /// enqueued now.
    pub fn scale_later(&mut self, by: f32) {
        self.scale *= by;
    }

    /// The pending scale factor (1 when none).
    pub fn pending_scale(&self) -> f32 {
        self.scale
    }

    /// The buffer, owned by the launcher's stream ([`rehome`]) and with any pending scale applied
    /// there (`None` when empty).
    pub fn into_scaled(
        self,
        la: &super::launch::Launcher,
    ) -> Result<Option<CudaSlice<f32>>, CudaError> {
        let Some(data) = self.data else {
            return Ok(None);
        };
        let data = rehome(data, la.stream());
        if self.scale == 1.0 {
            return Ok(Some(data));
        }
        let mut out = la
            .stream()
            .alloc_zeros::<f32>(data.len())
            .map_err(CudaError::driver("cuMemAllocAsync"))?;
        la.scale(&data, &mut out, self.scale)?;
        Ok(Some(out))
    }

    /// The values copied back to the host on `stream` (waits for the stream).
    pub fn to_vec(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>, CudaError> {
        match &self.data {
            None => Ok(Vec::new()),
            Some(d) => {
                let v = stream
                    .clone_dtoh(d)
                    .map_err(CudaError::driver("memcpy to host"))?;
                // A copy to pageable memory returns once done; the explicit wait makes that
                // independent of the driver's staging.
                stream
                    .synchronize()
                    .map_err(CudaError::driver("cuStreamSynchronize"))?;
                Ok(v)
            }
        }
    }

    /// The tensor copied back to the host on `stream` (waits for the stream).
    pub fn to_host(&self, stream: &Arc<CudaStream>) -> Result<Tensor, CudaError> {
        let values = self.to_vec(stream)?;
        Tensor::new(self.shape.clone(), values).map_err(|e| CudaError::Shape {
            what: format!("host copy ({e})"),
            expected: self.len(),
            got: self.len(),
        })
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows: the first dimension (1 for a scalar shape).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Columns: the product of the other dimensions.
    pub fn cols(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Bytes of device memory it holds.
    pub fn bytes(&self) -> usize {
        self.len() * std::mem::size_of::<f32>()
    }

    /// The context (device) its buffer lives in: the device tag a multi-device runtime checks
    /// before handing it to a stream (`None` when empty: usable on any device).
    pub fn context(&self) -> Option<&Arc<CudaContext>> {
        self.data.as_ref().map(|d| d.stream().context())
    }

    /// The device buffer (`None` when empty).
    pub fn slice(&self) -> Option<&CudaSlice<f32>> {
        self.data.as_ref()
    }

    /// The device buffer, mutably (`None` when empty).
    pub fn slice_mut(&mut self) -> Option<&mut CudaSlice<f32>> {
        self.data.as_mut()
    }

    /// The raw device address for a kernel argument (0 when empty).
    pub fn address(&self, stream: &CudaStream) -> u64 {
        address(self.data.as_ref(), stream)
    }

    /// Gives up the buffer.
    pub fn into_slice(self) -> Option<CudaSlice<f32>> {
        self.data
    }
}

/// An activation a device stage keeps or hands on: `f32`, or BF16 bits under `--activations bf16`
/// (2 bytes a value; made by the conversion kernel, `pf_f32_to_bf16`, which rounds to nearest, ties
/// to even, as the CPU layers' [`crate::layers::store`] does).
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
