//! The tensor-core half of the GPU build: [`TensorCore`] for [`Nvptx`] (each method one PTX instruction on
//! the block's dynamic shared memory `pf_tc_shared`) and the six tensor-core entry points.
//! Arguments and launch shapes: [`crate::entry`] and [`crate::tc::launch`].
#![allow(clippy::too_many_arguments, clippy::missing_safety_doc)]

use core::arch::{asm, global_asm};

use super::{activation, Nvptx};
use crate::device::linear_tc::{
    linear_backward_input_tc, linear_backward_weight_tc, linear_forward_tc, TcBackwardInput,
    TcBackwardWeight, TcForward,
};
use crate::grid::Grid;
use crate::tc::warp::{GATHER_WORDS, WARP};
use crate::tc::{depth, Bf16, Precision, TensorCore, Tf32};

// The block's dynamic shared memory (its size is the launch's `shared_bytes`).
global_asm!(".extern .shared .align 16 .b8 pf_tc_shared[];");

/// The shared-window address of byte `off` of `pf_tc_shared`.
#[inline(always)]
fn smem(off: u32) -> u32 {
    let base: u32;
    // SAFETY: reads the address of a symbol.
    unsafe {
        asm!("mov.u32 {b}, pf_tc_shared;", b = out(reg32) base, options(pure, nomem, nostack))
    };
    base + off
}

// SAFETY: `pf_tc_shared` is the block's dynamic shared memory; `mma`, `ldmatrix` are `.sync.aligned`
// warp-collective instructions; `cp.async.wait_group N` waits for all but the newest N groups.
unsafe impl TensorCore for Nvptx {
    #[inline(always)]
    fn tc_shared(&self) -> *mut u8 {
        let p: *mut u8;
        // SAFETY: converts the address of the shared array to a generic pointer.
        unsafe {
            asm!("cvta.shared.u64 {p}, pf_tc_shared;", p = out(reg64) p, options(pure, nomem, nostack))
        };
        p
    }

    #[inline(always)]
    fn warp_gather(&self, _: [u32; GATHER_WORDS]) -> [[u32; GATHER_WORDS]; WARP] {
        self.trap()
    }

    #[inline(always)]
    unsafe fn cp_async16(&self, dst: u32, src: *const u8, src_bytes: u32) {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};", d = in(reg32) smem(dst), s = in(reg64) src,
            n = in(reg32) src_bytes, options(nostack));
    }

    #[inline(always)]
    fn cp_async_commit(&self) {
        // SAFETY: closes the thread's group of pending copies.
        unsafe { asm!("cp.async.commit_group;", options(nostack)) };
    }

    #[inline(always)]
    fn cp_async_wait<const N: u32>(&self) {
        // SAFETY: waits for this thread's copies.
        unsafe {
            match N {
                0 => asm!("cp.async.wait_group 0;", options(nostack)),
                1 => asm!("cp.async.wait_group 1;", options(nostack)),
                2 => asm!("cp.async.wait_group 2;", options(nostack)),
                3 => asm!("cp.async.wait_group 3;", options(nostack)),
                _ => self.trap(),
            }
        }
    }

    #[inline(always)]
    unsafe fn lds32(&self, off: u32) -> u32 {
        let v: u32;
        asm!("ld.shared.b32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) smem(off),
            options(readonly, nostack, preserves_flags));
        v
    }

    #[inline(always)]
    unsafe fn sts32(&self, off: u32, v: u32) {
        asm!("st.shared.b32 [{a}], {v};", a = in(reg32) smem(off), v = in(reg32) v, options(nostack));
    }

    #[inline(always)]
    unsafe fn sts16(&self, off: u32, v: u16) {
        asm!("st.shared.b16 [{a}], {v};", a = in(reg32) smem(off), v = in(reg16) v, options(nostack));
    }

    #[inline(always)]
    unsafe fn ldmatrix_x4<const TRANS: bool>(&self, row_off: u32) -> [u32; 4] {
        let (r0, r1, r2, r3): (u32, u32, u32, u32);
        if TRANS {
            asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{0}, {1}, {2}, {3}}}, [{a}];",
                out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3, a = in(reg32) smem(row_off),
                options(readonly, nostack));
        } else {
            asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{0}, {1}, {2}, {3}}}, [{a}];",
                out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3, a = in(reg32) smem(row_off),
                options(readonly, nostack));
        }
        [r0, r1, r2, r3]
    }

    #[inline(always)]
    fn mma_tf32(&self, a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        let [mut d0, mut d1, mut d2, mut d3] = c;
        // SAFETY: register-only warp-collective instruction; every lane of the warp executes it. Not `pure`:
        // Rust does not mark inline asm `convergent`, and a pure asm could be sunk into a divergent branch
        // (the epilogue's bounds checks), which `.sync.aligned` forbids; asm with side effects is never moved
        // across control flow.
        unsafe {
            asm!("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, {{{0}, {1}, {2}, {3}}};",
                inout(reg32) d0, inout(reg32) d1, inout(reg32) d2, inout(reg32) d3,
                in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3], in(reg32) b[0], in(reg32) b[1],
                options(nomem, nostack));
        }
        [d0, d1, d2, d3]
    }

    #[inline(always)]
    fn mma_bf16(&self, a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        let [mut d0, mut d1, mut d2, mut d3] = c;
        // SAFETY: as for `mma_tf32`.
        unsafe {
            asm!("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, {{{0}, {1}, {2}, {3}}};",
                inout(reg32) d0, inout(reg32) d1, inout(reg32) d2, inout(reg32) d3,
                in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3], in(reg32) b[0], in(reg32) b[1],
                options(nomem, nostack));
        }
        [d0, d1, d2, d3]
    }
}

