//! Typed launches of the embedded kernels ([`crate::ptx::entry`]): each checks its buffers' sizes
//! against the dimensions, converts sizes to the kernels' `u32` arguments, picks the launch shape of
//! `kernels/src/grid.rs` and enqueues the kernel on the stream. Nothing waits: the work is ordered
//! on the stream only.
//!
//! Argument orders and meanings are the kernels' (`kernels/src/entry.rs`,
//! `kernels/src/device/`); optional pointers are passed as 0 (null).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use pipefill_kernels::{elementwise_grid, gemm_grid, Activation, AdamWStep, SgdMomentum, THREADS};

use super::device::Gpu;
use super::error::{arg_u32, CudaError};
use super::tensor::address;
use crate::ptx::entry;

/// One kernel argument, by value (pointers as device addresses).
#[derive(Debug, Clone, Copy)]
pub(super) enum Arg {
    Ptr(u64),
    U32(u32),
    F32(f32),
}

/// The sizes of a linear layer's kernels and its activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearDims {
    /// Rows (the microbatch size).
    pub rows: usize,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
    /// The fused activation.
    pub act: Activation,
}

/// Launches kernels on one stream of one device.
#[derive(Debug, Clone)]
pub struct Launcher {
    gpu: Arc<Gpu>,
    stream: Arc<CudaStream>,
}

/// `slice` must hold exactly `n` values.
pub(super) fn need<T>(what: &str, slice: Option<&CudaSlice<T>>, n: usize) -> Result<(), CudaError> {
    let got = slice.map_or(0, CudaSlice::len);
    if got == n {
        Ok(())
    } else {
        Err(CudaError::Shape {
            what: what.to_string(),
            expected: n,
            got,
        })
    }
}

impl Launcher {
    /// Launches on `stream` of `gpu`.
    pub fn new(gpu: Arc<Gpu>, stream: Arc<CudaStream>) -> Self {
        Launcher { gpu, stream }
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The stream kernels go to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub(super) fn ptr<T>(&self, s: Option<&CudaSlice<T>>) -> Arg {
        Arg::Ptr(address(s, &self.stream))
    }

    /// Enqueues kernel `name` with `args` on a grid of blocks of [`THREADS`] threads.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list and every pointer must be valid for what the
    /// kernel reads and writes (the typed methods check the sizes).
    unsafe fn launch(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        args: &[Arg],
    ) -> Result<(), CudaError> {
        self.launch_shared(name, grid, 0, args)
    }

    /// [`Launcher::launch`] with `shared_bytes` of dynamic shared memory per block; a kernel asking for
    /// more than the default 48 KiB has its limit raised once ([`super::tc_launch`]).
    ///
    /// # Safety
    /// As for [`Launcher::launch`].
    pub(super) unsafe fn launch_shared(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        shared_bytes: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let f = self.gpu.function(name)?;
        if shared_bytes > super::tc_launch::DEFAULT_SHARED_BYTES {
            super::tc_launch::allow_shared(&self.gpu, name, &f, shared_bytes)?;
        }
        let mut b = self.stream.launch_builder(&f);
        for a in args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::U32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: shared_bytes,
        };
        b.launch(cfg)
            .map(|_| ())
            .map_err(CudaError::driver(format!("launch {name}")))
    }

    pub(super) fn dims(d: &LinearDims) -> Result<[Arg; 3], CudaError> {
        Ok([
            Arg::U32(arg_u32("rows", d.rows)?),
            Arg::U32(arg_u32("inputs", d.inputs)?),
            Arg::U32(arg_u32("outputs", d.outputs)?),
        ])
    }

