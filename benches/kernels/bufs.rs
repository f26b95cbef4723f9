//! The device buffers of one bench shape, in every format the implementations read: `f32`, BF16 as
//! `u16` (the Rust kernels) and BF16 as `half::bf16` (cuBLASLt), with the same values.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use pipefill::cuda::Launcher;

/// Operands and outputs of a linear layer `rows x inputs -> outputs`.
pub struct Bufs {
    pub x: CudaSlice<f32>,
    pub w: CudaSlice<f32>,
    pub b: CudaSlice<f32>,
    pub y: CudaSlice<f32>,
    /// Pre-activation (forward output when kept; backward input).
    pub z: CudaSlice<f32>,
    pub dy: CudaSlice<f32>,
    pub dz: CudaSlice<f32>,
    pub dx: CudaSlice<f32>,
    pub dw: CudaSlice<f32>,
    pub db: CudaSlice<f32>,
    pub x16: CudaSlice<u16>,
    pub w16: CudaSlice<u16>,
    pub y16: CudaSlice<u16>,
    pub z16: CudaSlice<u16>,
    pub dy16: CudaSlice<u16>,
    pub dz16: CudaSlice<u16>,
    pub dx16: CudaSlice<u16>,
    pub xh: CudaSlice<bf16>,
    pub wh: CudaSlice<bf16>,
    pub bh: CudaSlice<bf16>,
    pub yh: CudaSlice<bf16>,
}

/// `n` values in `[-a, a)` from a fixed sequence.
fn values(n: usize, a: f32, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            a * ((s >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        })
        .collect()
}

/// The same bits seen as `half::bf16` (consumes `s`; the allocation moves over).
fn as_half(stream: &Arc<CudaStream>, s: CudaSlice<u16>) -> CudaSlice<bf16> {
    let len = s.len();
    // SAFETY: `u16` and `bf16` have the same size and any bits are a valid `bf16`; `leak` hands over
    // the allocation, which the new slice frees on the same stream.
    unsafe { stream.upgrade_device_ptr(s.leak(), len) }
}

impl Bufs {
    /// Buffers for `(rows, inputs, outputs)` on the launcher's stream.
    pub fn new(
        la: &Launcher,
        (rows, inputs, outputs): (usize, usize, usize),
    ) -> Result<Self, String> {
        let s = la.stream();
        let e = |e: cudarc::driver::DriverError| format!("bench buffers: {e}");
        let up = |n: usize, a: f32, seed: u64| s.clone_htod(&values(n, a, seed)).map_err(e);
        let scale = 1.0 / (inputs.max(1) as f32).sqrt();
        let (x, w, b) = (
            up(rows * inputs, 1.0, 1)?,
            up(inputs * outputs, scale, 2)?,
            up(outputs, 0.1, 3)?,
        );
        let (z, dy) = (up(rows * outputs, 2.0, 4)?, up(rows * outputs, 1.0, 5)?);
        let zeros = |n: usize| s.alloc_zeros::<f32>(n).map_err(e);
        let c = |v: &CudaSlice<f32>| la.to_bf16(v).map_err(|e| e.to_string());
        let zeros16 = |n: usize| s.alloc_zeros::<u16>(n).map_err(e);
        Ok(Bufs {
            x16: c(&x)?,
            w16: c(&w)?,
            z16: c(&z)?,
            dy16: c(&dy)?,
            y16: zeros16(rows * outputs)?,
            dz16: zeros16(rows * outputs)?,
            dx16: zeros16(rows * inputs)?,
            xh: as_half(s, c(&x)?),
            wh: as_half(s, c(&w)?),
            bh: as_half(s, c(&b)?),
            yh: as_half(s, zeros16(rows * outputs)?),
            y: zeros(rows * outputs)?,
            dz: zeros(rows * outputs)?,
            dx: zeros(rows * inputs)?,
            dw: zeros(inputs * outputs)?,
            db: zeros(outputs)?,
            x,
            w,
            b,
            z,
            dy,
        })
    }
}
