#!/usr/bin/env python3
"""An independent check of pipefill's PTX (kernels/ compiled for nvptx64) with CuPy against NumPy float64.

Nothing here uses Rust: every kernel of kernels/src/entry.rs is launched from Python with the argument
list of its `extern "ptx-kernel"` signature (kernels/src/gpu/mod.rs, kernels/src/gpu/tc.rs) and the launch
shape the host uses (cuda/src/launch.rs, cuda/src/tc_launch.rs), on odd sizes and seeded random data, and
its results are compared with a float64 reference of what the kernel documents (kernels/src/device/).

    python3 ptx_check.py --module PATH [--only simt|tc|all] [--seed N]
    python3 ptx_check.py --print-launches      # JSON of the launch shapes (no CuPy, no NumPy needed)

PATH is the PTX text or a cubin (both load with cupy.RawModule(path=PATH)).

Checks (one output line per comparison: `<entry> <shape/variant>: max |err| X (tolerance Y) ok|MISMATCH`):
  simt  pf_linear_forward (every activation, Z kept or not), pf_linear_backward_input (dZ kept or not, Z
        null for the identity), pf_linear_backward_weight (accumulating into dW and db, db null or not),
        pf_activation_forward/backward (every activation), pf_mse_forward (per-block partial sums),
        pf_mse_grad, pf_softmax_ce_forward/grad (one out-of-range target: NaN row), pf_sgd_momentum,
        pf_adamw (step 1 from zero moments and step 3 from nonzero ones).
  tc    the six tensor-core GEMMs pf_linear_{forward,backward_input,backward_weight}_{tf32,bf16} on seven
        shapes (odd ones, a 1-row one, one whose rows are whole 16-byte chunks, a large one, an empty
        reduced dimension), dynamic shared memory raised first; and pf_f32_to_bf16 / pf_bf16_to_f32
        bit-exact against the host's round-to-nearest-even (kernels/src/tc/convert.rs).
Every output buffer is filled with NaN (or accumulator start values) before a launch, so an element a
kernel fails to write shows up as a mismatch.

Norms and tolerances (eps = 2^-23; derivations next to `gemm_tol`, `ELEM_TOL`):
  GEMM-type results: max_i |got_i - ref_i| / max(1, S_i), S_i = sum_p |a_ip b_pj| (+ |bias| or the
    accumulator's start value): fp32 (K + 2) eps; TF32 2^-10 (1.01) + (K + 2) eps; BF16 (K + 2) eps, plus
    2^-8 (1.01) for results stored as BF16. The activated Y: 1.2 x Z's accumulation bound + 2e-5 (and
    the BF16 rounding). dX is checked against the dZ the kernel stored (the values it multiplies).
  Elementwise results: max_i |got_i - ref_i| / (1 + |ref_i|) <= 1e-5 (tests/gpu_kernels.rs's ELEM_TOL;
    + 2^-8 (1.01) for a dZ stored as BF16); gradients of the losses in units of their scale factor.
  Bit-exact (tolerance 0, X = how many elements differ): the conversions, and dZ = dY when Z is null.
    For NaN inputs of pf_f32_to_bf16 only NaN-ness is required (the host keeps the payload, the hardware
    may give a canonical NaN); a `note:` line says when the bits differ from the host's.

Exit codes: 0 every check passed; 1 a mismatch, an exception in a check (printed, the other checks still
run), a hang (a kernel not done within --timeout seconds) or a module that does not load; 2 bad usage;
3 NOT VERIFIED: NumPy, CuPy or a GPU is unavailable (one `NOT VERIFIED: <why>` line, nothing else).

A kernel that traps or faults leaves the CUDA context unusable; the script then reports it and runs the
remaining checks in a fresh process (same seed, same data), so one bad kernel does not hide the others.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
import zlib

# ---------------------------------------------------------------------------------------------------
# Launch math: a port of kernels/src/grid.rs and kernels/src/tc/{mod.rs,mainloop.rs,precision.rs}.
# tests/ptx_check_script.rs compares what --print-launches prints with the Rust functions.
# ---------------------------------------------------------------------------------------------------

THREADS = 256  # grid::THREADS: every kernel's block is (256, 1, 1)
SIMT_TILE = 64  # tile::BM == tile::BN: one 64 x 64 output tile per block of a SIMT GEMM
MAX_ELEMENTWISE_BLOCKS = 1024  # grid::MAX_ELEMENTWISE_BLOCKS
DEFAULT_SHARED_BYTES = 48 << 10  # above this a function's limit must be raised (tc_launch.rs)
STAGES = 4  # tc::mainloop::STAGES

PRODUCTS = ("Forward", "BackwardInput", "BackwardWeight")
PRECISIONS = ("Tf32", "Bf16")
# (bytes per element, PAD_K, PAD_MN) of tc::precision's Tf32 and Bf16
ELEM_LAYOUT = {"Tf32": (4, 4, 8), "Bf16": (2, 8, 8)}
TC_ENTRIES = {
    ("Forward", "Tf32"): "pf_linear_forward_tf32",
    ("BackwardInput", "Tf32"): "pf_linear_backward_input_tf32",
    ("BackwardWeight", "Tf32"): "pf_linear_backward_weight_tf32",
    ("Forward", "Bf16"): "pf_linear_forward_bf16",
    ("BackwardInput", "Bf16"): "pf_linear_backward_input_bf16",
    ("BackwardWeight", "Bf16"): "pf_linear_backward_weight_bf16",
}


def _at_least_one(blocks):
    return 1 if blocks == 0 else blocks


def _div_ceil(a, b):
    return -(-a // b)


def gemm_grid(m, n):
    """grid::gemm_grid: the SIMT GEMM grid for an m x n output."""
    return (_at_least_one(_div_ceil(n, SIMT_TILE)), _at_least_one(_div_ceil(m, SIMT_TILE)), 1)


def elementwise_grid(n):
    """grid::elementwise_grid: one item per thread, capped at 1024 blocks (the bodies grid-stride)."""
    return (_at_least_one(min(_div_ceil(n, THREADS), MAX_ELEMENTWISE_BLOCKS)), 1, 1)


def block_tile(product):
    return (64, 128) if product == "BackwardWeight" else (128, 128)


def depth(precision):
    return 16 if precision == "Tf32" else 32


def k_contiguous(product):
    return {"Forward": (True, False), "BackwardInput": (True, True),
            "BackwardWeight": (False, False)}[product]


def _stage_bytes(precision, k_contig, mn_tile, bk):
    size, pad_k, pad_mn = ELEM_LAYOUT[precision]
    rows, ld = (mn_tile, bk + pad_k) if k_contig else (bk, mn_tile + pad_mn)
    return rows * ld * size


def shared_bytes_of(product, precision):
    bm, bn = block_tile(product)
    ak, bk_contig = k_contiguous(product)
    bk = depth(precision)
    return STAGES * (_stage_bytes(precision, ak, bm, bk) + _stage_bytes(precision, bk_contig, bn, bk))


MAX_SHARED_BYTES = max(shared_bytes_of(q, p) for q in PRODUCTS for p in PRECISIONS)


def tc_launch(product, precision, rows, inputs, outputs):
    """tc::launch: (grid, block, dynamic shared bytes) of a tensor-core kernel."""
    m, n = {"Forward": (rows, outputs), "BackwardInput": (rows, inputs),
            "BackwardWeight": (inputs, outputs)}[product]
    bm, bn = block_tile(product)
    grid = (_at_least_one(_div_ceil(n, bn)), _at_least_one(_div_ceil(m, bm)), 1)
    return grid, (THREADS, 1, 1), shared_bytes_of(product, precision)


# The shapes (rows, inputs, outputs) of the checks.
SIMT_SHAPES = [(37, 70, 45), (130, 67, 129), (1, 5, 3), (67, 257, 200), (7, 0, 5)]
# Odd sizes (several blocks each way), 1 row, rows of whole 16-byte chunks in both precisions (the
# vectorized cp.async path: tests/gpu_tc.rs's shapes), many k-steps of the 4-stage ring, and an empty K.
TC_SHAPES = [(77, 131, 93), (301, 257, 129), (1, 5, 3), (129, 63, 200), (128, 256, 64),
             (517, 1031, 389), (7, 0, 5)]
ELEMENTWISE_N = [300_007, 1000]  # 300007 > 1024 * 256: the grid-stride loop takes a second lap
ACTIVATIONS = ("identity", "relu", "gelu", "silu")  # Activation::code 0..=3


def print_launches():
    tensor_core = []
    for rows, inputs, outputs in TC_SHAPES:
        for precision in PRECISIONS:
            for product in PRODUCTS:
                grid, block, shared = tc_launch(product, precision, rows, inputs, outputs)
                tensor_core.append({"product": product, "precision": precision,
                                    "entry": TC_ENTRIES[(product, precision)], "rows": rows,
                                    "inputs": inputs, "outputs": outputs, "grid": list(grid),
                                    "block": list(block), "shared_bytes": shared})
    simt = []
    for rows, inputs, outputs in SIMT_SHAPES:
        for entry, (m, n) in (("pf_linear_forward", (rows, outputs)),
                              ("pf_linear_backward_input", (rows, inputs)),
                              ("pf_linear_backward_weight", (inputs, outputs))):
            simt.append({"entry": entry, "kind": "gemm", "m": m, "n": n, "grid": list(gemm_grid(m, n)),
                         "block": [THREADS, 1, 1], "shared_bytes": 0})
    for n in ELEMENTWISE_N + [0, 1, 256, 257, MAX_ELEMENTWISE_BLOCKS * THREADS + 1]:
        simt.append({"entry": "elementwise", "kind": "elementwise", "n": n,
                     "grid": list(elementwise_grid(n)), "block": [THREADS, 1, 1], "shared_bytes": 0})
    print(json.dumps({"threads": THREADS, "max_shared_bytes": MAX_SHARED_BYTES,
                      "tensor_core": tensor_core, "simt": simt}, indent=1))


# ---------------------------------------------------------------------------------------------------
# NumPy references (float64) and tolerances. `np` is bound in main() once NumPy is known to import.
# ---------------------------------------------------------------------------------------------------

np = None
EPS = 2.0 ** -23  # f32::EPSILON
TF32_IN_REL = 1.01 * 2.0 ** -10  # both operands rounded to TF32 (10-bit mantissa, 2^-11 each), +1%
BF16_OUT_REL = 1.01 * 2.0 ** -8  # one rounding to BF16 (8 significant bits, ties to even), +1%
# Elementwise kernels, in |got - ref| / (1 + |ref|): the kernels' own f32 functions are within a few ulp
# of f64 (exp 2, sigmoid 4, tanh 4 ulp; derivatives 2e-6 absolute: kernels/src/math.rs,
# kernels/tests/activation.rs) plus a few f32 roundings and FMA contractions. tests/gpu_kernels.rs uses
# the same 1e-5 against the host's f32 build.
ELEM_TOL = 1e-5
GELU_K = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715


def gemm_tol(precision, k, stored_bf16=False):
    """Bound on max |got - ref| / max(1, S) for a length-k dot product (S = sum |a b| + |added term|).

    The f32 accumulation of k products plus one added term (bias, start value) is within
    (k + 1) u S, u = 2^-24, whatever the order (the classic gamma_k bound): (k + 2) eps is twice that.
    TF32 rounds both operands to nearest (relative 2^-11 each): 2^-10 S more. BF16 operands are BF16
    values already (the reference uses them), so only the accumulation counts, plus the final rounding
    to BF16 (2^-8 |ref| <= 2^-8 S) when the result is stored as BF16. These are the per-element bounds
    of tests/gpu_tc.rs, divided by max(1, S)."""
    t = (k + 2) * EPS + (TF32_IN_REL if precision == "tf32" else 0.0)
    if stored_bf16:
        t += BF16_OUT_REL * (1.0 + t)
    return t


def act_tol(z_acc_tol, stored_bf16=False):
    """Bound for Y = act(Z) in the GEMM norm: the activations' slopes are below 1.13 (GELU), so Z's
    accumulation error grows by at most 1.2x; the f32 evaluation of act adds a few ulp of |y| plus
    ~1e-7 absolute (2e-5 covers it, |y| <= |z| <= S); a BF16 Y is rounded once more (|y| <= S)."""
    t = 1.2 * z_acc_tol + 2e-5
    if stored_bf16:
        t += BF16_OUT_REL * (1.0 + t)
    return t


def f32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def act64(code, z):
    z = np.asarray(z, dtype=np.float64)
    if code == 0:
        return z.copy()
    if code == 1:
        return np.where(z < 0, 0.0, z)
    if code == 2:
        return 0.5 * z * (1.0 + np.tanh(GELU_K * (z + GELU_C * z ** 3)))
    return z * sigmoid64(z)


def dact64(code, z):
    z = np.asarray(z, dtype=np.float64)
    if code == 0:
        return np.ones_like(z)
    if code == 1:
        return np.where(z > 0, 1.0, 0.0)  # 0 at 0, as PyTorch and activation.rs
    if code == 2:
        t = np.tanh(GELU_K * (z + GELU_C * z ** 3))
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * z * z)
    s = sigmoid64(z)
    return s * (1.0 + z * (1.0 - s))


def sigmoid64(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(-np.abs(z))  # never overflows
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def linear_forward_ref(x, w, b):
    """Z = X W + b and its scale S = |X| |W| + |b| (float64)."""
    x, w, b = (np.asarray(v, dtype=np.float64) for v in (x, w, b))
    return x @ w + b, np.abs(x) @ np.abs(w) + np.abs(b)


def backward_input_ref(dz, w):
    """dX = dZ W^T and S = |dZ| |W|^T."""
    dz, w = np.asarray(dz, dtype=np.float64), np.asarray(w, dtype=np.float64)
    return dz @ w.T, np.abs(dz) @ np.abs(w).T


def backward_weight_ref(x, dz, dw0, db0):
    """dW = dW0 + X^T dZ, db = db0 + colsum(dZ), with their scales."""
    x, dz, dw0, db0 = (np.asarray(v, dtype=np.float64) for v in (x, dz, dw0, db0))
    return (dw0 + x.T @ dz, np.abs(x).T @ np.abs(dz) + np.abs(dw0),
            db0 + dz.sum(axis=0), np.abs(dz).sum(axis=0) + np.abs(db0))


def mse_partials_ref(pred, target, blocks):
    """partial[b] = sum of (pred - target)^2 over the items block b owns in the grid-stride loop:
    item i belongs to block (i mod (blocks * THREADS)) // THREADS."""
    d = np.asarray(pred, dtype=np.float64) - np.asarray(target, dtype=np.float64)
    owner = (np.arange(d.size) % (blocks * THREADS)) // THREADS
    return np.bincount(owner, weights=d * d, minlength=blocks)


