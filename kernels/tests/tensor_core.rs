//! The tensor-core intrinsics' host emulation (`common::tc`) against the PTX ISA's fragment tables, the
//! deferred `cp.async`, and the TF32 / BF16 conversions. The kernels themselves: `tensor_core_linear.rs`.

mod common;

use common::tc::{launch_tc, TcGrid};
use common::{Rng, Shared};
use pipefill_kernels::entry;
use pipefill_kernels::grid::Grid;
use pipefill_kernels::tc::convert::{bf16_to_f32, f32_to_bf16, pack_bf16, to_tf32};
use pipefill_kernels::tc::{
    entry_name, launch, Launch, Precision, Product, TensorCore, MAX_SHARED_BYTES,
};

const EPS: f64 = f32::EPSILON as f64;

/// One block with `bytes` of dynamic shared memory.
fn one_block(bytes: u32) -> Launch {
    Launch {
        grid: (1, 1, 1),
        block: (256, 1, 1),
        shared_bytes: bytes,
    }
}

/// The fragment tables of the PTX ISA, written out directly: `(row, col)` of register `r` (and half `h`
/// for BF16) of lane (`g`, `t`).
fn tf32_a(g: usize, t: usize, r: usize) -> (usize, usize) {
    (g + 8 * (r & 1), t + 4 * (r >> 1))
}
fn tf32_b(g: usize, t: usize, r: usize) -> (usize, usize) {
    (t + 4 * r, g)
}
fn bf16_a(g: usize, t: usize, r: usize, h: usize) -> (usize, usize) {
    (g + 8 * (r & 1), 2 * t + h + 8 * (r >> 1))
}
fn bf16_b(g: usize, t: usize, r: usize, h: usize) -> (usize, usize) {
    (2 * t + h + 8 * r, g)
}
fn acc_c(g: usize, t: usize, r: usize) -> (usize, usize) {
    (g + 8 * (r >> 1), 2 * t + (r & 1))
}

