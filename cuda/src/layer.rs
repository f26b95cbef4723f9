//! [`DeviceLinear`]: the built-in layer `Y = act(X W + b)` with its parameters, gradients and
//! optimizer state in device memory, and its F, I, W passes and update as kernel launches.
//!
//! Same semantics as the CPU [`Linear`]: gradients accumulate over microbatches, and after
//! [`DeviceLinear::zero_grad`] the first `W` overwrites them (here: zeroes them on the stream first).
//! Its products run in the layer's [`Precision`] ([`super::products`]).
//!
//! The `*_stored` passes take and give activations as a stage stores them ([`DeviceStored`]: `f32`
//! or BF16 bits, `--activations bf16`), with the CPU layers' rounding points: every tensor between
//! layers is BF16, `Z` and `dZ` are rounded when stored, and `dX` is computed from the rounded
//! `dZ`. Under [`Precision::Bf16`] the BF16 tensor-core kernels read and write the BF16 buffers
//! directly (no conversion); in the other precisions the operands are widened before the product
//! and the results rounded after it.

use cudarc::driver::CudaSlice;
use pipefill_host::cost::ActivationDtype;
use pipefill_kernels::Activation;

use super::error::CudaError;
use super::launch::{Launcher, LinearDims};
use super::precision::Precision;
use super::products::{self, Weights};
use super::tensor::DeviceStored;
use pipefill_model::layers::{Linear, Optimizer};

/// One parameter buffer with its gradient and optimizer state on the device.
#[derive(Debug)]
struct DeviceParam {
    value: CudaSlice<f32>,
    grad: CudaSlice<f32>,
    /// Velocity (SGD) or first moment (AdamW), allocated at the first update.
    first: Option<CudaSlice<f32>>,
    /// Second moment (AdamW), allocated at the first update.
    second: Option<CudaSlice<f32>>,
}

/// A zeroed buffer of `n > 0` values.
fn alloc(la: &Launcher, n: usize) -> Result<CudaSlice<f32>, CudaError> {
    products::alloc::<f32>(la, n)
}

impl DeviceParam {
    /// `values` with the optimizer `moments` (each empty, or one value per parameter).
    fn new(la: &Launcher, values: &[f32], moments: (&[f32], &[f32])) -> Result<Self, CudaError> {
        let up = |v: &[f32]| {
            la.stream()
                .clone_htod(v)
                .map_err(CudaError::driver("memcpy parameters to device"))
        };
        let moment = |v: &[f32]| (!v.is_empty()).then(|| up(v)).transpose();
        Ok(DeviceParam {
            grad: alloc(la, values.len())?,
            value: up(values)?,
            first: moment(moments.0)?,
            second: moment(moments.1)?,
        })
    }

    /// The optimizer moments on the host (empty where none is allocated yet).
    fn moments_to_host(&self, la: &Launcher) -> Result<[Vec<f32>; 2], CudaError> {
        let get = |m: &Option<CudaSlice<f32>>| match m {
            Some(s) => la
                .stream()
                .clone_dtoh(s)
                .map_err(CudaError::driver("memcpy optimizer state to host")),
            None => Ok(Vec::new()),
        };
        Ok([get(&self.first)?, get(&self.second)?])
    }

    /// Step `t` of `opt` from the accumulated gradient.
    fn update(&mut self, la: &Launcher, opt: &Optimizer, t: u32) -> Result<(), CudaError> {
        let n = self.value.len();
        let first = match &mut self.first {
            Some(f) => f,
            slot => slot.insert(alloc(la, n)?),
        };
        match opt {
            Optimizer::Sgd(s) => la.sgd_momentum(&mut self.value, &self.grad, first, s),
            Optimizer::AdamW(a) => {
                let second = match &mut self.second {
                    Some(s) => s,
                    slot => slot.insert(alloc(la, n)?),
                };
                la.adamw(&mut self.value, &self.grad, first, second, &a.at_step(t))
            }
        }
    }
}

/// A layer's `(W, b)`-shaped pair of host buffers: weights then biases (or their gradients).
pub type HostPair = (Vec<f32>, Vec<f32>);

/// The built-in layer on a device.
#[derive(Debug)]
pub struct DeviceLinear {
    /// Input width.
    pub inputs: usize,
    /// Output width.
    pub outputs: usize,
    /// The fused activation.
    pub activation: Activation,
    /// The arithmetic of its products.
    pub precision: Precision,
    weight: DeviceParam,
    /// `W` rounded to BF16, refreshed after every update (only under [`Precision::Bf16`]).
    weight_bf16: Option<CudaSlice<u16>>,
    bias: DeviceParam,
    /// `true` after `zero_grad` until the first `W`: the gradient buffers count as zero.
    fresh: bool,
}