def softmax_ce_ref(logits, targets):
    """-log softmax(row)[target] per row; NaN where the target is not a class."""
    z = np.asarray(logits, dtype=np.float64)
    rows, classes = z.shape
    m = z.max(axis=1)
    lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
    t = np.asarray(targets, dtype=np.int64)
    valid = t < classes
    out = np.full(rows, np.nan)
    out[valid] = lse[valid] - z[np.arange(rows)[valid], t[valid]]
    return out


def softmax_ce_grad_ref(logits, targets, scale):
    """scale (softmax(row) - onehot(target)); a row with an out-of-range target is all NaN."""
    z = np.asarray(logits, dtype=np.float64)
    rows, classes = z.shape
    e = np.exp(z - z.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    t = np.asarray(targets, dtype=np.int64)
    valid = t < classes
    p[np.arange(rows)[valid], t[valid]] -= 1.0
    p[~valid] = np.nan
    return scale * p


def sgd_ref(p, g, v, lr, momentum, wd):
    p, g, v = (np.asarray(a, dtype=np.float64) for a in (p, g, v))
    v = momentum * v + (g + wd * p)
    return p - lr * v, v


def adamw_ref(p, g, m, v, c):
    """One AdamW step from the kernel's constants c = (lr, b1, b2, eps, decay, inv_bias1, inv_bias2)."""
    lr, b1, b2, eps, decay, ib1, ib2 = (float(x) for x in c)
    p, g, m, v = (np.asarray(a, dtype=np.float64) for a in (p, g, m, v))
    m = b1 * m + (1.0 - b1) * g
    v = b2 * v + (1.0 - b2) * g * g
    p = p * decay - lr * (m * ib1) / (np.sqrt(v * ib2) + eps)
    return p, m, v


def adamw_constants(lr, b1, b2, eps, wd, t):
    """AdamW::at_step in f32, as the host computes them (the kernel takes them as f32 arguments)."""
    s = np.float32
    return (s(lr), s(b1), s(b2), s(eps), s(1) - s(lr) * s(wd), s(1) / (s(1) - s(b1) ** t),
            s(1) / (s(1) - s(b2) ** t))


def to_bf16_bits(x):
    """The host's f32 -> BF16 (kernels/src/tc/convert.rs f32_to_bf16): round to nearest, ties to even,
    on the bits (overflow to infinity included); NaN -> its top half with the quiet bit set."""
    bits = f32(x).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    nan = np.isnan(f32(x))
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)


