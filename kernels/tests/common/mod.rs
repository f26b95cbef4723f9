//! Test helpers: a small seeded random generator and error measures against `f64` references.
#![allow(dead_code)]

pub mod tc;

/// SplitMix64: tiny, seeded, good enough to draw test inputs reproducibly.
pub struct Rng(u64);

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }

    /// `len` values uniform in `[lo, hi)`.
    pub fn vec(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len).map(|_| self.uniform(lo, hi)).collect()
    }

    /// Uniform integer in `0..n`.
    pub fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % u64::from(n)) as u32
    }
}

/// The spacing of `f32` values at `r` (the unit in the last place of `r` rounded to `f32`).
pub fn ulp(r: f64) -> f64 {
    let x = (r as f32).abs();
    if x == 0.0 || x < f32::MIN_POSITIVE {
        return f64::from(f32::from_bits(1)); // smallest subnormal spacing
    }
    let next = f32::from_bits(x.to_bits() + 1);
    f64::from(next) - f64::from(x)
}

/// The error of `got` in ulps of the exact `reference`.
pub fn ulps(got: f32, reference: f64) -> f64 {
    (f64::from(got) - reference).abs() / ulp(reference)
}

/// `|got - reference| / max(|reference|, floor)`: relative error, absolute near zero.
pub fn rel(got: f32, reference: f64, floor: f64) -> f64 {
    (f64::from(got) - reference).abs() / reference.abs().max(floor)
}

/// Awkward sizes (not multiples of any tile): used by every shape-dependent test.
pub const SIZES: [usize; 6] = [1, 2, 17, 63, 64, 130];

use pipefill_kernels::Activation;

/// `act(z)` in `f64`, written from the textbook formulas, as the reference. GELU uses `1 + tanh(u)`
/// directly for `u >= 0`; for `u < 0` that cancels even in `f64` (it is `0` once `u < -19`), so there it
/// uses `1 + tanh(u) = 2 e^{2u} / (1 + e^{2u})`.
pub fn act64(act: Activation, z: f64) -> f64 {
    match act {
        Activation::Identity => z,
        Activation::Relu => z.max(0.0),
        Activation::Gelu => {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (z + 0.044715 * z * z * z);
            let one_plus_tanh = if u >= 0.0 {
                1.0 + u.tanh()
            } else {
                let e = (2.0 * u).exp();
                2.0 * e / (1.0 + e)
            };
            0.5 * z * one_plus_tanh
        }
        Activation::Silu => z / (1.0 + (-z).exp()),
    }
}

/// `act'(z)` in `f64` by differentiating [`act64`] by hand.
pub fn dact64(act: Activation, z: f64) -> f64 {
    match act {
        Activation::Identity => 1.0,
        Activation::Relu => {
            if z > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Activation::Gelu => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let u = k * (z + 0.044715 * z * z * z);
            let t = u.tanh();
            0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * z * z)
        }
        Activation::Silu => {
            let s = 1.0 / (1.0 + (-z).exp());
            s * (1.0 + z * (1.0 - s))
        }
    }
}

/// `C = op(A) op(B)` in `f64` plus, per element, `sum |a||b|` (the scale of the rounding error of an
/// `f32` dot product), for the shapes of [`pipefill_kernels::GemmShape`].
pub fn gemm64(shape: pipefill_kernels::GemmShape, a: &[f32], b: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (m, n, k) = (shape.m, shape.n, shape.k);
    let mut c = vec![0.0; m * n];
    let mut scale = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let x = f64::from(if shape.trans_a {
                    a[p * m + i]
                } else {
                    a[i * k + p]
                });
                let y = f64::from(if shape.trans_b {
                    b[j * k + p]
                } else {
                    b[p * n + j]
                });
                c[i * n + j] += x * y;
                scale[i * n + j] += (x * y).abs();
            }
        }
    }
    (c, scale)
}