/// What one layer's stored `I` produced ([`DeviceLinear::backward_input_stored`]).
#[derive(Debug)]
pub struct StoredInputGrad {
    /// `dZ`, as stored for `W`.
    pub dz: DeviceStored,
    /// `dX`, when asked for.
    pub dx: Option<DeviceStored>,
}

/// What one layer's `I` produced: `dZ` (kept for `W`) and, when asked, `dX`.
#[derive(Debug)]
pub struct InputGrad {
    /// `dZ = dY act'(Z)`, `rows x outputs`.
    pub dz: CudaSlice<f32>,
    /// `dX = dZ W^T`, `rows x inputs`, when asked for.
    pub dx: Option<CudaSlice<f32>>,
}

impl DeviceLinear {
    /// The host layer's weights, biases and optimizer state copied to the device (gradients
    /// zero), computing in exact `f32` ([`Precision::Fp32`]).
    pub fn from_host(la: &Launcher, layer: &Linear) -> Result<Self, CudaError> {
        Self::from_host_in(la, layer, Precision::Fp32)
    }

    /// [`DeviceLinear::from_host`] computing its products in `precision`.
    pub fn from_host_in(
        la: &Launcher,
        layer: &Linear,
        precision: Precision,
    ) -> Result<Self, CudaError> {
        let (w, b) = layer.optimizer_state();
        let mut l = DeviceLinear {
            inputs: layer.inputs,
            outputs: layer.outputs,
            activation: layer.activation,
            precision,
            weight: DeviceParam::new(la, &layer.weight, w.moments())?,
            weight_bf16: None,
            bias: DeviceParam::new(la, &layer.bias, b.moments())?,
            fresh: true,
        };
        l.refresh_bf16(la)?;
        Ok(l)
    }

    /// Rounds `W` into its BF16 copy (under [`Precision::Bf16`]; nothing otherwise). The copy is
    /// made once and overwritten in place afterwards, in the update's stream order: replacing it would
    /// free the old one in the order of the stream that made it, which may run ahead of a reader on
    /// another stream.
    fn refresh_bf16(&mut self, la: &Launcher) -> Result<(), CudaError> {
        if self.precision != Precision::Bf16 {
            return Ok(());
        }
        match &mut self.weight_bf16 {
            Some(w16) => la.to_bf16_into(&self.weight.value, w16),
            slot => {
                *slot = Some(la.to_bf16(&self.weight.value)?);
                Ok(())
            }
        }
    }