def from_bf16_bits(h):
    """BF16 bits -> f32 (exact): the bits in the top half."""
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def gemm_err(got, ref, scale):
    """max |got - ref| / max(1, scale); an unwritten (NaN) or non-finite result counts as infinite."""
    got = np.asarray(got, dtype=np.float64)
    if got.size == 0:
        return 0.0
    err = np.abs(got - ref) / np.maximum(1.0, scale)
    err = np.where(np.isfinite(err), err, np.inf)
    return float(err.max())


def elem_err(got, ref):
    """max |got - ref| / (1 + |ref|); NaN where the reference is NaN is expected, elsewhere infinite."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if got.size == 0:
        return 0.0
    both_nan = np.isnan(got) & np.isnan(ref)
    err = np.abs(got - ref) / (1.0 + np.abs(ref))
    err = np.where(both_nan, 0.0, np.where(np.isfinite(err), err, np.inf))
    return float(err.max())


def bits_err(got, want):
    """Number of differing bit patterns."""
    return float(np.count_nonzero(np.asarray(got) != np.asarray(want)))


# ---------------------------------------------------------------------------------------------------
# Running kernels with CuPy.
# ---------------------------------------------------------------------------------------------------


class Hang(Exception):
    pass


class Gpu:
    def __init__(self, cp, module, timeout):
        self.cp, self.mod, self.timeout = cp, module, timeout
        self.fns = {}
        # Every uploaded array until the next launch has finished: `P(g.up(x))` in an argument
        # list keeps only the address, and CuPy's pool would hand a freed block to the next upload
        # of the same size (two arguments would then alias).
        self.live = []

    def up(self, a):
        d = self.cp.asarray(np.ascontiguousarray(a))
        self.live.append(d)
        return d

    def down(self, a):
        return self.cp.asnumpy(a)

    @staticmethod
    def ptr(a):
        """A pointer argument: 8 bytes, the buffer's device address or 0 for an optional null."""
        return np.uint64(0 if a is None else a.data.ptr)

    def launch(self, name, grid, args, shared=0):
        key = name
        fn = self.fns.get(key)
        if fn is None:
            fn = self.fns[key] = [self.mod.get_function(name), 0]
        if shared > DEFAULT_SHARED_BYTES and fn[1] < shared:
            self._allow_shared(fn[0], shared)
            fn[1] = shared
        fn[0](tuple(grid), (THREADS, 1, 1), tuple(args), shared_mem=shared)
        self.wait(name)
        self.live.clear()

    def _allow_shared(self, f, shared):
        # cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared), as tc_launch.rs.
        try:
            f.max_dynamic_shared_size_bytes = shared
        except AttributeError:
            drv = self.cp.cuda.driver
            drv.funcSetAttribute(f.ptr, getattr(drv, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8),
                                 shared)

    def wait(self, name):
        """Waits for the launch with a deadline (a hung kernel must not eat the GPU slot)."""
        ev = self.cp.cuda.Event()
        ev.record()
        deadline = time.monotonic() + self.timeout
        while not ev.done:
            if time.monotonic() > deadline:
                raise Hang(f"{name} not done after {self.timeout:.0f} s")
            time.sleep(0.0005)
        self.cp.cuda.get_current_stream().synchronize()


def U32(v):
    """A `u32` kernel argument (4 bytes; a Python int would go as 8)."""
    return np.uint32(v)


def F32(v):
    """An `f32` kernel argument (4 bytes; a Python float would go as an 8-byte double)."""
    return np.float32(v)


P = Gpu.ptr


def rng_for(seed, name):
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def shape_str(shape):
    return "x".join(str(s) for s in shape)


# Each check function takes (gpu, rng) and returns [(label suffix, err, tol)]; the check's name prefixes
# every label.

def check_linear_forward(shape, code, keep_z):
    rows, inputs, outputs = shape

    def run(g, rng):
        x = f32(rng.uniform(-1, 1, (rows, inputs)))
        w = f32(rng.uniform(-1, 1, (inputs, outputs)))
        b = f32(rng.uniform(-1, 1, outputs))
        y = g.up(np.full((rows, outputs), np.nan, np.float32))
        z = g.up(np.full((rows, outputs), np.nan, np.float32)) if keep_z else None
        dx, dw, db = g.up(x), g.up(w), g.up(b)
        g.launch("pf_linear_forward", gemm_grid(rows, outputs),
                 (P(dx), P(dw), P(db), P(y), P(z), U32(rows), U32(inputs), U32(outputs), U32(code)))
        zr, s = linear_forward_ref(x, w, b)
        t = gemm_tol("fp32", inputs)
        out = []
        if keep_z:
            out.append(("Z", gemm_err(g.down(z), zr, s), t))
        out.append(("Y", gemm_err(g.down(y), act64(code, zr), s), act_tol(t)))
        return out
    return run