const TF32_BK: usize = depth(Precision::Tf32);
const BF16_BK: usize = depth(Precision::Bf16);

/// The three entry points of one precision (forward, input gradient, weight gradient), operands and
/// stored activations of element type `$e`; gradients of weights and biases stay `f32`.
macro_rules! tc_entries {
    ($forward:ident, $input:ident, $weight:ident, $e:ty, $p:ty, $bk:ident) => {
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $forward(
            x: *const $e,
            w: *const $e,
            b: *const f32,
            y: *mut $e,
            z: *mut $e,
            rows: u32,
            inputs: u32,
            outputs: u32,
            act: u32,
        ) {
            let args = TcForward {
                x,
                w,
                b,
                y,
                z,
                rows: rows as usize,
                inputs: inputs as usize,
                outputs: outputs as usize,
                act: activation(act),
            };
            linear_forward_tc::<Nvptx, $p, $bk>(&Nvptx, &args);
        }

        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $input(
            dy: *const $e,
            z: *const $e,
            w: *const $e,
            dx: *mut $e,
            dz: *mut $e,
            rows: u32,
            inputs: u32,
            outputs: u32,
            act: u32,
        ) {
            let args = TcBackwardInput {
                dy,
                z,
                w,
                dx,
                dz,
                rows: rows as usize,
                inputs: inputs as usize,
                outputs: outputs as usize,
                act: activation(act),
            };
            linear_backward_input_tc::<Nvptx, $p, $bk>(&Nvptx, &args);
        }

        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $weight(
            x: *const $e,
            dz: *const $e,
            dw: *mut f32,
            db: *mut f32,
            rows: u32,
            inputs: u32,
            outputs: u32,
        ) {
            let args = TcBackwardWeight {
                x,
                dz,
                dw,
                db,
                rows: rows as usize,
                inputs: inputs as usize,
                outputs: outputs as usize,
            };
            linear_backward_weight_tc::<Nvptx, $p, $bk>(&Nvptx, &args);
        }
    };
}

tc_entries!(
    pf_linear_forward_tf32,
    pf_linear_backward_input_tf32,
    pf_linear_backward_weight_tf32,
    f32,
    Tf32,
    TF32_BK
);
tc_entries!(
    pf_linear_forward_bf16,
    pf_linear_backward_input_bf16,
    pf_linear_backward_weight_bf16,
    u16,
    Bf16,
    BF16_BK
);