/// Runs one `mma` per warp with fragments built from the tables and checks `D = A B + C` in every warp.
fn check_mma(k: usize, bf16: bool) {
    let mut rng = Rng::new(71 + k as u64);
    let round = |x: f32| {
        if bf16 {
            bf16_to_f32(f32_to_bf16(x))
        } else {
            f32::from_bits(to_tf32(x))
        }
    };
    let a: Vec<f32> = rng.vec(16 * k, -2.0, 2.0).into_iter().map(round).collect();
    let b: Vec<f32> = rng.vec(k * 8, -2.0, 2.0).into_iter().map(round).collect();
    let c = rng.vec(16 * 8, -1.0, 1.0);
    let mut d = vec![f32::NAN; 8 * 16 * 8];
    let out = Shared(d.as_mut_ptr());
    launch_tc(one_block(16), |gr: &TcGrid| {
        let (g, t) = (gr.lane() >> 2, gr.lane() % 4);
        let fa: [u32; 4] = std::array::from_fn(|r| {
            if bf16 {
                let at = |h| bf16_a(g, t, r, h);
                let v = |(i, p): (usize, usize)| f32_to_bf16(a[i * k + p]);
                pack_bf16(v(at(0)), v(at(1)))
            } else {
                let (i, p) = tf32_a(g, t, r);
                a[i * k + p].to_bits()
            }
        });
        let fb: [u32; 2] = std::array::from_fn(|r| {
            if bf16 {
                let at = |h| bf16_b(g, t, r, h);
                let v = |(p, j): (usize, usize)| f32_to_bf16(b[p * 8 + j]);
                pack_bf16(v(at(0)), v(at(1)))
            } else {
                let (p, j) = tf32_b(g, t, r);
                b[p * 8 + j].to_bits()
            }
        });
        let fc: [f32; 4] = std::array::from_fn(|r| {
            let (i, j) = acc_c(g, t, r);
            c[i * 8 + j]
        });
        let fd = if bf16 {
            gr.mma_bf16(fa, fb, fc)
        } else {
            gr.mma_tf32(fa, fb, fc)
        };
        let warp = gr.thread() / 32;
        for (r, v) in fd.into_iter().enumerate() {
            let (i, j) = acc_c(g, t, r);
            // SAFETY: each (warp, i, j) is written by one lane.
            unsafe { out.get().add(warp * 128 + i * 8 + j).write(v) };
        }
    });
    for warp in 0..8 {
        for i in 0..16 {
            for j in 0..8 {
                let want: f64 = f64::from(c[i * 8 + j])
                    + (0..k)
                        .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * 8 + j]))
                        .sum::<f64>();
                let got = f64::from(d[warp * 128 + i * 8 + j]);
                assert!(
                    (got - want).abs() <= EPS * want.abs(),
                    "mma k={k} bf16={bf16} warp {warp} D[{i}][{j}]: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn mma_follows_the_ptx_fragment_tables() {
    check_mma(8, false);
    check_mma(16, true);
}

#[test]
fn tf32_ignores_the_low_mantissa_bits() {
    // A = 1 + 2^-12 (not a TF32 value) times B = 1: the MMA sees 1.
    let mut d = vec![0.0f32; 256];
    let out = Shared(d.as_mut_ptr());
    launch_tc(one_block(16), |gr: &TcGrid| {
        let x = (1.0f32 + 1.0 / 4096.0).to_bits();
        let (g, t) = (gr.lane() >> 2, gr.lane() % 4);
        let a: [u32; 4] = std::array::from_fn(|r| {
            let (i, p) = tf32_a(g, t, r);
            if i == p {
                x
            } else {
                0
            }
        });
        let b: [u32; 2] = std::array::from_fn(|r| {
            let (p, j) = tf32_b(g, t, r);
            if p == j {
                1.0f32.to_bits()
            } else {
                0
            }
        });
        let v = gr.mma_tf32(a, b, [0.0; 4]);
        // SAFETY: one slot per thread.
        unsafe { out.get().add(gr.thread()).write(v[0]) };
    });
    // Lane 0 of each warp holds D[0][0] = A[0][0] B[0][0].
    assert_eq!(d[0], 1.0);
    assert_eq!(to_tf32(1.0 + 1.0 / 4096.0), 1.0f32.to_bits());
}

#[test]
fn ldmatrix_follows_the_ptx_layout() {
    // Four 8 x 8 matrices of u16, matrix j row i at shared offset (8 j + i) * 32 bytes, element value
    // 1000 j + 10 i + col.
    for trans in [false, true] {
        let mut d = vec![0u32; 256 * 4];
        let out = Shared(d.as_mut_ptr());
        launch_tc(one_block(32 * 32), |gr: &TcGrid| {
            if gr.thread() < 32 {
                let (j, i) = (gr.thread() / 8, gr.thread() % 8);
                for col in 0..8u32 {
                    // SAFETY: inside the 1024 bytes.
                    unsafe {
                        gr.sts16(
                            ((8 * j + i) * 32) as u32 + 2 * col,
                            (1000 * j + 10 * i) as u16 + col as u16,
                        )
                    };
                }
            }
            gr.sync_threads();
            let row_off = (gr.lane() * 32) as u32;
            // SAFETY: every lane gives a 16-byte aligned row inside the memory.
            let v = unsafe {
                if trans {
                    gr.ldmatrix_x4::<true>(row_off)
                } else {
                    gr.ldmatrix_x4::<false>(row_off)
                }
            };
            for (j, w) in v.into_iter().enumerate() {
                // SAFETY: one slot per thread and register.
                unsafe { out.get().add(gr.thread() * 4 + j).write(w) };
            }
        });
        for thread in 0..256 {
            let (g, t) = ((thread % 32) >> 2, thread % 4);
            for j in 0..4 {
                let elem = |row: usize, col: usize| (1000 * j + 10 * row + col) as u32;
                let want = if trans {
                    elem(2 * t, g) | (elem(2 * t + 1, g) << 16)
                } else {
                    elem(g, 2 * t) | (elem(g, 2 * t + 1) << 16)
                };
                assert_eq!(
                    d[thread * 4 + j],
                    want,
                    "trans={trans} thread {thread} matrix {j}"
                );
            }
        }
    }
}

#[test]
fn cp_async_lands_only_at_its_wait() {
    let src: Vec<u128> = vec![0x0403_0201_0807_0605_0c0b_0a09_100f_0e0d, 0];
    let mut seen = [0u32; 4];
    let out = Shared(seen.as_mut_ptr());
    let src_ptr = Shared(src.as_ptr().cast::<u8>());
    launch_tc(one_block(64), |gr: &TcGrid| {
        if gr.thread() == 0 {
            // SAFETY: 16 aligned bytes in both.
            unsafe {
                gr.cp_async16(0, *src_ptr.get(), 16);
                gr.cp_async_commit();
                gr.cp_async16(16, *src_ptr.get(), 0);
                gr.cp_async_commit();
                out.get().write(gr.lds32(0));
                gr.cp_async_wait::<1>();
                out.get().add(1).write(gr.lds32(0));
                out.get().add(2).write(gr.lds32(16));
                gr.cp_async_wait::<0>();
                out.get().add(3).write(gr.lds32(16));
            }
        }
    });
    assert_eq!(seen, [u32::MAX, 0x100f_0e0d, u32::MAX, 0]);
}

#[test]
fn conversions_round_as_the_cvt_instructions() {
    // TF32: ties away from zero.
    assert_eq!(to_tf32(f32::from_bits(0x3f80_1000)), 0x3f80_2000);
    assert_eq!(to_tf32(f32::from_bits(0xbf80_1000)), 0xbf80_2000);
    assert_eq!(to_tf32(f32::from_bits(0x3f80_0fff)), 0x3f80_0000);
    // BF16: ties to even.
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    assert!(f32::from_bits(to_tf32(f32::NAN)).is_nan());
    assert_eq!(bf16_to_f32(f32_to_bf16(-2.5)), -2.5);
}

#[test]
fn launch_shapes_cover_the_output_and_fit_the_gpus() {
    let products = [
        Product::Forward,
        Product::BackwardInput,
        Product::BackwardWeight,
    ];
    let mut names = Vec::new();
    for precision in [Precision::Tf32, Precision::Bf16] {
        for product in products {
            // rows 300, inputs 129, outputs 1000: outputs 300 x 1000, 300 x 129, 129 x 1000.
            let l = launch(product, precision, 300, 129, 1000);
            let want = match product {
                Product::Forward => (8, 3, 1),
                Product::BackwardInput => (2, 3, 1),
                Product::BackwardWeight => (8, 3, 1),
            };
            assert_eq!(l.grid, want, "{product:?} {precision:?}");
            assert_eq!(l.block, (256, 1, 1));
            // Over the 48 KiB default (the launcher must opt in), within sm_80's 163 KiB per block.
            assert!(l.shared_bytes > 48 << 10 && l.shared_bytes as usize <= MAX_SHARED_BYTES);
            // Empty sizes still give a launchable grid.
            assert_eq!(launch(product, precision, 0, 0, 0).grid, (1, 1, 1));
            names.push(entry_name(product, precision));
        }
    }
    names.sort();
    let mut listed = entry::TENSOR_CORE.to_vec();
    listed.sort();
    assert_eq!(names, listed, "entry_name covers entry::TENSOR_CORE");
}