    fn weights(&self) -> Weights<'_> {
        Weights {
            w: &self.weight.value,
            w16: self.weight_bf16.as_ref(),
            b: &self.bias.value,
        }
    }

    fn dims(&self, rows: usize) -> LinearDims {
        LinearDims {
            rows,
            inputs: self.inputs,
            outputs: self.outputs,
            act: self.activation,
        }
    }

    /// Whether backward needs the pre-activation `Z` (not for the identity).
    pub fn keeps_pre_activation(&self) -> bool {
        self.activation != Activation::Identity
    }

    /// `F` for `rows` rows of `x`: `Y` and, if backward needs it, `Z`.
    pub fn forward(
        &self,
        la: &Launcher,
        x: &CudaSlice<f32>,
        rows: usize,
    ) -> Result<(CudaSlice<f32>, Option<CudaSlice<f32>>), CudaError> {
        let keep = self.keeps_pre_activation();
        products::forward(
            la,
            self.precision,
            &self.weights(),
            x,
            keep,
            self.dims(rows),
        )
    }

    /// `I`: `dZ = dY act'(Z)` (consuming `dY` and `Z`) and, if `want_input`, `dX = dZ W^T`.
    pub fn backward_input(
        &self,
        la: &Launcher,
        dy: CudaSlice<f32>,
        z: Option<CudaSlice<f32>>,
        rows: usize,
        want_input: bool,
    ) -> Result<InputGrad, CudaError> {
        let d = self.dims(rows);
        let z = z.filter(|_| self.keeps_pre_activation());
        match (z, want_input) {
            // Identity: dZ is dY.
            (None, false) => Ok(InputGrad { dz: dy, dx: None }),
            (Some(z), false) => {
                let mut dz = alloc(la, dy.len())?;
                la.activation_backward(&dy, &z, &mut dz, self.activation)?;
                Ok(InputGrad { dz, dx: None })
            }
            (z, true) => {
                let (dz, dx) = products::backward_input(
                    la,
                    self.precision,
                    &self.weights(),
                    dy,
                    z.as_ref(),
                    d,
                )?;
                Ok(InputGrad { dz, dx: Some(dx) })
            }
        }
    }

    /// `W`: `dW += X^T dZ`, `db += colsum(dZ)` (overwriting after [`zero_grad`](Self::zero_grad)).
    pub fn backward_weight(
        &mut self,
        la: &Launcher,
        x: &CudaSlice<f32>,
        dz: &CudaSlice<f32>,
        rows: usize,
    ) -> Result<(), CudaError> {
        if self.fresh {
            self.clear_grads(la)?;
        }
        self.fresh = false;
        let d = self.dims(rows);
        let (dw, db) = (&mut self.weight.grad, &mut self.bias.grad);
        products::backward_weight(la, self.precision, x, dz, dw, db, d)
    }

    fn clear_grads(&mut self, la: &Launcher) -> Result<(), CudaError> {
        let s = la.stream();
        s.memset_zeros(&mut self.weight.grad)
            .and_then(|_| s.memset_zeros(&mut self.bias.grad))
            .map_err(CudaError::driver("cuMemsetD8Async (gradients)"))
    }

    /// Starts a new accumulation: the gradients count as zero from now on.
    pub fn zero_grad(&mut self) {
        self.fresh = true;
    }

    /// Applies step `t` (from 1) of `opt` (a layer no microbatch reached has a zero gradient).
    pub fn update(&mut self, la: &Launcher, opt: &Optimizer, t: u32) -> Result<(), CudaError> {
        if self.fresh {
            self.clear_grads(la)?;
        }
        self.weight.update(la, opt, t)?;
        self.bias.update(la, opt, t)?;
        self.refresh_bf16(la)
    }

    /// `true` when both buffers are BF16 and the products read BF16: no conversion is needed.
    fn reads_bf16(&self, a: &DeviceStored, b: Option<&DeviceStored>) -> bool {
        self.precision == Precision::Bf16
            && a.dtype() == ActivationDtype::Bf16
            && b.is_none_or(|b| b.dtype() == ActivationDtype::Bf16)
    }

    /// `F` on a stored `x`: `Y` and (when backward needs it) `Z`, stored as `store`.
    pub fn forward_stored(
        &self,
        la: &Launcher,
        x: &DeviceStored,
        rows: usize,
        store: ActivationDtype,
    ) -> Result<(DeviceStored, Option<DeviceStored>), CudaError> {
        if let (DeviceStored::Bf16(x16), true) = (x, self.reads_bf16(x, None)) {
            if store == ActivationDtype::Bf16 {
                let (y, z) = products::forward_bf16(
                    la,
                    &self.weights(),
                    x16,
                    self.keeps_pre_activation(),
                    self.dims(rows),
                )?;
                return Ok((DeviceStored::Bf16(y), z.map(DeviceStored::Bf16)));
            }
        }
        let (y, z) = self.forward(la, &*x.widen(la)?, rows)?;
        let z = z.map(|z| DeviceStored::store(la, store, z)).transpose()?;
        Ok((DeviceStored::store(la, store, y)?, z))
    }

    /// `I` on stored `dY` and `Z` (both consumed): `dZ = dY act'(Z)` stored as `store`, and when
    /// `want_input`, `dX = dZ W^T` from the stored `dZ`, stored as `store` (for `f32` storage, the
    /// fused kernel: [`DeviceLinear::backward_input`]).
    pub fn backward_input_stored(
        &self,
        la: &Launcher,
        dy: DeviceStored,
        z: Option<DeviceStored>,
        rows: usize,
        want_input: bool,
        store: ActivationDtype,
    ) -> Result<StoredInputGrad, CudaError> {
        if store == ActivationDtype::F32 {
            // f32 storage: the fused kernel computes dZ and dX in one pass, as before.
            let z = z.map(|z| z.into_f32(la)).transpose()?;
            let out = self.backward_input(la, dy.into_f32(la)?, z, rows, want_input)?;
            return Ok(StoredInputGrad {
                dz: DeviceStored::F32(out.dz),
                dx: out.dx.map(DeviceStored::F32),
            });
        }
        let z = z.filter(|_| self.keeps_pre_activation());
        let direct = want_input && self.reads_bf16(&dy, z.as_ref());
        if let (true, DeviceStored::Bf16(dy16)) = (direct, &dy) {
            let z16 = match &z {
                Some(DeviceStored::Bf16(z16)) => Some(z16),
                _ => None,
            };
            let (dz16, dx16) =
                products::backward_input_bf16(la, &self.weights(), dy16, z16, self.dims(rows))?;
            return Ok(StoredInputGrad {
                dz: dz16.map_or(dy, DeviceStored::Bf16),
                dx: Some(DeviceStored::Bf16(dx16)),
            });
        }
        // dZ first, rounded as stored; then dX from the stored dZ (the identity's dZ is dY).
        let dz = match z {
            None => dy,
            Some(z) => {
                let (dyf, zf) = (dy.widen(la)?, z.widen(la)?);
                let mut dz = products::alloc::<f32>(la, dyf.len())?;
                la.activation_backward(&dyf, &zf, &mut dz, self.activation)?;
                DeviceStored::store(la, store, dz)?
            }
        };
        if !want_input {
            return Ok(StoredInputGrad { dz, dx: None });
        }
        let identity = LinearDims {
            act: Activation::Identity,
            ..self.dims(rows)
        };
        let dzf = dz.widen(la)?;
        let dx = products::input_grad(la, self.precision, &self.weights(), &dzf, identity)?;
        drop(dzf);
        let dx = DeviceStored::store(la, store, dx)?;
        Ok(StoredInputGrad { dz, dx: Some(dx) })
    }

    /// `W` on stored `X` and `dZ`: `dW += X^T dZ`, `db += colsum(dZ)`.
    pub fn backward_weight_stored(
        &mut self,
        la: &Launcher,
        x: &DeviceStored,
        dz: &DeviceStored,
        rows: usize,
    ) -> Result<(), CudaError> {
        if let (DeviceStored::Bf16(x16), DeviceStored::Bf16(dz16), Precision::Bf16) =
            (x, dz, self.precision)
        {
            if self.fresh {
                self.clear_grads(la)?;
            }
            self.fresh = false;
            let d = self.dims(rows);
            let (dw, db) = (&mut self.weight.grad, &mut self.bias.grad);
            return la.linear_backward_weight_tc(x16, dz16, dw, Some(db), d);
        }
        let (xf, dzf) = (x.widen(la)?, dz.widen(la)?);
        self.backward_weight(la, &xf, &dzf, rows)
    }

    /// Copies `(W, b)` back to the host (waits for the stream).
    pub fn parameters_to_host(&self, la: &Launcher) -> Result<HostPair, CudaError> {
        let get = |s: &CudaSlice<f32>| {
            la.stream()
                .clone_dtoh(s)
                .map_err(CudaError::driver("memcpy parameters to host"))
        };
        Ok((get(&self.weight.value)?, get(&self.bias.value)?))
    }

    /// Copies the optimizer moments back to the host: the weight's `[first, second]`, then the
    /// bias's (each empty where the optimizer has not stepped or has no such moment; waits for
    /// the stream).
    pub fn moments_to_host(&self, la: &Launcher) -> Result<[[Vec<f32>; 2]; 2], CudaError> {
        Ok([
            self.weight.moments_to_host(la)?,
            self.bias.moments_to_host(la)?,
        ])
    }

    /// Overwrites the accumulated `(dW, db)` with host values of their sizes (a data-parallel
    /// mean made on the host), enqueued on the stream.
    pub fn grads_from_host(
        &mut self,
        la: &Launcher,
        (w, b): (&[f32], &[f32]),
    ) -> Result<(), CudaError> {
        let s = la.stream();
        s.memcpy_htod(w, &mut self.weight.grad)
            .and_then(|_| s.memcpy_htod(b, &mut self.bias.grad))
            .map_err(CudaError::driver("memcpy gradients to device"))?;
        self.fresh = false;
        Ok(())
    }

    /// Copies the accumulated `(dW, db)` back to the host, or `None` when nothing accumulated since
    /// [`zero_grad`](Self::zero_grad) (waits for the stream).
    pub fn grads_to_host(&self, la: &Launcher) -> Result<Option<HostPair>, CudaError> {
        if self.fresh {
            return Ok(None);
        }
        let get = |s: &CudaSlice<f32>| {
            la.stream()
                .clone_dtoh(s)
                .map_err(CudaError::driver("memcpy gradients to host"))
        };
        Ok(Some((get(&self.weight.grad)?, get(&self.bias.grad)?)))
    }
}
