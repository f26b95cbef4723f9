#!/usr/bin/env python3
"""GPU check of the tensor-core kernels (issue #12): one script for a machine with a GPU.

    python3 kernels/scripts/gpu_check.py KERNELS_PTX [--time] [--size N]
    python3 kernels/scripts/gpu_check.py --self-test      # no GPU: checks this script's own helpers

KERNELS_PTX is the PTX `build.rs` writes (`target/release/build/pipefill-cuda-*/out/kernels.ptx`; the newest one).
Needs NumPy and CuPy (and PyTorch for `--time`), all on the lent GPU machine.

1. Correctness: each of the six entries (`pf_linear_{forward,backward_input,backward_weight}_{tf32,bf16}`)
   is launched with the launch shapes of `pipefill_kernels::tc::launch` on awkward sizes and compared with a
   NumPy `f64` reference at the tolerances of `kernels/tests/tensor_core_linear.rs`. Exit code 1 on any
   failure.
2. `--time`: each fused kernel at N x N x N (default 4096) against cuBLAS (PyTorch): SGEMM, TF32 GEMM, BF16
   GEMM, GEMM + separate GELU, and cuBLASLt's fused GELU + bias (`torch._addmm_activation`). Prints ms and
   TFLOP/s (2 m n k / t). Timings are medians of CUDA-event-timed repeats.

The launch shapes below copy `kernels/src/tc/mod.rs` (block tiles, dynamic shared bytes); a mismatch shows up as
wrong results or a launch error, never as silently skipped work.
"""

import argparse
import math
import sys

import numpy as np

EPS = float(np.finfo(np.float32).eps)
PRODUCTS = ("forward", "backward_input", "backward_weight")
PRECISIONS = ("tf32", "bf16")
# tc::block_tile, and tc::launch's shared_bytes (4 stages of both operand tiles).
TILES = {"forward": (128, 128), "backward_input": (128, 128), "backward_weight": (64, 128)}
SHARED = {"forward": 75776, "backward_input": 81920, "backward_weight": 53248}
ACT = {"identity": 0, "relu": 1, "gelu": 2, "silu": 3}
# Relative error of a product from the kernel's input rounding / of storing a result.
IN_REL = {"tf32": 1.01 / 1024, "bf16": 0.0}
OUT_REL = {"tf32": 0.0, "bf16": 1.01 / 256}
SHAPES = [(1, 1, 1), (17, 63, 130), (130, 17, 63), (63, 130, 17), (40, 200, 136), (300, 129, 1000),
          (257, 512, 384)]


def entry(product, precision):
    return f"pf_linear_{product}_{precision}"


