//! [`DeviceTensor`]: an `f32` buffer on a device with a shape, the payload a device stage exchanges
//! (the device counterpart of the runtime's host [`Tensor`]).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use pipefill_host::runtime::Tensor;

use super::error::CudaError;

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
pub fn rehome(slice: CudaSlice<f32>, stream: &Arc<CudaStream>) -> CudaSlice<f32> {
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