/// Checks `|got - want| <= tol` elementwise with a message naming the case and index.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= tol(i),
            "{what}[{i}]: got {g}, want {w}, error {err:e} > {:e}",
            tol(i)
        );
    }
}

/// The magnitude of the argument of `exp` inside `act(z)`.
pub fn exp_argument(act: Activation, z: f32) -> f64 {
    let z = f64::from(z);
    match act {
        Activation::Identity | Activation::Relu => 0.0,
        Activation::Gelu => (2.0 * 0.797_884_6 * (z + 0.044_715 * z * z * z)).abs(),
        Activation::Silu => z.abs(),
    }
}

/// The relative error bound of `act.forward(z)`: `8 eps (1 + |arg|)`, where `arg` is the argument of `exp`
/// inside the activation. An `f32` rounding of relative size `eps` in that argument becomes a relative
/// error of `|arg| eps` in the result, so no `f32` evaluation can do much better.
pub fn forward_bound(act: Activation, z: f32) -> f64 {
    8.0 * f64::from(f32::EPSILON) * (1.0 + exp_argument(act, z))
}

use pipefill_kernels::grid::{Grid, SHARED_FLOATS, THREADS};
use std::sync::Barrier;

/// Lets kernel arguments (raw pointers) be shared by the emulated threads: the kernels' contracts, not the
/// type system, keep their accesses apart, exactly as on the GPU.
pub struct Shared<T>(pub T);
// SAFETY: test-only; every use passes buffers that outlive the launch and that the kernel bodies access
// per their documented contracts (disjoint writes, barriers between shared-memory phases).
unsafe impl<T> Sync for Shared<T> {}
unsafe impl<T> Send for Shared<T> {}
impl<T> Shared<T> {
    /// The wrapped value (a method, so closures capture the whole wrapper, not the field).
    pub fn get(&self) -> &T {
        &self.0
    }
}

/// One emulated GPU thread: its indices, its block's barrier and shared memory.
pub struct HostGrid<'a> {
    tid: usize,
    block: (usize, usize),
    grid: (usize, usize),
    barrier: &'a Barrier,
    smem: *mut f32,
}

// SAFETY: `smem` is the block's own buffer of SHARED_FLOATS floats, shared by its threads only;
// `std::sync::Barrier::wait` is a barrier over the block's THREADS threads with the needed memory ordering.
unsafe impl Grid for HostGrid<'_> {
    fn thread(&self) -> usize {
        self.tid
    }
    fn block(&self) -> (usize, usize) {
        self.block
    }
    fn block_dim(&self) -> usize {
        THREADS
    }
    fn grid_dim(&self) -> (usize, usize) {
        self.grid
    }
    fn sync_threads(&self) {
        self.barrier.wait();
    }
    fn shared(&self) -> *mut f32 {
        self.smem
    }
    fn trap(&self) -> ! {
        panic!("kernel trapped")
    }
}

/// Runs `body` as a CUDA launch of `grid` blocks of `THREADS` threads would: each block as `THREADS` OS
/// threads with a barrier and a fresh shared memory filled with NaN (so reading a slot no thread wrote
/// shows up in the results). Blocks run one after another (they never communicate).
pub fn launch(grid: (u32, u32, u32), body: impl Fn(&HostGrid) + Sync) {
    let dims = (grid.0 as usize, grid.1 as usize);
    for by in 0..dims.1 {
        for bx in 0..dims.0 {
            let mut smem = vec![f32::NAN; SHARED_FLOATS];
            let smem_ptr = Shared(smem.as_mut_ptr());
            let barrier = Barrier::new(THREADS);
            std::thread::scope(|s| {
                for tid in 0..THREADS {
                    let (body, barrier, smem_ptr) = (&body, &barrier, &smem_ptr);
                    s.spawn(move || {
                        body(&HostGrid {
                            tid,
                            block: (bx, by),
                            grid: dims,
                            barrier,
                            smem: *smem_ptr.get(),
                        })
                    });
                }
            });
        }
    }
}
