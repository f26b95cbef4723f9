//! The `extern "ptx-kernel"` entry points (only in the `nvptx64` build): each turns its PTX parameters into
//! the arguments of a body in [`crate::device`] and runs it with [`Nvptx`], the GPU's [`Grid`].
//! Names and argument orders are listed in [`crate::entry`] (a test checks that the PTX has every name).
#![allow(clippy::too_many_arguments, clippy::missing_safety_doc)]

use core::arch::nvptx;
use core::arch::{asm, global_asm};

use crate::activation::Activation;
use crate::device::{convert, elementwise, linear, reduce};
use crate::grid::{Grid, SHARED_FLOATS};
use crate::optim::{AdamWStep, SgdMomentum};

mod tc;

// The block's shared memory: a static `.shared` array at module scope (ptxas rejects one inside a function).
global_asm!(".shared .align 16 .b8 pf_shared[{bytes}];", bytes = const SHARED_FLOATS * 4);

/// The GPU's [`Grid`]: PTX special registers, `bar.sync 0`, and `pf_shared`.
struct Nvptx;

// SAFETY: `pf_shared` is per block and holds SHARED_FLOATS floats; `_syncthreads` is `bar.sync 0`, a
// block-wide barrier that orders shared and global memory accesses of the block.
unsafe impl Grid for Nvptx {
    #[inline(always)]
    fn thread(&self) -> usize {
        unsafe { nvptx::_thread_idx_x() as usize }
    }
    #[inline(always)]
    fn block(&self) -> (usize, usize) {
        unsafe {
            (
                nvptx::_block_idx_x() as usize,
                nvptx::_block_idx_y() as usize,
            )
        }
    }
    #[inline(always)]
    fn block_dim(&self) -> usize {
        unsafe { nvptx::_block_dim_x() as usize }
    }
    #[inline(always)]
    fn grid_dim(&self) -> (usize, usize) {
        unsafe { (nvptx::_grid_dim_x() as usize, nvptx::_grid_dim_y() as usize) }
    }
    #[inline(always)]
    fn sync_threads(&self) {
        unsafe { nvptx::_syncthreads() }
    }
    #[inline(always)]
    fn shared(&self) -> *mut f32 {
        let p: *mut f32;
        // SAFETY: converts the address of the static shared array to a generic pointer.
        unsafe {
            asm!("cvta.shared.u64 {p}, pf_shared;", p = out(reg64) p, options(pure, nomem, nostack))
        };
        p
    }
    #[inline(always)]
    fn trap(&self) -> ! {
        unsafe { nvptx::trap() }
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    unsafe { nvptx::trap() }
}

/// The activation with this code; traps on an unknown code rather than computing something else.
#[inline(always)]
fn activation(code: u32) -> Activation {
    match Activation::from_code(code) {
        Some(act) => act,
        None => Nvptx.trap(),
    }
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_linear_forward(
    x: *const f32,
    w: *const f32,
    b: *const f32,
    y: *mut f32,
    z: *mut f32,
    rows: u32,
    inputs: u32,
    outputs: u32,
    act: u32,
) {
    let args = linear::LinearForward {
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
    linear::linear_forward(&Nvptx, &args);
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_linear_backward_input(
    dy: *const f32,
    z: *const f32,
    w: *const f32,
    dx: *mut f32,
    dz: *mut f32,
    rows: u32,
    inputs: u32,
    outputs: u32,
    act: u32,
) {
    let args = linear::LinearBackwardInput {
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
    linear::linear_backward_input(&Nvptx, &args);
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_linear_backward_weight(
    x: *const f32,
    dz: *const f32,
    dw: *mut f32,
    db: *mut f32,
    rows: u32,
    inputs: u32,
    outputs: u32,
) {
    let args = linear::LinearBackwardWeight {
        x,
        dz,
        dw,
        db,
        rows: rows as usize,
        inputs: inputs as usize,
        outputs: outputs as usize,
    };
    linear::linear_backward_weight(&Nvptx, &args);
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_f32_to_bf16(x: *const f32, y: *mut u16, n: u32) {
    convert::f32_to_bf16_kernel(&Nvptx, x, y, n as usize);
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_bf16_to_f32(x: *const u16, y: *mut f32, n: u32) {
    convert::bf16_to_f32_kernel(&Nvptx, x, y, n as usize);
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_activation_forward(
    z: *const f32,
    y: *mut f32,
    n: u32,
    act: u32,
) {
    elementwise::activation_forward(&Nvptx, z, y, n as usize, activation(act));
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_activation_backward(
    dy: *const f32,
    z: *const f32,
    dz: *mut f32,
    n: u32,
    act: u32,
) {
    elementwise::activation_backward(&Nvptx, dy, z, dz, n as usize, activation(act));
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_mse_forward(
    pred: *const f32,
    target: *const f32,
    n: u32,
    partial: *mut f32,
) {
    reduce::mse_forward(&Nvptx, pred, target, n as usize, partial);
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_mse_grad(
    pred: *const f32,
    target: *const f32,
    grad: *mut f32,
    n: u32,
    inv_norm: f32,
) {
    elementwise::mse_grad(&Nvptx, pred, target, grad, n as usize, inv_norm);
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_softmax_ce_forward(
    logits: *const f32,
    targets: *const u32,
    rows: u32,
    classes: u32,
    row_loss: *mut f32,
) {
    reduce::softmax_ce_forward(
        &Nvptx,
        logits,
        targets,
        rows as usize,
        classes as usize,
        row_loss,
    );
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_softmax_ce_grad(
    logits: *const f32,
    targets: *const u32,
    grad: *mut f32,
    rows: u32,
    classes: u32,
    scale: f32,
) {
    reduce::softmax_ce_grad(
        &Nvptx,
        logits,
        targets,
        grad,
        rows as usize,
        classes as usize,
        scale,
    );
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_sgd_momentum(
    p: *mut f32,
    grad: *const f32,
    v: *mut f32,
    n: u32,
    lr: f32,
    momentum: f32,
    weight_decay: f32,
) {
    let opt = SgdMomentum {
        lr,
        momentum,
        weight_decay,
    };
    elementwise::sgd_momentum(&Nvptx, p, grad, v, n as usize, &opt);
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn pf_adamw(
    p: *mut f32,
    grad: *const f32,
    m: *mut f32,
    v: *mut f32,
    n: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    decay: f32,
    inv_bias1: f32,
    inv_bias2: f32,
) {
    let step = AdamWStep {
        lr,
        beta1,
        beta2,
        eps,
        decay,
        inv_bias1,
        inv_bias2,
    };
    elementwise::adamw(&Nvptx, p, grad, m, v, n as usize, &step);
}