def grid(product, rows, inputs, outputs):
    """tc::launch's grid: x along the output's columns, y along its rows, at least 1 each."""
    m, n = {"forward": (rows, outputs), "backward_input": (rows, inputs),
            "backward_weight": (inputs, outputs)}[product]
    bm, bn = TILES[product]
    return (max(1, -(-n // bn)), max(1, -(-m // bm)), 1)


def bf16_bits(x):
    """f32 -> BF16 bits, round to nearest even, NaN kept (cvt.rn.bf16.f32)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    nan = np.isnan(np.asarray(x, np.float32))
    r = np.where(nan, (u >> 16) | 0x40, r)
    return r.astype(np.uint16)


def bf16_value(h):
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


def act64(name, z):
    if name == "identity":
        return z
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "gelu":
        u = math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)
        return 0.5 * z * (1 + np.tanh(u))
    return z / (1 + np.exp(-z))


def dact64(name, z):
    if name == "identity":
        return np.ones_like(z)
    if name == "relu":
        return (z > 0).astype(np.float64)
    if name == "gelu":
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (z + 0.044715 * z**3))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * 0.044715 * z * z)
    s = 1 / (1 + np.exp(-z))
    return s * (1 + z * (1 - s))


def forward_bound(name, z):
    """Relative error bound of the f32 activation (kernels/tests/common: 8 eps (1 + |exp argument|))."""
    arg = {"gelu": np.abs(2 * 0.7978846 * (z + 0.044715 * z**3)), "silu": np.abs(z)}.get(name, 0 * z)
    return 8 * EPS * (1 + arg)


def stored(precision, x):
    """(what goes to the GPU, its f64 value)."""
    x = np.asarray(x, np.float32)
    if precision == "bf16":
        h = bf16_bits(x)
        return h, bf16_value(h).astype(np.float64)
    return x, x.astype(np.float64)


def loaded(precision, arr):
    return (bf16_value(arr) if precision == "bf16" else arr).astype(np.float64)


def worst(got, want, tol):
    """The largest error / tolerance ratio (<= 1 passes) and where."""
    if want.size == 0:
        return 0.0, None
    ratio = np.abs(got - want) / tol
    ratio = np.where(np.isnan(got), np.inf, ratio)
    i = int(np.argmax(ratio))
    return float(ratio.flat[i]), np.unravel_index(i, want.shape)


def reference(product, precision, act, data, rows, inputs, outputs):
    """{output name: (want, tol)} in f64, as kernels/tests/tensor_core_linear.rs states them."""
    ir, orl = IN_REL[precision], OUT_REL[precision]
    if product == "forward":
        x, w, b = data["x"], data["w"], data["b"]
        z = x @ w + b
        scale = np.abs(x) @ np.abs(w) + np.abs(b)
        acc = (ir + (inputs + 2) * EPS) * scale + 1e-30
        y = act64(act, z)
        fb = forward_bound(act, z) * np.abs(y)
        return {"z": (z, acc + orl * (np.abs(z) + acc)),
                "y": (y, 1.2 * acc + fb + orl * (np.abs(y) + 1.2 * acc + fb) + 1e-30)}
    if product == "backward_input":
        dy, zz, w = data["dy"], data["z"], data["w"]
        dz = dy * dact64(act, zz)
        dztol = 2e-6 + EPS * np.abs(dz) + orl * (np.abs(dz) + 2e-6)
        dx = dz @ w.T
        a, e = np.abs(dz) @ np.abs(w).T, dztol @ np.abs(w).T
        acc = e + (ir + (outputs + 2) * EPS) * (a + e) + 1e-30
        return {"dz": (dz, dztol), "dx": (dx, acc + orl * (np.abs(dx) + acc))}
    x, dz, dw0, db0 = data["x"], data["dz"], data["dw0"], data["db0"]
    a = np.abs(x).T @ np.abs(dz)
    dw = dw0 + x.T @ dz
    db = db0 + dz.sum(axis=0)
    return {"dw": (dw, (ir + (rows + 3) * EPS) * a + EPS * (np.abs(dw0) + a) + 1e-30),
            "db": (db, (rows + 2) * EPS * (np.abs(dz).sum(axis=0) + np.abs(db0)) + 1e-30)}


def inputs_for(product, precision, rng, rows, inputs, outputs):
    """(GPU arrays as NumPy, their f64 values)."""
    u = lambda *shape, lo=-1.0, hi=1.0: rng.uniform(lo, hi, shape).astype(np.float32)
    raw = {"forward": {"x": u(rows, inputs), "w": u(inputs, outputs)},
           "backward_input": {"dy": u(rows, outputs), "z": u(rows, outputs, lo=-4, hi=4),
                              "w": u(inputs, outputs)},
           "backward_weight": {"x": u(rows, inputs), "dz": u(rows, outputs)}}[product]
    gpu, vals = {}, {}
    for name, arr in raw.items():
        gpu[name], vals[name] = stored(precision, arr)
    if product == "forward":
        gpu["b"] = u(outputs)
        vals["b"] = gpu["b"].astype(np.float64)
    if product == "backward_weight":
        gpu["dw0"], gpu["db0"] = u(inputs, outputs), u(outputs)
        vals["dw0"], vals["db0"] = gpu["dw0"].astype(np.float64), gpu["db0"].astype(np.float64)
    return gpu, vals


class Gpu:
    """The PTX module and launches (CuPy)."""

    def __init__(self, ptx_path):
        import cupy as cp
        self.cp = cp
        self.module = cp.RawModule(path=ptx_path)
        self.kernels = {}

    def kernel(self, product, precision):
        key = (product, precision)
        if key not in self.kernels:
            k = self.module.get_function(entry(product, precision))
            # Above 48 KiB of dynamic shared memory a function must opt in before its first launch.
            k.max_dynamic_shared_size_bytes = SHARED[product]
            self.kernels[key] = k
        return self.kernels[key]

    def launcher(self, product, precision, act, g, rows, inputs, outputs):
        """A no-argument function that launches once on the device arrays `g` (outputs included)."""
        k, u32 = self.kernel(product, precision), np.uint32
        dims = (u32(rows), u32(inputs), u32(outputs))
        args = {"forward": lambda: (g["x"], g["w"], g["b"], g["y"], g["z"], *dims, u32(ACT[act])),
                "backward_input": lambda: (g["dy"], g["z"], g["w"], g["dx"], g["dz"], *dims, u32(ACT[act])),
                "backward_weight": lambda: (g["x"], g["dz"], g["dw"], g["db"], *dims)}[product]()
        shape = grid(product, rows, inputs, outputs)
        return lambda: k(shape, (256, 1, 1), args, shared_mem=SHARED[product])

    def run(self, product, precision, act, host, rows, inputs, outputs):
        cp = self.cp
        g = {name: cp.asarray(arr) for name, arr in host.items()}
        elem = np.uint16 if precision == "bf16" else np.float32
        nan = int(bf16_bits(np.array([np.nan], np.float32))[0]) if precision == "bf16" else np.float32("nan")
        if product == "forward":
            for name in ("y", "z"):
                g[name] = cp.full((rows, outputs), nan, dtype=elem)
        elif product == "backward_input":
            g["dx"] = cp.full((rows, inputs), nan, dtype=elem)
            g["dz"] = cp.full((rows, outputs), nan, dtype=elem)
        else:
            g["dw"], g["db"] = g.pop("dw0").copy(), g.pop("db0").copy()
        self.launcher(product, precision, act, g, rows, inputs, outputs)()
        cp.cuda.runtime.deviceSynchronize()
        return {name: cp.asnumpy(arr) for name, arr in g.items()}


def check_all(gpu):
    rng = np.random.default_rng(12)
    failures = 0
    for precision in PRECISIONS:
        for product in PRODUCTS:
            for i, (rows, inputs, outputs) in enumerate(SHAPES):
                act = list(ACT)[i % 4] if product != "backward_weight" else "identity"
                host, vals = inputs_for(product, precision, rng, rows, inputs, outputs)
                out = gpu.run(product, precision, act, host, rows, inputs, outputs)
                for name, (want, tol) in reference(product, precision, act, vals, rows, inputs,
                                                   outputs).items():
                    got = out[name]
                    got = got.astype(np.float64) if name in ("dw", "db") else loaded(precision, got)
                    r, at = worst(got, want, tol)
                    ok = r <= 1.0
                    failures += not ok
                    print(f"{'ok  ' if ok else 'FAIL'} {entry(product, precision):32} {act:8} "
                          f"{rows}x{inputs}x{outputs:<6} {name:3} worst error/tolerance {r:.3g}"
                          + ("" if ok else f" at {at}"))
    return failures


def time_all(gpu, n):
    import torch
    cp = gpu.cp
    rng = np.random.default_rng(5)

    def median_ms(fn, reps=20):
        fn()
        times = []
        for _ in range(reps):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        return float(np.median(times))

    def report(name, ms):
        print(f"  {name:52} {ms:8.3f} ms {2 * n**3 / ms / 1e9:8.1f} TFLOP/s")

    print(f"timings at {n} x {n} x {n} (median of 20) on {torch.cuda.get_device_name()}")
    for precision in PRECISIONS:
        for product in PRODUCTS:
            host, _ = inputs_for(product, precision, rng, n, n, n)
            g = {k: cp.asarray(v) for k, v in host.items()}
            elem = np.uint16 if precision == "bf16" else np.float32
            if product == "forward":
                g["y"], g["z"] = cp.empty((n, n), elem), cp.empty((n, n), elem)
            elif product == "backward_input":
                g["dx"], g["dz"] = cp.empty((n, n), elem), cp.empty((n, n), elem)
            else:
                g["dw"], g["db"] = g.pop("dw0"), g.pop("db0")
            launch = gpu.launcher(product, precision, "gelu", g, n, n, n)
            report(f"{entry(product, precision)} (gelu, stores Z/dZ/db)", median_ms(launch))
    # PyTorch and CuPy both launch on the legacy default stream here, so CuPy's events time PyTorch's work.
    for dtype, tf32, label in ((torch.float32, False, "fp32"), (torch.float32, True, "tf32"),
                               (torch.bfloat16, False, "bf16")):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        x = torch.randn(n, n, device="cuda", dtype=dtype)
        w = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        report(f"cuBLAS {label} GEMM", median_ms(lambda: torch.mm(x, w)))
        gelu = torch.nn.functional.gelu
        report(f"cuBLAS {label} addmm + separate gelu(tanh)",
               median_ms(lambda: gelu(torch.addmm(b, x, w), approximate="tanh")))
        report(f"cuBLASLt {label} fused bias + GELU (_addmm_activation)",
               median_ms(lambda: torch._addmm_activation(b, x, w, use_gelu=True)))
    torch.backends.cuda.matmul.allow_tf32 = False


class NumpyStandIn:
    """What the kernels compute, in NumPy (TF32 input rounding, f32 results, BF16 storage): lets
    `--self-test` run `check_all` end to end without a GPU."""

    def run(self, product, precision, act, host, rows, inputs, outputs):
        def val(name):
            if precision == "bf16":
                return bf16_value(host[name]).astype(np.float64)
            bits = host[name].view(np.uint32).astype(np.uint64)
            return ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32).astype(np.float64)

        def store(x):
            x = np.asarray(x, np.float32)
            return bf16_bits(x) if precision == "bf16" else x

        if product == "forward":
            z = (val("x") @ val("w")).astype(np.float32) + host["b"]
            return {"z": store(z), "y": store(act64(act, z.astype(np.float64)))}
        if product == "backward_input":
            dy, zz = loaded(precision, host["dy"]), loaded(precision, host["z"])
            dz = store(dy * dact64(act, zz))
            return {"dz": dz, "dx": store(loaded(precision, dz) @ val("w").T)}
        x, dz = val("x"), val("dz")
        return {"dw": (host["dw0"] + x.T @ dz).astype(np.float32),
                # The bias gradient sums dZ as stored (TF32 rounding happens only in fragments).
                "db": (host["db0"] + loaded(precision, host["dz"]).sum(axis=0)).astype(np.float32)}


def self_test():
    """Checks the helpers against the Rust side's facts (no GPU needed)."""
    f = lambda bits: np.array([bits], np.uint32).view(np.float32)
    assert bf16_bits(f(0x3F808000))[0] == 0x3F80 and bf16_bits(f(0x3F818000))[0] == 0x3F82
    assert bf16_bits(f(0x3F808001))[0] == 0x3F81 and np.isnan(bf16_value(bf16_bits(np.float32("nan"))))
    assert bf16_value(bf16_bits(np.array([-2.5], np.float32)))[0] == -2.5
    # kernels/tests/tensor_core.rs: launch_shapes_cover_the_output_and_fit_the_gpus.
    assert [grid(p, 300, 129, 1000) for p in PRODUCTS] == [(8, 3, 1), (2, 3, 1), (8, 3, 1)]
    assert all(grid(p, 0, 0, 0) == (1, 1, 1) for p in PRODUCTS)
    # The references pass on themselves and fail on a perturbed result.
    rng = np.random.default_rng(1)
    for precision in PRECISIONS:
        for product in PRODUCTS:
            host, vals = inputs_for(product, precision, rng, 17, 63, 130)
            for name, (want, tol) in reference(product, precision, "gelu", vals, 17, 63, 130).items():
                assert worst(want, want, tol)[0] == 0.0
                assert worst(want + 10 * tol, want, tol)[0] > 1.0, (product, name)
    assert check_all(NumpyStandIn()) == 0
    print("self-test ok")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ptx", nargs="?", help="the kernels.ptx that build.rs wrote")
    p.add_argument("--time", action="store_true", help="also time against cuBLAS / cuBLASLt (PyTorch)")
    p.add_argument("--size", type=int, default=4096, help="N of the N x N x N timings (default 4096)")
    p.add_argument("--self-test", action="store_true", help="check this script's helpers; no GPU")
    args = p.parse_args()
    if args.self_test:
        self_test()
        return 0
    if not args.ptx:
        p.error("give the path of kernels.ptx (or --self-test)")
    if args.size < 1:
        p.error("--size must be at least 1")
    gpu = Gpu(args.ptx)
    failures = check_all(gpu)
    print(f"{failures} failed checks")
    if args.time and failures == 0:
        time_all(gpu, args.size)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
