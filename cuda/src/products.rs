//! The three products of a device layer in each [`Precision`]: exact `f32` on the SIMT kernels, TF32 or
//! BF16 on the tensor-core kernels. Inputs and results of [`forward`], [`backward_input`],
//! [`input_grad`] and [`backward_weight`] are `f32` buffers in every precision; BF16 rounds the operands
//! with a conversion kernel before the product and widens its BF16 results (exactly) after.
//! [`forward_bf16`] and [`backward_input_bf16`] read and write BF16 buffers as they are (activations
//! stored in BF16: no conversion).

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

use super::error::CudaError;
use super::launch::{Launcher, LinearDims};
use super::precision::Precision;

/// A layer's parameters as the products read them: `W` (and its BF16 copy under [`Precision::Bf16`]),
/// `b`.
#[derive(Debug, Clone, Copy)]
pub struct Weights<'a> {
    /// `W`, `inputs x outputs`.
    pub w: &'a CudaSlice<f32>,
    /// `W` rounded to BF16: present exactly when the precision is BF16.
    pub w16: Option<&'a CudaSlice<u16>>,
    /// `b`, `outputs`.
    pub b: &'a CudaSlice<f32>,
}

impl<'a> Weights<'a> {
    /// The BF16 weights, or an error naming what is missing.
    fn bf16(&self) -> Result<&'a CudaSlice<u16>, CudaError> {
        self.w16.ok_or_else(|| CudaError::Shape {
            what: "the BF16 copy of the weights (layer not made for bf16)".into(),
            expected: self.w.len(),
            got: 0,
        })
    }
}

/// A zeroed buffer of `n > 0` values on the launcher's stream.
pub fn alloc<T: DeviceRepr + ValidAsZeroBits>(
    la: &Launcher,
    n: usize,
) -> Result<CudaSlice<T>, CudaError> {
    if n == 0 {
        return Err(CudaError::Shape {
            what: "a layer buffer (must not be empty)".into(),
            expected: 1,
            got: 0,
        });
    }
    la.stream()
        .alloc_zeros::<T>(n)
        .map_err(CudaError::driver("cuMemAllocAsync"))
}

/// `F`: `Y = act(X W + b)` and, when `keep_z`, `Z = X W + b`.
pub fn forward(
    la: &Launcher,
    p: Precision,
    wt: &Weights<'_>,
    x: &CudaSlice<f32>,
    keep_z: bool,
    d: LinearDims,
) -> Result<(CudaSlice<f32>, Option<CudaSlice<f32>>), CudaError> {
    let n = d.rows * d.outputs;
    if p == Precision::Bf16 {
        let (y16, z16) = forward_bf16(la, wt, &la.to_bf16(x)?, keep_z, d)?;
        let z = z16.map(|z| la.to_f32(&z)).transpose()?;
        return Ok((la.to_f32(&y16)?, z));
    }
    let mut y = alloc::<f32>(la, n)?;
    let mut z = keep_z.then(|| alloc::<f32>(la, n)).transpose()?;
    match p {
        Precision::Fp32 => la.linear_forward(x, wt.w, wt.b, &mut y, z.as_mut(), d)?,
        _ => la.linear_forward_tc(x, wt.w, wt.b, &mut y, z.as_mut(), d)?,
    }
    Ok((y, z))
}

/// `I` with the input gradient: `dZ = dY act'(Z)` and `dX = dZ W^T` (`z` is `None` only for the
/// identity, whose `dZ` is `dy` itself). Returns `(dZ, dX)`.
pub fn backward_input(
    la: &Launcher,
    p: Precision,
    wt: &Weights<'_>,
    dy: CudaSlice<f32>,
    z: Option<&CudaSlice<f32>>,
    d: LinearDims,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>), CudaError> {
    let n_in = d.rows * d.inputs;
    if p == Precision::Bf16 {
        let dy16 = la.to_bf16(&dy)?;
        let z16 = z.map(|z| la.to_bf16(z)).transpose()?;
        let (dz16, dx16) = backward_input_bf16(la, wt, &dy16, z16.as_ref(), d)?;
        let dz = match dz16 {
            Some(dz16) => la.to_f32(&dz16)?,
            None => dy,
        };
        return Ok((dz, la.to_f32(&dx16)?));
    }
    let mut dx = alloc::<f32>(la, n_in)?;
    let mut dz = z.map(|_| alloc::<f32>(la, dy.len())).transpose()?;
    match p {
        Precision::Fp32 => la.linear_backward_input(&dy, z, wt.w, &mut dx, dz.as_mut(), d)?,
        _ => la.linear_backward_input_tc(&dy, z, wt.w, &mut dx, dz.as_mut(), d)?,
    }
    Ok((dz.unwrap_or(dy), dx))
}