    /// The checked argument list of a forward kernel (the SIMT one and the tensor-core ones take the
    /// same list); `tag` ends every size-error label (`""`, `" (tf32)"`, `" (bf16)"`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward_args<E>(
        &self,
        tag: &str,
        x: &CudaSlice<E>,
        w: &CudaSlice<E>,
        b: &CudaSlice<f32>,
        y: &CudaSlice<E>,
        z: Option<&CudaSlice<E>>,
        d: &LinearDims,
    ) -> Result<[Arg; 9], CudaError> {
        let l = |what: &str| format!("{what}{tag}");
        need(&l("linear forward x"), Some(x), d.rows * d.inputs)?;
        need(&l("linear forward w"), Some(w), d.inputs * d.outputs)?;
        need(&l("linear forward b"), Some(b), d.outputs)?;
        need(&l("linear forward y"), Some(y), d.rows * d.outputs)?;
        if let Some(z) = z {
            need(&l("linear forward z"), Some(z), d.rows * d.outputs)?;
        }
        let [r, i, o] = Self::dims(d)?;
        Ok([
            self.ptr(Some(x)),
            self.ptr(Some(w)),
            self.ptr(Some(b)),
            self.ptr(Some(y)),
            self.ptr(z),
            r,
            i,
            o,
            Arg::U32(d.act.code()),
        ])
    }

    /// The checked argument list of an input-gradient kernel (`z` may be `None` only for the
    /// identity); `tag` as for [`Launcher::forward_args`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward_input_args<E>(
        &self,
        tag: &str,
        dy: &CudaSlice<E>,
        z: Option<&CudaSlice<E>>,
        w: &CudaSlice<E>,
        dx: &CudaSlice<E>,
        dz: Option<&CudaSlice<E>>,
        d: &LinearDims,
    ) -> Result<[Arg; 9], CudaError> {
        let l = |what: &str| format!("{what}{tag}");
        let n_out = d.rows * d.outputs;
        need(&l("linear backward dy"), Some(dy), n_out)?;
        match z {
            Some(z) => need(&l("linear backward z"), Some(z), n_out)?,
            None if d.act != Activation::Identity => need::<E>(
                &l("linear backward z (needed by the activation)"),
                None,
                n_out,
            )?,
            None => {}
        }
        need(&l("linear backward w"), Some(w), d.inputs * d.outputs)?;
        need(&l("linear backward dx"), Some(dx), d.rows * d.inputs)?;
        if let Some(dz) = dz {
            need(&l("linear backward dz"), Some(dz), n_out)?;
        }
        let [r, i, o] = Self::dims(d)?;
        Ok([
            self.ptr(Some(dy)),
            self.ptr(z),
            self.ptr(Some(w)),
            self.ptr(Some(dx)),
            self.ptr(dz),
            r,
            i,
            o,
            Arg::U32(d.act.code()),
        ])
    }

    /// The checked argument list of a weight-gradient kernel (`dw`, `db` in `f32`); `tag` as for
    /// [`Launcher::forward_args`].
    pub(super) fn backward_weight_args<E>(
        &self,
        tag: &str,
        x: &CudaSlice<E>,
        dz: &CudaSlice<E>,
        dw: &CudaSlice<f32>,
        db: Option<&CudaSlice<f32>>,
        d: &LinearDims,
    ) -> Result<[Arg; 7], CudaError> {
        let l = |what: &str| format!("{what}{tag}");
        need(&l("weight gradient x"), Some(x), d.rows * d.inputs)?;
        need(&l("weight gradient dz"), Some(dz), d.rows * d.outputs)?;
        need(&l("weight gradient dw"), Some(dw), d.inputs * d.outputs)?;
        if let Some(db) = db {
            need(&l("weight gradient db"), Some(db), d.outputs)?;
        }
        let [r, i, o] = Self::dims(d)?;
        Ok([
            self.ptr(Some(x)),
            self.ptr(Some(dz)),
            self.ptr(Some(dw)),
            self.ptr(db),
            r,
            i,
            o,
        ])
    }

    /// `y = act(x w + b)`, storing `z = x w + b` when given ([`entry::LINEAR_FORWARD`]).
    pub fn linear_forward(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        z: Option<&mut CudaSlice<f32>>,
        d: LinearDims,
    ) -> Result<(), CudaError> {
        let args = self.forward_args("", x, w, b, y, z.as_deref(), &d)?;
        // SAFETY: the argument list is the kernel's; every buffer's size was checked.
        unsafe { self.launch(entry::LINEAR_FORWARD, gemm_grid(d.rows, d.outputs), &args) }
    }

    /// `dz = dy act'(z)`, `dx = dz w^T`, storing `dz` when given ([`entry::LINEAR_BACKWARD_INPUT`]).
    /// `z` may be `None` only for the identity.
    pub fn linear_backward_input(
        &self,
        dy: &CudaSlice<f32>,
        z: Option<&CudaSlice<f32>>,
        w: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
        dz: Option<&mut CudaSlice<f32>>,
        d: LinearDims,
    ) -> Result<(), CudaError> {
        let args = self.backward_input_args("", dy, z, w, dx, dz.as_deref(), &d)?;
        // SAFETY: as in `linear_forward`.
        unsafe {
            self.launch(
                entry::LINEAR_BACKWARD_INPUT,
                gemm_grid(d.rows, d.inputs),
                &args,
            )
        }
    }

    /// `dw += x^T dz`, and `db += colsum(dz)` when given ([`entry::LINEAR_BACKWARD_WEIGHT`]).
    pub fn linear_backward_weight(
        &self,
        x: &CudaSlice<f32>,
        dz: &CudaSlice<f32>,
        dw: &mut CudaSlice<f32>,
        db: Option<&mut CudaSlice<f32>>,
        d: LinearDims,
    ) -> Result<(), CudaError> {
        let args = self.backward_weight_args("", x, dz, dw, db.as_deref(), &d)?;
        // SAFETY: as in `linear_forward`.
        unsafe {
            self.launch(
                entry::LINEAR_BACKWARD_WEIGHT,
                gemm_grid(d.inputs, d.outputs),
                &args,
            )
        }
    }

    /// `y = act(z)` over `z.len()` values ([`entry::ACTIVATION_FORWARD`]).
    pub fn activation_forward(
        &self,
        z: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        act: Activation,
    ) -> Result<(), CudaError> {
        let n = z.len();
        need("activation output", Some(y), n)?;
        let args = [
            self.ptr(Some(z)),
            self.ptr(Some(y)),
            Arg::U32(arg_u32("n", n)?),
            Arg::U32(act.code()),
        ];
        // SAFETY: as in `linear_forward`.
        unsafe { self.launch(entry::ACTIVATION_FORWARD, elementwise_grid(n), &args) }
    }

    /// `dz = dy act'(z)` over `dy.len()` values ([`entry::ACTIVATION_BACKWARD`]).
    pub fn activation_backward(
        &self,
        dy: &CudaSlice<f32>,
        z: &CudaSlice<f32>,
        dz: &mut CudaSlice<f32>,
        act: Activation,
    ) -> Result<(), CudaError> {
        let n = dy.len();
        need("activation backward z", Some(z), n)?;
        need("activation backward dz", Some(dz), n)?;
        let args = [
            self.ptr(Some(dy)),
            self.ptr(Some(z)),
            self.ptr(Some(dz)),
            Arg::U32(arg_u32("n", n)?),
            Arg::U32(act.code()),
        ];
        // SAFETY: as in `linear_forward`.
        unsafe { self.launch(entry::ACTIVATION_BACKWARD, elementwise_grid(n), &args) }
    }

    /// Blocks of the MSE forward over `n` values: the length `partial` must have.
    pub fn mse_partials(n: usize) -> usize {
        elementwise_grid(n).0 as usize
    }

    /// Per-block sums of `(pred - target)^2` into `partial` ([`entry::MSE_FORWARD`];
    /// [`Launcher::mse_partials`] values).
    pub fn mse_forward(
        &self,
        pred: &CudaSlice<f32>,
        target: &CudaSlice<f32>,
        partial: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let n = pred.len();
        need("MSE target", Some(target), n)?;
        need("MSE partial sums", Some(partial), Self::mse_partials(n))?;
        let args = [
            self.ptr(Some(pred)),
            self.ptr(Some(target)),
            Arg::U32(arg_u32("n", n)?),
            self.ptr(Some(partial)),
        ];
        // SAFETY: as in `linear_forward`.
        unsafe { self.launch(entry::MSE_FORWARD, elementwise_grid(n), &args) }
    }

    /// `grad = 2 (pred - target) inv_norm` ([`entry::MSE_GRAD`]).
    pub fn mse_grad(
        &self,
        pred: &CudaSlice<f32>,
        target: &CudaSlice<f32>,
        grad: &mut CudaSlice<f32>,
        inv_norm: f32,
    ) -> Result<(), CudaError> {
        let n = pred.len();
        need("MSE target", Some(target), n)?;
        need("MSE gradient", Some(grad), n)?;
        let args = [
            self.ptr(Some(pred)),
            self.ptr(Some(target)),
            self.ptr(Some(grad)),
            Arg::U32(arg_u32("n", n)?),
            Arg::F32(inv_norm),
        ];
        // SAFETY: as in `linear_forward`.
        unsafe { self.launch(entry::MSE_GRAD, elementwise_grid(n), &args) }
    }

    /// Per-row softmax cross-entropy of `logits` (`rows x classes`) against `targets`
    /// ([`entry::SOFTMAX_CE_FORWARD`]).
    pub fn softmax_ce_forward(
        &self,
        logits: &CudaSlice<f32>,
        targets: &impl DevicePtr<u32>,
        classes: usize,
        row_loss: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let rows = targets.len();
        need("cross-entropy logits", Some(logits), rows * classes)?;
        need("cross-entropy row losses", Some(row_loss), rows)?;
        let targets_at = Arg::Ptr(targets.device_ptr(&self.stream).0);
        let args = [
            self.ptr(Some(logits)),
            targets_at,
            Arg::U32(arg_u32("rows", rows)?),
            Arg::U32(arg_u32("classes", classes)?),
            self.ptr(Some(row_loss)),
        ];
        // SAFETY: as in `linear_forward`.
        unsafe { self.launch(entry::SOFTMAX_CE_FORWARD, elementwise_grid(rows), &args) }
    }

    /// `grad = scale (softmax(logits) - onehot(targets))` ([`entry::SOFTMAX_CE_GRAD`]).
    pub fn softmax_ce_grad(
        &self,
        logits: &CudaSlice<f32>,
        targets: &impl DevicePtr<u32>,
        grad: &mut CudaSlice<f32>,
        classes: usize,
        scale: f32,
    ) -> Result<(), CudaError> {
        let rows = targets.len();
        need("cross-entropy logits", Some(logits), rows * classes)?;
        need("cross-entropy gradient", Some(grad), rows * classes)?;
        let targets_at = Arg::Ptr(targets.device_ptr(&self.stream).0);
        let args = [
            self.ptr(Some(logits)),
            targets_at,
            self.ptr(Some(grad)),
            Arg::U32(arg_u32("rows", rows)?),
            Arg::U32(arg_u32("classes", classes)?),
            Arg::F32(scale),
        ];
        // SAFETY: as in `linear_forward`.
        unsafe { self.launch(entry::SOFTMAX_CE_GRAD, elementwise_grid(rows), &args) }
    }

    /// `out = s x` over `x.len()` values, exactly as the host's `Tensor::scale` rounds (the MSE
    /// gradient kernel against the device's cached zeros with `inv_norm = s / 2`:
    /// `2 (x - 0) (s / 2)` is the one rounding of `x s` when `s / 2` is exact, as for `1 / M`).
    pub fn scale(
        &self,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        s: f32,
    ) -> Result<(), CudaError> {
        let n = x.len();
        need("scaled output", Some(out), n)?;
        let zeros = self.gpu.zeros(n)?;
        let args = [
            self.ptr(Some(x)),
            Arg::Ptr(zeros),
            self.ptr(Some(out)),
            Arg::U32(arg_u32("n", n)?),
            Arg::F32(s / 2.0),
        ];
        // SAFETY: MSE_GRAD's argument list; `zeros` holds at least `n` zeros for the life of the
        // device (never freed, never written).
        unsafe { self.launch(entry::MSE_GRAD, elementwise_grid(n), &args) }
    }

    /// One SGD-with-momentum update of `p` and its velocity `v` ([`entry::SGD_MOMENTUM`]).
    pub fn sgd_momentum(
        &self,
        p: &mut CudaSlice<f32>,
        grad: &CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        opt: &SgdMomentum,
    ) -> Result<(), CudaError> {
        let n = p.len();
        need("SGD gradient", Some(grad), n)?;
        need("SGD velocity", Some(v), n)?;
        let args = [
            self.ptr(Some(p)),
            self.ptr(Some(grad)),
            self.ptr(Some(v)),
            Arg::U32(arg_u32("n", n)?),
            Arg::F32(opt.lr),
            Arg::F32(opt.momentum),
            Arg::F32(opt.weight_decay),
        ];
        // SAFETY: as in `linear_forward`.
        unsafe { self.launch(entry::SGD_MOMENTUM, elementwise_grid(n), &args) }
    }

    /// One AdamW step of `p` and its moments `m`, `v` ([`entry::ADAMW`]).
    pub fn adamw(
        &self,
        p: &mut CudaSlice<f32>,
        grad: &CudaSlice<f32>,
        m: &mut CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        step: &AdamWStep,
    ) -> Result<(), CudaError> {
        let n = p.len();
        need("AdamW gradient", Some(grad), n)?;
        need("AdamW first moment", Some(m), n)?;
        need("AdamW second moment", Some(v), n)?;
        let args = [
            self.ptr(Some(p)),
            self.ptr(Some(grad)),
            self.ptr(Some(m)),
            self.ptr(Some(v)),
            Arg::U32(arg_u32("n", n)?),
            Arg::F32(step.lr),
            Arg::F32(step.beta1),
            Arg::F32(step.beta2),
            Arg::F32(step.eps),
            Arg::F32(step.decay),
            Arg::F32(step.inv_bias1),
            Arg::F32(step.inv_bias2),
        ];
        // SAFETY: as in `linear_forward`.
        unsafe { self.launch(entry::ADAMW, elementwise_grid(n), &args) }
    }
}