def check_linear_backward_input(shape, code, keep_dz):
    """dZ = dY act'(Z) (Z null for the identity: dZ = dY exactly), dX = dZ W^T. Without dZ kept, the run
    is repeated with dZ kept to get the dZ values the kernel multiplies."""
    rows, inputs, outputs = shape

    def run(g, rng):
        dy = f32(rng.uniform(-1, 1, (rows, outputs)))
        z = f32(rng.uniform(-3, 3, (rows, outputs)))
        z.flat[::7] = 0.0  # ReLU's derivative at 0 is 0
        w = f32(rng.uniform(-1, 1, (inputs, outputs)))
        ddy, dw = g.up(dy), g.up(w)
        dzin = None if code == 0 else g.up(z)
        out = []
        runs = [True] if keep_dz else [True, False]
        dx_got = None
        for store in runs:
            dx = g.up(np.full((rows, inputs), np.nan, np.float32))
            dz = g.up(np.full((rows, outputs), np.nan, np.float32)) if store else None
            g.launch("pf_linear_backward_input", gemm_grid(rows, inputs),
                     (P(ddy), P(dzin), P(dw), P(dx), P(dz), U32(rows), U32(inputs), U32(outputs),
                      U32(code)))
            if store:
                dz_got = g.down(dz)
            dx_got = g.down(dx)
        if code == 0:
            out.append(("dZ = dY (Z null, bits)", bits_err(dz_got.view(np.uint32), dy.view(np.uint32)), 0.0))
        elif keep_dz:
            out.append(("dZ", elem_err(dz_got, dy.astype(np.float64) * dact64(code, z)), ELEM_TOL))
        ref, s = backward_input_ref(dz_got, w)
        out.append(("dX" + ("" if keep_dz else " (dZ not kept)"), gemm_err(dx_got, ref, s),
                    gemm_tol("fp32", outputs)))
        return out
    return run


def check_linear_backward_weight(shape, with_db):
    """Accumulating: dW += X^T dZ, db += colsum(dZ), into nonzero start values."""
    rows, inputs, outputs = shape

    def run(g, rng):
        x = f32(rng.uniform(-1, 1, (rows, inputs)))
        dzv = f32(rng.uniform(-1, 1, (rows, outputs)))
        dw0 = f32(rng.uniform(-1, 1, (inputs, outputs)))
        db0 = f32(rng.uniform(-1, 1, outputs))
        dx, ddz, dw = g.up(x), g.up(dzv), g.up(dw0)
        db = g.up(db0) if with_db else None
        g.launch("pf_linear_backward_weight", gemm_grid(inputs, outputs),
                 (P(dx), P(ddz), P(dw), P(db), U32(rows), U32(inputs), U32(outputs)))
        dwr, sw, dbr, sb = backward_weight_ref(x, dzv, dw0, db0)
        t = gemm_tol("fp32", rows)
        out = [("dW (+= start)", gemm_err(g.down(dw), dwr, sw), t)]
        if with_db:
            out.append(("db (+= start)", gemm_err(g.down(db), dbr, sb), t))
        return out
    return run


def elementwise_z(rng, n):
    z = rng.uniform(-4, 4, n)
    special = [0.0, -0.0, 1e-20, -1e-20, 1e-3, -1e-3, 20.0, -20.0, 50.0, -50.0, 100.0, -100.0]
    z[:len(special)] = special
    return f32(z)


def check_activation(n, code, backward):
    def run(g, rng):
        z = elementwise_z(rng, n)
        dz_ = g.up(z)
        out = g.up(np.full(n, np.nan, np.float32))
        if backward:
            dy = f32(rng.uniform(-1, 1, n))
            g.launch("pf_activation_backward", elementwise_grid(n),
                     (P(g.up(dy)), P(dz_), P(out), U32(n), U32(code)))
            ref = dy.astype(np.float64) * dact64(code, z)
        else:
            g.launch("pf_activation_forward", elementwise_grid(n), (P(dz_), P(out), U32(n), U32(code)))
            ref = act64(code, z)
        return [("", elem_err(g.down(out), ref), ELEM_TOL)]
    return run


def check_mse_forward(n):
    def run(g, rng):
        p, t = f32(rng.uniform(-1, 1, n)), f32(rng.uniform(-1, 1, n))
        blocks = elementwise_grid(n)[0]
        partial = g.up(np.full(blocks, np.nan, np.float32))
        g.launch("pf_mse_forward", elementwise_grid(n), (P(g.up(p)), P(g.up(t)), U32(n), P(partial)))
        got = g.down(partial)
        ref = mse_partials_ref(p, t, blocks)
        loss = float(got.astype(np.float64).sum() / n)  # as the host: sum(partial) / n in f64
        return [(f"partials ({blocks} blocks)", elem_err(got, ref), ELEM_TOL),
                ("loss", elem_err([loss], [ref.sum() / n]), ELEM_TOL)]
    return run


def check_mse_grad(n):
    def run(g, rng):
        p, t = f32(rng.uniform(-1, 1, n)), f32(rng.uniform(-1, 1, n))
        inv = F32(1.0 / 777.0)
        grad = g.up(np.full(n, np.nan, np.float32))
        g.launch("pf_mse_grad", elementwise_grid(n), (P(g.up(p)), P(g.up(t)), P(grad), U32(n), inv))
        ref = 2.0 * (p.astype(np.float64) - t) * float(inv)
        # Compared in units of inv_norm, so the values are O(1).
        return [("(grad / inv_norm)", elem_err(g.down(grad) / float(inv), ref / float(inv)), ELEM_TOL)]
    return run