/// `F` on BF16 `x` with BF16 results, the BF16 tensor-core kernel alone: `Y` and, when `keep_z`, `Z`
/// (each rounded to BF16 by the kernel's epilogue).
pub fn forward_bf16(
    la: &Launcher,
    wt: &Weights<'_>,
    x16: &CudaSlice<u16>,
    keep_z: bool,
    d: LinearDims,
) -> Result<(CudaSlice<u16>, Option<CudaSlice<u16>>), CudaError> {
    let n = d.rows * d.outputs;
    let mut y16 = alloc::<u16>(la, n)?;
    let mut z16 = keep_z.then(|| alloc::<u16>(la, n)).transpose()?;
    la.linear_forward_tc(x16, wt.bf16()?, wt.b, &mut y16, z16.as_mut(), d)?;
    Ok((y16, z16))
}

/// `I` with the input gradient on BF16 buffers, the BF16 tensor-core kernel alone: `dZ` (`None` for
/// the identity, whose `dZ` is `dy16`) and `dX`, both BF16.
pub fn backward_input_bf16(
    la: &Launcher,
    wt: &Weights<'_>,
    dy16: &CudaSlice<u16>,
    z16: Option<&CudaSlice<u16>>,
    d: LinearDims,
) -> Result<(Option<CudaSlice<u16>>, CudaSlice<u16>), CudaError> {
    let mut dx16 = alloc::<u16>(la, d.rows * d.inputs)?;
    let mut dz16 = z16.map(|_| alloc::<u16>(la, dy16.len())).transpose()?;
    la.linear_backward_input_tc(dy16, z16, wt.bf16()?, &mut dx16, dz16.as_mut(), d)?;
    Ok((dz16, dx16))
}

/// `dX = dZ W^T` alone (`d.act` must be the identity: `dz` is already the pre-activation's
/// gradient).
pub fn input_grad(
    la: &Launcher,
    p: Precision,
    wt: &Weights<'_>,
    dz: &CudaSlice<f32>,
    d: LinearDims,
) -> Result<CudaSlice<f32>, CudaError> {
    if p == Precision::Bf16 {
        let (_, dx16) = backward_input_bf16(la, wt, &la.to_bf16(dz)?, None, d)?;
        return la.to_f32(&dx16);
    }
    let mut dx = alloc::<f32>(la, d.rows * d.inputs)?;
    match p {
        Precision::Fp32 => la.linear_backward_input(dz, None, wt.w, &mut dx, None, d)?,
        _ => la.linear_backward_input_tc(dz, None, wt.w, &mut dx, None, d)?,
    }
    Ok(dx)
}

/// `W`: `dW += X^T dZ`, `db += colsum(dZ)` (`f32` accumulators in every precision).
pub fn backward_weight(
    la: &Launcher,
    p: Precision,
    x: &CudaSlice<f32>,
    dz: &CudaSlice<f32>,
    dw: &mut CudaSlice<f32>,
    db: &mut CudaSlice<f32>,
    d: LinearDims,
) -> Result<(), CudaError> {
    match p {
        Precision::Fp32 => la.linear_backward_weight(x, dz, dw, Some(db), d),
        Precision::Tf32 => la.linear_backward_weight_tc(x, dz, dw, Some(db), d),
        Precision::Bf16 => {
            let (x16, dz16) = (la.to_bf16(x)?, la.to_bf16(dz)?);
            la.linear_backward_weight_tc(&x16, &dz16, dw, Some(db), d)
        }
    }
}
