//! The built-in losses on the device: MSE and softmax cross-entropy, value and gradient, with the
//! same conventions as the host [`LossKind`] (MSE: mean over all values; cross-entropy: mean over
//! rows, targets are class indices).

use cudarc::driver::CudaSlice;
use pipefill_host::runtime::Tensor;

use super::error::CudaError;
use super::launch::Launcher;
use super::tensor::{zeros, DeviceTensor};
use pipefill_model::layers::LossKind;

/// A microbatch's target on the device, in the form its loss needs.
#[derive(Debug)]
pub enum DeviceTarget {
    /// MSE: values of the output's shape.
    Values(DeviceTensor),
    /// Cross-entropy: one class index per row.
    Classes(CudaSlice<u32>),
}

impl DeviceTarget {
    /// The host target (as the runtime's losses take it) copied to the device for `kind`;
    /// cross-entropy classes are checked to be whole numbers in `0..classes`.
    pub fn from_host(
        la: &Launcher,
        kind: LossKind,
        target: &Tensor,
        classes: usize,
    ) -> Result<Self, CudaError> {
        match kind {
            LossKind::Mse => Ok(DeviceTarget::Values(DeviceTensor::from_host(
                la.stream(),
                target,
            )?)),
            LossKind::CrossEntropy => {
                let labels = target
                    .data()
                    .iter()
                    .map(|&c| {
                        let ok = c >= 0.0 && c.fract() == 0.0 && (c as usize) < classes;
                        ok.then_some(c as u32).ok_or_else(|| CudaError::Shape {
                            what: format!("cross-entropy class {c} (must be in 0..{classes})"),
                            expected: classes,
                            got: c as usize,
                        })
                    })
                    .collect::<Result<Vec<u32>, _>>()?;
                la.stream()
                    .clone_htod(&labels)
                    .map(DeviceTarget::Classes)
                    .map_err(CudaError::driver("memcpy targets to device"))
            }
        }
    }
}

fn nonempty<'a>(t: &'a DeviceTensor, what: &str) -> Result<&'a CudaSlice<f32>, CudaError> {
    t.slice().ok_or_else(|| CudaError::Shape {
        what: what.to_string(),
        expected: 1,
        got: 0,
    })
}

/// Sum of a small device buffer in `f64` on the host (waits for the stream).
fn host_sum(la: &Launcher, s: &CudaSlice<f32>) -> Result<f64, CudaError> {
    let v = la
        .stream()
        .clone_dtoh(s)
        .map_err(CudaError::driver("memcpy loss partials to host"))?;
    la.stream()
        .synchronize()
        .map_err(CudaError::driver("cuStreamSynchronize"))?;
    Ok(v.iter().map(|&x| f64::from(x)).sum())
}

/// The loss of `output` against `target` and its gradient with respect to `output` (the value is
/// read back to the host; the gradient stays on the device).
pub fn loss_and_grad(
    la: &Launcher,
    output: &DeviceTensor,
    target: &DeviceTarget,
) -> Result<(f32, DeviceTensor), CudaError> {
    // A BF16 stage's output is widened (exactly) for the loss kernels, which read `f32`.
    let out = output.widen(la)?.ok_or_else(|| CudaError::Shape {
        what: "loss input".into(),
        expected: 1,
        got: 0,
    })?;
    let n = output.len();
    let mut grad = zeros(la.stream(), n)?.ok_or_else(|| CudaError::Shape {
        what: "loss gradient".into(),
        expected: 1,
        got: 0,
    })?;
    let value = match target {
        DeviceTarget::Values(t) => {
            let t = nonempty(t, "MSE target (f32 values)")?;
            let mut partial =
                zeros(la.stream(), Launcher::mse_partials(n))?.ok_or_else(|| CudaError::Shape {
                    what: "MSE partials".into(),
                    expected: 1,
                    got: 0,
                })?;
            la.mse_forward(&out, t, &mut partial)?;
            la.mse_grad(&out, t, &mut grad, 1.0 / n as f32)?;
            host_sum(la, &partial)? / n as f64
        }
        DeviceTarget::Classes(labels) => {
            let rows = labels.len();
            let classes = output.cols();
            let mut row_loss = zeros(la.stream(), rows)?.ok_or_else(|| CudaError::Shape {
                what: "cross-entropy rows".into(),
                expected: 1,
                got: 0,
            })?;
            la.softmax_ce_forward(&out, labels, classes, &mut row_loss)?;
            la.softmax_ce_grad(&out, labels, &mut grad, classes, 1.0 / rows as f32)?;
            host_sum(la, &row_loss)? / rows as f64
        }
    };
    Ok((
        value as f32,
        DeviceTensor::from_slice(output.shape().to_vec(), Some(grad))?,
    ))
}