def ce_data(rng, rows, classes):
    logits = f32(rng.uniform(-5, 5, (rows, classes)))
    targets = rng.integers(0, classes, rows).astype(np.uint32)
    targets[rows // 2] = classes  # out of range: a NaN row
    return logits, targets


def check_softmax_ce(rows, classes, grad):
    def run(g, rng):
        logits, targets = ce_data(rng, rows, classes)
        dl, dt = g.up(logits), g.up(targets)
        if grad:
            scale = F32(1.0 / (4 * rows))
            out = g.up(np.full((rows, classes), 7.0, np.float32))  # the NaN row must be written too
            g.launch("pf_softmax_ce_grad", elementwise_grid(rows),
                     (P(dl), P(dt), P(out), U32(rows), U32(classes), scale))
            ref = softmax_ce_grad_ref(logits, targets, float(scale))
            # In units of scale (the values are then O(1)).
            return [("(grad / scale)", elem_err(g.down(out) / float(scale), ref / float(scale)), ELEM_TOL)]
        out = g.up(np.full(rows, np.float32(7.0)))
        g.launch("pf_softmax_ce_forward", elementwise_grid(rows),
                 (P(dl), P(dt), U32(rows), U32(classes), P(out)))
        return [("row loss", elem_err(g.down(out), softmax_ce_ref(logits, targets)), ELEM_TOL)]
    return run


def check_sgd(n):
    def run(g, rng):
        p, gr, v = (f32(rng.uniform(-1, 1, n)) for _ in range(3))
        lr, mom, wd = F32(0.05), F32(0.9), F32(0.01)
        dp, dv = g.up(p), g.up(v)
        g.launch("pf_sgd_momentum", elementwise_grid(n), (P(dp), P(g.up(gr)), P(dv), U32(n), lr, mom, wd))
        pr, vr = sgd_ref(p, gr, v, float(lr), float(mom), float(wd))
        return [("p", elem_err(g.down(dp), pr), ELEM_TOL), ("v", elem_err(g.down(dv), vr), ELEM_TOL)]
    return run


def check_adamw(n, step):
    def run(g, rng):
        p, gr = f32(rng.uniform(-1, 1, n)), f32(rng.uniform(-1, 1, n))
        if step == 1:
            m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
        else:
            m, v = f32(rng.uniform(-0.1, 0.1, n)), f32(rng.uniform(1e-4, 0.5, n))
        c = adamw_constants(1e-2, 0.9, 0.999, 1e-8, 0.01, step)
        dp, dm, dv = g.up(p), g.up(m), g.up(v)
        g.launch("pf_adamw", elementwise_grid(n), (P(dp), P(g.up(gr)), P(dm), P(dv), U32(n)) + tuple(c))
        pr, mr, vr = adamw_ref(p, gr, m, v, c)
        return [("p", elem_err(g.down(dp), pr), ELEM_TOL), ("m", elem_err(g.down(dm), mr), ELEM_TOL),
                ("v", elem_err(g.down(dv), vr), ELEM_TOL)]
    return run


# Tensor-core checks. A precision's matrices: TF32 kernels take f32, BF16 kernels u16 BF16 bits (bias,
# dW, db stay f32 in both).

def tc_data(rng, precision, shape, lo=-1.0, hi=1.0):
    """(device array, float64 values the kernel sees) of random data in a precision's storage."""
    v = f32(rng.uniform(lo, hi, shape))
    if precision == "bf16":
        h = to_bf16_bits(v)
        return h, from_bf16_bits(h).astype(np.float64)
    return v, v.astype(np.float64)


def tc_nan(precision, shape):
    if precision == "bf16":
        return np.full(shape, 0x7FC0, np.uint16)
    return np.full(shape, np.nan, np.float32)


def tc_load(precision, a):
    return from_bf16_bits(a) if precision == "bf16" else a


def check_tc_forward(precision, shape, code, keep_z):
    rows, inputs, outputs = shape
    prec = precision.capitalize()

    def run(g, rng):
        x, xv = tc_data(rng, precision, (rows, inputs))
        w, wv = tc_data(rng, precision, (inputs, outputs))
        b = f32(rng.uniform(-1, 1, outputs))
        y = g.up(tc_nan(precision, (rows, outputs)))
        z = g.up(tc_nan(precision, (rows, outputs))) if keep_z else None
        dx, dw, db = g.up(x), g.up(w), g.up(b)
        grid, _, shared = tc_launch("Forward", prec, rows, inputs, outputs)
        g.launch(TC_ENTRIES[("Forward", prec)], grid,
                 (P(dx), P(dw), P(db), P(y), P(z), U32(rows), U32(inputs), U32(outputs), U32(code)), shared)
        zr, s = linear_forward_ref(xv, wv, b)
        bf = precision == "bf16"
        t_acc = gemm_tol(precision, inputs)
        out = []
        if keep_z:
            out.append(("Z", gemm_err(tc_load(precision, g.down(z)), zr, s), gemm_tol(precision, inputs, bf)))
        out.append(("Y", gemm_err(tc_load(precision, g.down(y)), act64(code, zr), s), act_tol(t_acc, bf)))
        return out
    return run


def check_tc_backward_input(precision, shape, code):
    """dZ kept and checked, dX from the kept dZ (the values the kernel multiplies); then the same data with
    dZ not kept (the same dX expected); the identity runs with Z null (dZ = dY bit for bit)."""
    rows, inputs, outputs = shape
    prec = precision.capitalize()

    def run(g, rng):
        dy, dyv = tc_data(rng, precision, (rows, outputs))
        z, zv = tc_data(rng, precision, (rows, outputs), -3.0, 3.0)
        w, wv = tc_data(rng, precision, (inputs, outputs))
        ddy, dw = g.up(dy), g.up(w)
        dzin = None if code == 0 else g.up(z)
        grid, _, shared = tc_launch("BackwardInput", prec, rows, inputs, outputs)
        bf = precision == "bf16"
        got = {}
        for store in (True, False):
            dx = g.up(tc_nan(precision, (rows, inputs)))
            dz = g.up(tc_nan(precision, (rows, outputs))) if store else None
            g.launch(TC_ENTRIES[("BackwardInput", prec)], grid,
                     (P(ddy), P(dzin), P(dw), P(dx), P(dz), U32(rows), U32(inputs), U32(outputs), U32(code)),
                     shared)
            got[store] = (g.down(dz) if store else None, g.down(dx))
        dz_raw = got[True][0]
        dz_got = tc_load(precision, dz_raw)
        out = []
        if code == 0:
            out.append(("dZ = dY (Z null, bits)", bits_err(dz_raw.view(np.uint16 if bf else np.uint32),
                                                           dy.view(np.uint16 if bf else np.uint32)), 0.0))
        else:
            tol = ELEM_TOL + (BF16_OUT_REL if bf else 0.0)
            out.append(("dZ", elem_err(dz_got, dyv * dact64(code, zv)), tol))
        ref, s = backward_input_ref(dz_got, wv)
        t = gemm_tol(precision, outputs, bf)
        out.append(("dX", gemm_err(tc_load(precision, got[True][1]), ref, s), t))
        out.append(("dX (dZ not kept)", gemm_err(tc_load(precision, got[False][1]), ref, s), t))
        return out
    return run


def check_tc_backward_weight(precision, shape, with_db):
    rows, inputs, outputs = shape
    prec = precision.capitalize()

    def run(g, rng):
        x, xv = tc_data(rng, precision, (rows, inputs))
        dzv, dzvv = tc_data(rng, precision, (rows, outputs))
        dw0 = f32(rng.uniform(-1, 1, (inputs, outputs)))
        db0 = f32(rng.uniform(-1, 1, outputs))
        dw = g.up(dw0)
        db = g.up(db0) if with_db else None
        grid, _, shared = tc_launch("BackwardWeight", prec, rows, inputs, outputs)
        g.launch(TC_ENTRIES[("BackwardWeight", prec)], grid,
                 (P(g.up(x)), P(g.up(dzv)), P(dw), P(db), U32(rows), U32(inputs), U32(outputs)), shared)
        dwr, sw, dbr, sb = backward_weight_ref(xv, dzvv, dw0, db0)
        t = gemm_tol(precision, rows)
        out = [("dW (+= start)", gemm_err(g.down(dw), dwr, sw), t)]
        if with_db:
            out.append(("db (+= start)", gemm_err(g.down(db), dbr, sb), t))
        return out
    return run


def conversion_inputs(rng, n):
    """Random f32 bit patterns (every class: normal, subnormal, zero, infinity, NaN) and the edge cases of
    round-to-nearest-even."""
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    special = [0x3F808000, 0x3F818000, 0x3F80_7FFF, 0x3F80_8001, 0xBF808000, 0x7F7FFFFF, 0x7F7F8000,
               0x7F7F7FFF, 0x00008000, 0x00018000, 0x00000001, 0x807FFFFF, 0x00000000, 0x80000000,
               0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF]
    bits[:len(special)] = special
    return bits.view(np.float32)


def check_to_bf16(n):
    def run(g, rng):
        x = conversion_inputs(rng, n)
        y = g.up(np.full(n, 0x1234, np.uint16))
        g.launch("pf_f32_to_bf16", elementwise_grid(n), (P(g.up(x)), P(y), U32(n)))
        got, want = g.down(y), to_bf16_bits(x)
        nan = np.isnan(x)
        # Subnormal inputs apart: a conversion that flushes them (ftz) would show there alone.
        sub = (x.view(np.uint32) & 0x7F800000) == 0
        sub &= (x.view(np.uint32) & 0x007FFFFF) != 0
        rest = ~nan & ~sub
        out = [("normal/zero/infinite inputs, differing bits", bits_err(got[rest], want[rest]), 0.0),
               (f"subnormal inputs ({int(sub.sum())}), differing bits", bits_err(got[sub], want[sub]), 0.0)]
        got_nan = got[nan]
        is_nan = ((got_nan & 0x7F80) == 0x7F80) & ((got_nan & 0x007F) != 0)
        out.append((f"NaN inputs ({int(nan.sum())}), results not NaN", float(np.count_nonzero(~is_nan)), 0.0))
        differ = int(np.count_nonzero(got_nan != want[nan]))
        if differ:
            pats = sorted({int(v) for v in got_nan[:64]})[:4]
            print(f"note: pf_f32_to_bf16: {differ} NaN results differ in payload from the host rule "
                  f"(bits >> 16 | 0x40), e.g. {[hex(p) for p in pats]} (both NaN; not counted)")
        return out
    return run


def check_to_f32(n):
    def run(g, rng):
        h = rng.integers(0, 1 << 16, n, dtype=np.uint64).astype(np.uint16)  # every class of BF16 value
        y = g.up(np.full(n, np.nan, np.float32))
        g.launch("pf_bf16_to_f32", elementwise_grid(n), (P(g.up(h)), P(y), U32(n)))
        want = h.astype(np.uint32) << 16
        return [("differing bits", bits_err(g.down(y).view(np.uint32), want), 0.0)]
    return run


def all_checks():
    """[(group, name, function)] in run order; names are unique (they seed each check's data)."""
    checks = []
    for i, shape in enumerate(SIMT_SHAPES):
        codes = range(4) if i < 2 else (2,)
        s = shape_str(shape)
        for code in codes:
            checks.append(("simt", f"pf_linear_forward {s} {ACTIVATIONS[code]}",
                           check_linear_forward(shape, code, True)))
        if i == 0:
            checks.append(("simt", f"pf_linear_forward {s} silu Z null",
                           check_linear_forward(shape, 3, False)))
        for code in (range(4) if i < 2 else (2,)):
            checks.append(("simt", f"pf_linear_backward_input {s} {ACTIVATIONS[code]}",
                           check_linear_backward_input(shape, code, True)))
        checks.append(("simt", f"pf_linear_backward_input {s} gelu dZ null",
                       check_linear_backward_input(shape, 2, False)))
        checks.append(("simt", f"pf_linear_backward_weight {s}", check_linear_backward_weight(shape, True)))
        if i == 0:
            checks.append(("simt", f"pf_linear_backward_weight {s} db null",
                           check_linear_backward_weight(shape, False)))
    for n in ELEMENTWISE_N:
        for code in range(4):
            for backward, entry in ((False, "pf_activation_forward"), (True, "pf_activation_backward")):
                checks.append(("simt", f"{entry} n={n} {ACTIVATIONS[code]}",
                               check_activation(n, code, backward)))
        checks.append(("simt", f"pf_mse_forward n={n}", check_mse_forward(n)))
        checks.append(("simt", f"pf_mse_grad n={n}", check_mse_grad(n)))
        checks.append(("simt", f"pf_sgd_momentum n={n}", check_sgd(n)))
        checks.append(("simt", f"pf_adamw n={n} step 1", check_adamw(n, 1)))
        checks.append(("simt", f"pf_adamw n={n} step 3", check_adamw(n, 3)))
    for rows, classes in ((1001, 37), (300, 1000)):
        for grad, entry in ((False, "pf_softmax_ce_forward"), (True, "pf_softmax_ce_grad")):
            checks.append(("simt", f"{entry} {rows}x{classes}", check_softmax_ce(rows, classes, grad)))
    for n in ELEMENTWISE_N:
        checks.append(("tc", f"pf_f32_to_bf16 n={n}", check_to_bf16(n)))
        checks.append(("tc", f"pf_bf16_to_f32 n={n}", check_to_f32(n)))
    for precision in ("tf32", "bf16"):
        for i, shape in enumerate(TC_SHAPES):
            s = shape_str(shape)
            for code in (range(4) if i < 2 else (2,)):
                checks.append(("tc", f"pf_linear_forward_{precision} {s} {ACTIVATIONS[code]}",
                               check_tc_forward(precision, shape, code, True)))
            if i == 0:
                checks.append(("tc", f"pf_linear_forward_{precision} {s} relu Z null",
                               check_tc_forward(precision, shape, 1, False)))
            for code in ((2, 0, 1) if i < 2 else (2,)):
                checks.append(("tc", f"pf_linear_backward_input_{precision} {s} {ACTIVATIONS[code]}",
                               check_tc_backward_input(precision, shape, code)))
            checks.append(("tc", f"pf_linear_backward_weight_{precision} {s}",
                           check_tc_backward_weight(precision, shape, True)))
            if i == 0:
                checks.append(("tc", f"pf_linear_backward_weight_{precision} {s} db null",
                               check_tc_backward_weight(precision, shape, False)))
    return checks


def fmt(v):
    return f"{v:.3e}" if isinstance(v, float) and not float(v).is_integer() else f"{v:g}"


def context_alive(cp):
    """Whether the CUDA context still works after an exception (a trap or fault makes it unusable): a
    copy there and back and a device synchronization (no CuPy kernels, so no NVRTC needed)."""
    try:
        back = cp.asnumpy(cp.asarray(np.arange(4, dtype=np.float32)))
        cp.cuda.runtime.deviceSynchronize()
        return bool(np.array_equal(back, np.arange(4, dtype=np.float32)))
    except Exception:
        return False


def run_checks(args, cp):
    """Runs the selected checks from index args.start_at; returns (mismatches, lines, hung) or None when
    the module does not load."""
    checks = [c for c in all_checks() if args.only in ("all", c[0])]
    if not os.path.isfile(args.module):
        print(f"module: cannot load module {args.module}: no such file")
        return None
    entries = sorted({c[1].split(" ")[0] for c in checks})
    missing, first_error = [], None
    try:
        module = cp.RawModule(path=args.module)
        for name in entries:
            try:
                module.get_function(name)
            except Exception as e:
                missing.append(name)
                first_error = first_error or e
    except Exception as e:
        missing, first_error = entries, e
    if missing == entries:
        print(f"module: cannot load module {args.module}: {type(first_error).__name__}: {first_error}")
        return None
    lost = set(filter(None, args.skip_entries.split(",")))
    gpu = Gpu(cp, module, args.timeout)
    bad = lines = 0
    for index in range(args.start_at, len(checks)):
        _, name, fn = checks[index]
        entry = name.split(" ")[0]
        if entry in missing or entry in lost:
            why = (f"no entry {entry} in the module" if entry in missing
                   else f"not run: {entry} lost the CUDA context in an earlier check")
            print(f"{name}: MISMATCH ({why})")
            bad, lines = bad + 1, lines + 1
            continue
        try:
            for label, err, tol in fn(gpu, rng_for(args.seed, name)):
                ok = err <= tol
                print(f"{name}{' ' + label if label else ''}: max |err| {fmt(err)} (tolerance {fmt(tol)}) "
                      f"{'ok' if ok else 'MISMATCH'}", flush=True)
                bad, lines = bad + (not ok), lines + 1
        except Hang as e:
            print(f"{name}: MISMATCH (hang: {e}); the remaining {len(checks) - index - 1} checks not run",
                  flush=True)
            return bad + 1 + (len(checks) - index - 1), lines + 1 + (len(checks) - index - 1), True
        except Exception as e:
            print(f"{name}: MISMATCH (exception: {type(e).__name__}: {e})", flush=True)
            bad, lines = bad + 1, lines + 1
            if not context_alive(cp):
                rest = len(checks) - index - 1
                if rest == 0:
                    break
                print(f"note: the CUDA context is lost after {name}; the remaining {rest} checks run in a "
                      "fresh process", flush=True)
                sub_bad, sub_lines = resume(args, index + 1, rest, sorted(lost | {entry}))
                return bad + sub_bad, lines + sub_lines, False
    return bad, lines, False


def resume(args, start_at, rest, lost):
    """Runs checks start_at.. in a child process (the entries in `lost` not again); returns its
    (mismatches, lines)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--module", args.module, "--only", args.only,
           "--seed", str(args.seed), "--timeout", str(args.timeout), "--start-at", str(start_at),
           "--skip-entries", ",".join(lost)]
    counts = None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        for line in child.stdout:
            if line.startswith("ptx-check-partial:"):
                counts = [int(v) for v in line.split(":")[1].split()]
            else:
                print(line, end="", flush=True)
    if counts is None:
        print(f"note: the fresh process exited {child.returncode} without results; {rest} checks count "
              "as mismatches")
        return rest, rest
    return counts[0], counts[1]


# ---------------------------------------------------------------------------------------------------
# --self-test: the references against independent formulations (no GPU).
# ---------------------------------------------------------------------------------------------------


def self_test():
    from fractions import Fraction
    import struct

    failures = []

    def expect(what, cond):
        print(f"self-test {what}: {'ok' if cond else 'FAILED'}")
        if not cond:
            failures.append(what)

    rng = np.random.default_rng(1)

    # BF16 rounding: exact nearest-even rounding with fractions, from the value rather than the bits.
    def bf16_exact(bits):
        x = struct.unpack("<f", struct.pack("<I", bits))[0]
        if math.isnan(x):
            return None
        if math.isinf(x) or x == 0.0:
            return bits >> 16
        sign = bits >> 31
        v = Fraction(abs(x))
        lo_bits = (bits & 0x7FFFFFFF) >> 16  # truncated magnitude
        lo = Fraction(struct.unpack("<f", struct.pack("<I", lo_bits << 16))[0])
        hi_bits = lo_bits + 1
        hi = (Fraction(struct.unpack("<f", struct.pack("<I", hi_bits << 16))[0]) if hi_bits < 0x7F80
              else Fraction(2) ** 128)  # one step above the largest BF16: rounds to infinity at ties up
        if v - lo < hi - v or (v - lo == hi - v and lo_bits % 2 == 0):
            r = lo_bits
        else:
            r = hi_bits
        return (sign << 15) | r
    x = conversion_inputs(rng, 20000)
    got = to_bf16_bits(x)
    xb = x.view(np.uint32)
    ok = all(bf16_exact(int(b)) in (None, int(h)) for b, h in zip(xb, got))
    expect("bf16 rounding = exact nearest-even (20000 bit patterns, specials)", ok)
    nan = np.isnan(x)
    expect("bf16 of NaN is NaN, quiet", bool(np.all((got[nan] & 0x7FC0) == 0x7FC0)))
    expect("bf16 -> f32 exact", bool(np.all(from_bf16_bits(got[~nan]).view(np.uint32)
                                             == (got[~nan].astype(np.uint32) << 16))))
    expect("bf16 tie cases", list(to_bf16_bits(np.array([1.00390625, 1.01171875], np.float32)))
           == [0x3F80, 0x3F82])

    # Activations: GELU through sigmoid(2u) (the kernel's identity), derivatives by finite differences.
    z = np.concatenate([rng.uniform(-6, 6, 2000), [0.0, 1e-3, -1e-3, 30.0, -30.0]])
    u = GELU_K * (z + GELU_C * z ** 3)
    expect("gelu = z sigmoid(2u)", np.allclose(act64(2, z), z * sigmoid64(2 * u), rtol=1e-12, atol=1e-15))
    expect("silu = z (1 + tanh(z/2)) / 2", np.allclose(act64(3, z), z * 0.5 * (1 + np.tanh(z / 2)),
                                                        rtol=1e-12, atol=1e-15))
    expect("relu", np.array_equal(act64(1, z), np.maximum(z, 0)) and dact64(1, np.array([0.0]))[0] == 0.0)
    h = 1e-6
    away = np.abs(z) > 1e-2
    for code in range(4):
        fd = (act64(code, z + h) - act64(code, z - h)) / (2 * h)
        expect(f"d{ACTIVATIONS[code]} = finite difference",
               np.allclose(dact64(code, z)[away], fd[away], rtol=1e-6, atol=1e-7))
    expect("sigmoid has no overflow", np.all(np.isfinite(sigmoid64(np.array([-800.0, 800.0])))))

    # GEMM references against loops.
    rows, inputs, outputs = 3, 4, 5
    x, w, b = rng.normal(size=(rows, inputs)), rng.normal(size=(inputs, outputs)), rng.normal(size=outputs)
    zr, s = linear_forward_ref(x, w, b)
    zl = [[sum(x[r][p] * w[p][j] for p in range(inputs)) + b[j] for j in range(outputs)] for r in range(rows)]
    sl = [[sum(abs(x[r][p] * w[p][j]) for p in range(inputs)) + abs(b[j]) for j in range(outputs)]
          for r in range(rows)]
    expect("forward ref = loops", np.allclose(zr, zl) and np.allclose(s, sl))
    dz = rng.normal(size=(rows, outputs))
    dxr, s = backward_input_ref(dz, w)
    dxl = [[sum(dz[r][j] * w[i][j] for j in range(outputs)) for i in range(inputs)] for r in range(rows)]
    expect("backward input ref = loops", np.allclose(dxr, dxl) and np.all(s >= np.abs(dxr)))
    dw0, db0 = rng.normal(size=(inputs, outputs)), rng.normal(size=outputs)
    dwr, sw, dbr, sb = backward_weight_ref(x, dz, dw0, db0)
    dwl = [[dw0[i][j] + sum(x[r][i] * dz[r][j] for r in range(rows)) for j in range(outputs)]
           for i in range(inputs)]
    dbl = [db0[j] + sum(dz[r][j] for r in range(rows)) for j in range(outputs)]
    expect("backward weight ref = loops", np.allclose(dwr, dwl) and np.allclose(dbr, dbl)
           and np.all(sw >= np.abs(dwr)) and np.all(sb >= np.abs(dbr)))

    # MSE partials: the kernel's grid-stride loop, thread by thread.
    for n in (1000, 2 * 1024 * 256 + 77):
        p, t = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
        blocks = elementwise_grid(n)[0]
        stride = blocks * THREADS
        acc = [0.0] * blocks
        d2 = ((p - t) ** 2).tolist()
        for blk in range(blocks):
            for th in range(THREADS):
                i = blk * THREADS + th
                while i < n:
                    acc[blk] += d2[i]
                    i += stride
        expect(f"mse partials = grid-stride loop (n={n}, {blocks} blocks)",
               np.allclose(mse_partials_ref(p, t, blocks), acc, rtol=1e-12))

    # Cross-entropy: loops with math.log / math.exp, and the gradient against finite differences.
    logits = rng.uniform(-5, 5, (6, 7))
    targets = np.array([0, 6, 3, 7, 2, 1], np.uint32)  # 7: out of range
    ref = softmax_ce_ref(logits, targets)
    loop = [math.log(sum(math.exp(v) for v in row)) - row[t] if t < 7 else float("nan")
            for row, t in zip(logits.tolist(), targets.tolist())]
    expect("softmax ce ref = loops", np.allclose(ref, loop, equal_nan=True))
    gref = softmax_ce_grad_ref(logits, targets, 0.25)
    fd_ok = True
    for r in range(6):
        if targets[r] >= 7:
            fd_ok &= bool(np.all(np.isnan(gref[r])))
            continue
        for j in range(7):
            e = np.zeros_like(logits)
            e[r, j] = 1e-6
            fd = (softmax_ce_ref(logits + e, targets)[r] - softmax_ce_ref(logits - e, targets)[r]) / 2e-6
            fd_ok &= abs(0.25 * fd - gref[r, j]) < 1e-8
    expect("softmax ce grad = scale x finite difference, NaN row", fd_ok)

    # Optimizers: scalar loops.
    p, gr, m = (rng.uniform(-1, 1, 50) for _ in range(3))
    v = rng.uniform(0, 1, 50)
    pr, vr = sgd_ref(p, gr, v, 0.05, 0.9, 0.01)
    ok = True
    for i in range(50):
        vi = 0.9 * v[i] + gr[i] + 0.01 * p[i]
        ok &= math.isclose(vr[i], vi, rel_tol=1e-12) and math.isclose(pr[i], p[i] - 0.05 * vi, rel_tol=1e-12)
    expect("sgd ref = loop", ok)
    c = adamw_constants(1e-2, 0.9, 0.999, 1e-8, 0.01, 3)
    expect("adamw constants", math.isclose(float(c[5]), 1 / (1 - 0.9 ** 3), rel_tol=1e-6)
           and math.isclose(float(c[6]), 1 / (1 - 0.999 ** 3), rel_tol=1e-4)
           and all(isinstance(k, np.float32) for k in c))
    pr, mr, vr = adamw_ref(p, gr, m, v, c)
    lr, b1, b2, eps_, decay, ib1, ib2 = (float(k) for k in c)
    ok = True
    for i in range(50):
        mi = b1 * m[i] + (1 - b1) * gr[i]
        vi = b2 * v[i] + (1 - b2) * gr[i] ** 2
        pi = p[i] * decay - lr * mi * ib1 / (math.sqrt(vi * ib2) + eps_)
        ok &= math.isclose(mr[i], mi, rel_tol=1e-12) and math.isclose(vr[i], vi, rel_tol=1e-12)
        ok &= math.isclose(pr[i], pi, rel_tol=1e-12)
    expect("adamw ref = loop (PyTorch's form)", ok)

    # The comparisons: NaN where not expected is a mismatch, empty outputs pass, the norm is the one stated.
    expect("elem_err NaN handling", elem_err([np.nan, 1.0], [np.nan, 1.0]) == 0.0
           and elem_err([np.nan], [1.0]) == math.inf and elem_err([1.0], [np.nan]) == math.inf)
    expect("gemm_err NaN = inf, empty = 0", gemm_err([np.nan], [1.0], [1.0]) == math.inf
           and gemm_err(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 3))) == 0.0)
    expect("gemm_err norm", math.isclose(gemm_err([3.5], [3.0], [10.0]), 0.05)
           and math.isclose(gemm_err([0.5], [0.0], [0.1]), 0.5))
    # A TF32-like perturbation passes, an off-by-one-column output does not.
    x, w = f32(rng.uniform(-1, 1, (37, 257))), f32(rng.uniform(-1, 1, (257, 45)))
    zr, s = linear_forward_ref(x, w, np.zeros(45))
    def tf(a):  # TF32, to nearest with ties away (cvt.rna.tf32.f32)
        b = (a.view(np.uint32).astype(np.uint64) + 0x1000) & 0xFFFFE000
        return b.astype(np.uint32).view(np.float32)
    z_tf32 = (tf(x).astype(np.float32) @ tf(w).astype(np.float32))
    expect("tf32 product within the TF32 tolerance", gemm_err(z_tf32, zr, s) <= gemm_tol("tf32", 257))
    expect("shifted output fails the TF32 tolerance",
           gemm_err(np.roll(zr, 1, axis=1), zr, s) > 10 * gemm_tol("tf32", 257))
    zb = from_bf16_bits(to_bf16_bits(f32(zr)))
    expect("bf16-stored result within the BF16 tolerance", gemm_err(zb, zr, s) <= gemm_tol("bf16", 257, True))

    # The launch math: hand-computed shared memory (4 stages of A and B tiles, padded rows).
    expect("shared bytes", [shared_bytes_of(q, p) for p in PRECISIONS for q in PRODUCTS]
           == [75776, 81920, 53248, 75776, 81920, 53248] and MAX_SHARED_BYTES == 81920)
    expect("tc launch grid", tc_launch("Forward", "Tf32", 301, 257, 129)[0] == (2, 3, 1)
           and tc_launch("BackwardWeight", "Bf16", 301, 257, 129)[0] == (2, 5, 1)
           and tc_launch("BackwardInput", "Bf16", 0, 0, 0)[0] == (1, 1, 1))
    expect("simt grids", gemm_grid(37, 45) == (1, 1, 1) and gemm_grid(130, 129) == (3, 3, 1)
           and elementwise_grid(300_007) == (1024, 1, 1) and elementwise_grid(0) == (1, 1, 1))
    names = [c[1] for c in all_checks()]
    expect(f"{len(names)} check names unique", len(names) == len(set(names)))
    entries = {n.split(" ")[0] for n in names}
    expect("every entry of kernels/src/entry.rs checked", len(entries) == 19)
    print("self-test:", "ok" if not failures else f"FAILED ({len(failures)})")
    return 0 if not failures else 1


# ---------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description="Check pipefill's PTX with CuPy against NumPy float64.")
    ap.add_argument("--module", help="the PTX (text) or cubin to load with cupy.RawModule(path=...)")
    ap.add_argument("--only", choices=("simt", "tc", "all"), default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one launch may take (a hang)")
    ap.add_argument("--print-launches", action="store_true", help="print the launch shapes as JSON and exit")
    ap.add_argument("--self-test", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--skip-entries", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.print_launches:
        print_launches()
        return 0
    global np
    try:
        import numpy
        np = numpy
    except Exception as e:
        print(f"NOT VERIFIED: NumPy is not importable ({type(e).__name__}: {e})")
        return 3
    if args.self_test:
        return self_test()
    if not args.module:
        ap.error("--module PATH is required")
    try:
        import cupy as cp
    except Exception as e:
        print(f"NOT VERIFIED: CuPy is not importable ({type(e).__name__}: {e})")
        return 3
    try:
        count = cp.cuda.runtime.getDeviceCount()
        if count < 1:
            raise RuntimeError("no CUDA device")
        props = cp.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        optin = cp.cuda.Device(0).attributes.get("MaxSharedMemoryPerBlockOptin", "?")
    except Exception as e:
        print(f"NOT VERIFIED: no usable GPU ({type(e).__name__}: {e})")
        return 3
    start = time.monotonic()
    if args.start_at == 0:
        print(f"device: {name}, sm_{props['major']}{props['minor']}, opt-in shared memory per block "
              f"{optin} "
              f"bytes (kernels need up to {MAX_SHARED_BYTES}); module {args.module}; seed {args.seed}",
              flush=True)
    result = run_checks(args, cp)
    if result is None:
        print("ptx-check-partial: 1 1" if args.start_at else "ptx-check: MISMATCH (1 of 1)")
        return 1
    bad, lines, hung = result
    if args.start_at:
        print(f"ptx-check-partial: {bad} {lines}", flush=True)
        if hung:
            os._exit(1)
        return 0 if bad == 0 else 1
    print(f"elapsed: {time.monotonic() - start:.1f} s")
    print("ptx-check: ok" if bad == 0 else f"ptx-check: MISMATCH ({bad} of {lines})", flush=True)
    if hung:
        os._exit(1)  # tearing the context down could wait on the hung kernel
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
