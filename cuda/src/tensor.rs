//! [`DeviceTensor`]: a device buffer with a shape, the payload a device stage exchanges (the device
//! counterpart of the runtime's host [`Tensor`]): `f32`, or BF16 bits under `--activations bf16`
//! ([`DeviceStored`], 2 bytes a value), as the host tensor is.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use pipefill_host::cost::ActivationDtype;
use pipefill_host::runtime::Tensor;

use super::error::CudaError;
use super::launch::Launcher;

mod stored;

pub use stored::{DeviceStored, Widened};

/// A row-major tensor in device memory, stored as `f32` or as BF16 bits ([`DeviceStored`]): what
/// device stages hand each other, so a BF16 stage's output and input gradient cross as 2 bytes a
/// value ([`DeviceTensor::bytes`]). An empty tensor (no values) owns no allocation.
///
/// Its memory belongs to the stream it was made on: it is freed on that stream (stream-ordered) when
/// dropped, so work on another stream that reads it must be ordered before the drop by the caller.
///
/// A pending scale factor ([`DeviceTensor::scale_later`], what the runtime's `Payload::scale_by` does)
/// is applied on the consumer's stream by [`DeviceTensor::into_scaled`].
#[derive(Debug)]
pub struct DeviceTensor {
    shape: Vec<usize>,
    data: Option<DeviceStored>,
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
    /// A tensor of `f32` zeros of `shape` on `stream`.
    pub fn zeros(stream: &Arc<CudaStream>, shape: Vec<usize>) -> Result<Self, CudaError> {
        let n = shape.iter().product();
        Self::from_slice(shape, zeros(stream, n)?)
    }

    /// A tensor of `shape` holding `values` (row-major, `f32`), copied to the device on `stream`.
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
        Self::from_slice(shape, data)
    }

    /// Class indices (`rows x 1`) for the cross-entropy loss of the stream runtime, stored as the
    /// bits of `u32`s in an `f32` buffer (the loss reads them as `u32`).
    pub fn labels(stream: &Arc<CudaStream>, classes: &[u32]) -> Result<Self, CudaError> {
        let bits: Vec<f32> = classes.iter().map(|&c| f32::from_bits(c)).collect();
        Self::from_values(stream, vec![classes.len(), 1], &bits)
    }

    /// The host tensor `t` copied to the device on `stream`, in its storage type: a BF16 tensor's
    /// bits are copied as they are (2 bytes a value).
    pub fn from_host(stream: &Arc<CudaStream>, t: &Tensor) -> Result<Self, CudaError> {
        match t.bf16_bits() {
            Some(bits) if !bits.is_empty() => {
                let data = stream
                    .clone_htod(&bits)
                    .map_err(CudaError::driver("memcpy to device"))?;
                Self::from_stored(t.shape().to_vec(), Some(DeviceStored::Bf16(data)))
            }
            _ => Self::from_values(stream, t.shape().to_vec(), t.data()),
        }
    }

    /// An `f32` tensor of `shape` over an existing buffer (`None` only when the shape holds no
    /// values).
    pub fn from_slice(shape: Vec<usize>, data: Option<CudaSlice<f32>>) -> Result<Self, CudaError> {
        Self::from_stored(shape, data.map(DeviceStored::F32))
    }

    /// A tensor of `shape` over an existing buffer in either storage type (`None` only when the
    /// shape holds no values).
    pub fn from_stored(shape: Vec<usize>, data: Option<DeviceStored>) -> Result<Self, CudaError> {
        let n: usize = shape.iter().product();
        let got = data.as_ref().map_or(0, DeviceStored::len);
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
    /// there (`None` when empty). Without a pending scale it keeps its storage type; with one the
    /// result is `f32` (a BF16 buffer is widened, then scaled: the consumer rounds it again if it
    /// stores BF16, as the CPU's [`Tensor::scale`] turns a BF16 tensor into `f32`).
    pub fn into_scaled(self, la: &Launcher) -> Result<Option<DeviceStored>, CudaError> {
        let Some(data) = self.data else {
            return Ok(None);
        };
        let data = data.rehome(la.stream());
        if self.scale == 1.0 {
            return Ok(Some(data));
        }
        let x = data.widen(la)?;
        let mut out = la
            .stream()
            .alloc_zeros::<f32>(x.len())
            .map_err(CudaError::driver("cuMemAllocAsync"))?;
        la.scale(&x, &mut out, self.scale)?;
        Ok(Some(DeviceStored::F32(out)))
    }

    /// The values as `f32` for a kernel that reads `f32` (`None` when empty): the buffer itself,
    /// or a widened copy of BF16 bits made on the launcher's stream. The pending scale is not
    /// applied (callers that read a payload in place refuse one).
    pub fn widen(&self, la: &Launcher) -> Result<Option<Widened<'_>>, CudaError> {
        self.data.as_ref().map(|d| d.widen(la)).transpose()
    }

    /// The values copied back to the host as `f32` on `stream` (BF16 widened exactly; waits for
    /// the stream).
    pub fn to_vec(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>, CudaError> {
        match &self.data {
            None => Ok(Vec::new()),
            Some(d) => Ok(d.to_host(stream, vec![d.len()])?.data().to_vec()),
        }
    }

    /// The tensor copied back to the host on `stream` in its storage type (a BF16 tensor becomes a
    /// BF16 [`Tensor`]; waits for the stream).
    pub fn to_host(&self, stream: &Arc<CudaStream>) -> Result<Tensor, CudaError> {
        match &self.data {
            Some(d) => d.to_host(stream, self.shape.clone()),
            None => Tensor::new(self.shape.clone(), Vec::new()).map_err(|e| CudaError::Shape {
                what: format!("host copy ({e})"),
                expected: e.expected,
                got: e.got,
            }),
        }
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

    /// The storage type (`f32` when empty).
    pub fn dtype(&self) -> ActivationDtype {
        self.data
            .as_ref()
            .map_or(ActivationDtype::F32, DeviceStored::dtype)
    }

    /// Bytes of device memory it holds: 4 a value for `f32`, 2 for BF16 (what the stream runtime
    /// reports as transfer bytes, and what a peer copy or an NCCL message moves).
    pub fn bytes(&self) -> usize {
        self.data.as_ref().map_or(0, DeviceStored::bytes)
    }

    /// The context (device) its buffer lives in: the device tag a multi-device runtime checks
    /// before handing it to a stream (`None` when empty: usable on any device).
    pub fn context(&self) -> Option<&Arc<CudaContext>> {
        self.data.as_ref().map(|d| d.stream().context())
    }

    /// The device buffer in its storage type (`None` when empty).
    pub fn stored(&self) -> Option<&DeviceStored> {
        self.data.as_ref()
    }

    /// The device buffer in its storage type, mutably (`None` when empty).
    pub fn stored_mut(&mut self) -> Option<&mut DeviceStored> {
        self.data.as_mut()
    }

    /// The `f32` device buffer (`None` when empty or stored as BF16: see
    /// [`DeviceTensor::stored`]).
    pub fn slice(&self) -> Option<&CudaSlice<f32>> {
        match &self.data {
            Some(DeviceStored::F32(s)) => Some(s),
            _ => None,
        }
    }

    /// The raw device address for a kernel argument (0 when empty).
    pub fn address(&self, stream: &CudaStream) -> u64 {
        match &self.data {
            None => 0,
            Some(DeviceStored::F32(s)) => address(Some(s), stream),
            Some(DeviceStored::Bf16(s)) => address(Some(s), stream),
        }
    }

    /// Gives up the buffer, in its storage type.
    pub fn into_stored(self) -> Option<DeviceStored> {
        self.data
    }
}
