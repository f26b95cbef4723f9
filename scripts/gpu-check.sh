#!/usr/bin/env bash
# The GPU checks in two halves (docs/gpu.md, "scripts/gpu-check.sh"):
#
#   scripts/gpu-check.sh build [DIR]   here (Rust toolchain, no GPU needed): the release binary, the GPU
#                                      test executables and the GPU bench executables into DIR
#                                      (default gpu-bundle/, git-ignored), with this script; checked to
#                                      stay under 64 MiB (what travels to the GPU machine).
#   DIR/gpu-check.sh run               there (NVIDIA driver, no Rust): from DIR only, at most 8 minutes,
#                                      everything written to $OUT (or ./gpu-results when unset):
#                                      nvidia-smi and the driver version, a CuPy check of the PTX
#                                      against NumPy (independent of Rust), the GPU tests with
#                                      PIPEFILL_REQUIRE_GPU=1, bench overlap, the gpu_sync bench, the
#                                      kernels bench (its table: bench-kernels.txt), a CUDA profile,
#                                      train --backend cuda for four families at P = 4, and step time
#                                      with and without --graph (a table in the summary).
#                                      gpu_nccl starts two processes on the one GPU
#                                      (NCCL_MULTI_RANK_GPU_ENABLE=1, the NCCL id through a file): a
#                                      grouped exchange and an all-reduce, then each process trains
#                                      its rank of 1f1b and zbv (P = 2, two steps) with the per-rank
#                                      stream runner over NCCL, losses against the one-process CUDA
#                                      run (summary: one line per family); where NCCL refuses, the
#                                      summary gets a note instead of a result.
#                                      Exit 1 when any step failed or ran out of time.
#
# cudarc finds libraries by name (lib{n}.so, .so.12, .11, .10, .9, .1); CUDA 13 ships .so.13, so `run`
# makes a folder of symlinks under the names cudarc tries for every cuBLAS / cuBLASLt / NVRTC / NCCL
# library it finds (pip wheels, ld cache) and puts it on LD_LIBRARY_PATH. The layers need only
# libcuda.so.1, which comes with the driver.
set -euo pipefail

LIMIT_BYTES=$((64 * 1024 * 1024))
RUN_SECONDS=480
GPU_TESTS=(gpu_kernels gpu_stage gpu_streams gpu_cli gpu_graph gpu_graph_cli gpu_tc gpu_tc_cli gpu_bf16 gpu_nccl gpu_devices)
GPU_BENCHES=(gpu_sync kernels)
# The kernels bench's shapes (square sizes and `model`): about 2 minutes on an H200 by estimate, not
# measured; drop 8192 first if the run gets short of time.
KERNELS_SIZES="1024,2048,4096,8192,model"

usage() {
    echo "usage: $0 build [DIR] | run" >&2
    exit 2
}

# Executables of the JSON messages on stdin (cargo --message-format=json), one per line.
executables() {
    jq -r 'select(.reason == "compiler-artifact" and .executable != null and ((.target.kind | index("test")) or (.target.kind | index("bench")))) | .executable'
}

build() {
    local dir="${1:-gpu-bundle}"
    local root
    root="$(cd "$(dirname "$0")/.." && pwd)"
    cd "$root"
    command -v jq >/dev/null || { echo "error: build needs jq (to read cargo's JSON messages)" >&2; exit 2; }
    rm -rf "$dir"
    mkdir -p "$dir/tests" "$dir/benches"
    cargo build --release --bin pipefill
    cp target/release/pipefill "$dir/pipefill"
    local args=() name exe
    for name in "${GPU_TESTS[@]}"; do args+=(--test "$name"); done
    while read -r exe; do
        name="$(basename "$exe")"
        cp "$exe" "$dir/tests/${name%-*}"
    done < <(cargo test --release --no-run --message-format=json "${args[@]}" | executables)
    args=()
    for name in "${GPU_BENCHES[@]}"; do args+=(--bench "$name"); done
    while read -r exe; do
        name="$(basename "$exe")"
        cp "$exe" "$dir/benches/${name%-*}"
    done < <(cargo bench --no-run --message-format=json "${args[@]}" | executables)
    local ptx
    ptx=$(ls -t target/release/build/pipefill-*/out/kernels.ptx 2>/dev/null | while read -r f; do
        [[ -s "$f" ]] && { echo "$f"; break; }; done)
    [[ -n "$ptx" ]] || { echo "error: no built PTX under target/release/build (is rust-src installed?)" >&2; exit 1; }
    cp "$ptx" "$dir/kernels.ptx"
    ptx_check > "$dir/ptx-check.py"
    cp "$0" "$dir/gpu-check.sh"
    git rev-parse HEAD > "$dir/commit.txt" 2>/dev/null || echo unknown > "$dir/commit.txt"
    for name in "${GPU_TESTS[@]}"; do
        [[ -x "$dir/tests/$name" ]] || { echo "error: test executable $name missing from $dir" >&2; exit 1; }
    done
    local size
    size=$(du -sb "$dir" | cut -f1)
    if (( size > LIMIT_BYTES )); then
        # Debug line tables are what makes them big; the GPU run can do without.
        find "$dir" -type f -perm -u+x ! -name '*.sh' -exec strip --strip-debug {} +
        size=$(du -sb "$dir" | cut -f1)
    fi
    if (( size > LIMIT_BYTES )); then
        echo "error: $dir is $size bytes, over the 64 MiB that travels to the GPU machine" >&2
        exit 1
    fi
    echo "gpu bundle: $dir ($((size / 1024 / 1024)) MiB, commit $(cat "$dir/commit.txt"))"
    ls -l "$dir" "$dir/tests" "$dir/benches"
}

# An independent check of the PTX with CuPy (no Rust on the GPU machine): the forward GEMM kernel with
# ReLU, and the AdamW kernel, on random data against NumPy.
ptx_check() {
    cat <<'PY'
import sys
import numpy as np
import cupy as cp

mod = cp.RawModule(path=sys.argv[1])
rng = np.random.default_rng(0)
rows, inputs, outputs = 37, 70, 45
x = rng.uniform(-1, 1, (rows, inputs)).astype(np.float32)
w = rng.uniform(-1, 1, (inputs, outputs)).astype(np.float32)
b = rng.uniform(-1, 1, outputs).astype(np.float32)
dx, dw, db = cp.asarray(x), cp.asarray(w), cp.asarray(b)
y = cp.zeros((rows, outputs), dtype=cp.float32)
z = cp.zeros((rows, outputs), dtype=cp.float32)
grid = ((outputs + 63) // 64, (rows + 63) // 64, 1)
f = mod.get_function("pf_linear_forward")
f(grid, (256, 1, 1), (dx, dw, db, y, z, np.uint32(rows), np.uint32(inputs), np.uint32(outputs), np.uint32(1)))
want_z = x.astype(np.float64) @ w.astype(np.float64) + b
err_z = np.abs(cp.asnumpy(z) - want_z).max()
err_y = np.abs(cp.asnumpy(y) - np.maximum(want_z, 0)).max()
print(f"pf_linear_forward relu {rows}x{inputs}x{outputs}: max |Z - ref| {err_z:.2e}, max |Y - ref| {err_y:.2e}")
n = 100_003
p, g = rng.uniform(-1, 1, n).astype(np.float32), rng.uniform(-1, 1, n).astype(np.float32)
lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-8, 0.01
dp, dg = cp.asarray(p), cp.asarray(g)
dm, dv = cp.zeros(n, dtype=cp.float32), cp.zeros(n, dtype=cp.float32)
a = mod.get_function("pf_adamw")
blocks = min((n + 255) // 256, 1024)
a((blocks, 1, 1), (256, 1, 1), (dp, dg, dm, dv, np.uint32(n), np.float32(lr), np.float32(b1), np.float32(b2),
    np.float32(eps), np.float32(1 - lr * wd), np.float32(1 / (1 - b1)), np.float32(1 / (1 - b2))))
m, v = (1 - b1) * g, (1 - b2) * g * g
want_p = p * (1 - lr * wd) - lr * (m / (1 - b1)) / (np.sqrt(v / (1 - b2)) + eps)
err_p = np.abs(cp.asnumpy(dp) - want_p).max()
print(f"pf_adamw step 1 over {n}: max |p - ref| {err_p:.2e}")
ok = err_z < 5e-4 and err_y < 5e-4 and err_p < 1e-5
print("ptx-check:", "ok" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
PY
}

# A folder of symlinks named as cudarc looks for them, for each CUDA library found.
link_libraries() {
    local links="$1" lib found base name
    mkdir -p "$links"
    local search=(/usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
    local site
    for site in $(python3 -c 'import site,sys; print(" ".join(site.getsitepackages()))' 2>/dev/null || true); do
        search+=("$site"/nvidia/*/lib)
    done
    for lib in cublas cublasLt nvrtc nccl curand; do
        found=$(find "${search[@]}" -maxdepth 1 -name "lib${lib}.so*" 2>/dev/null | sort | tail -n 1 || true)
        [[ -n "$found" ]] || continue
        for name in "lib${lib}.so" "lib${lib}.so.12"; do
            base="$links/$name"
            [[ -e "$base" ]] || ln -s "$found" "$base"
        done
        echo "linked lib${lib} -> $found"
    done
}

# Step time and host enqueue time per action with and without --graph (one run each: steps 0-1
# plain, 2 captured, 3-7 replayed), at the large size and at a small one where launches dominate.
graph_table() {
    local tmp="$1" family hidden
    for hidden in 2048 256; do
        for family in 1f1b zb-h1 zbv; do
            step "graph-$family-h$hidden" ./pipefill train --backend cuda --graph --ranks 4 \
                --schedule "$family" --layers 16 --hidden "$hidden" --batch 1024 --microbatches 8 \
                --steps 8 --format json --svg "$tmp/graph-$family-h$hidden.svg"
        done
    done
    python3 - "$OUT" >> "$SUMMARY" <<'PY' || echo "(graph table: could not be made)" >> "$SUMMARY"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("\n## Step time with and without --graph (P = 4, 16 layers, batch 1024, M = 8; medians)\n")
print("| family | hidden | step plain ms | step graph ms | host us/action plain | host us/action graph | actions |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for hidden in (2048, 256):
    for family in ("1f1b", "zb-h1", "zbv"):
        f = out / f"graph-{family}-h{hidden}.txt"
        lines = [l for l in f.read_text().splitlines() if l.startswith("{")] if f.exists() else []
        if not lines:
            print(f"| {family} | {hidden} | no result | | | | |")
            continue
        h = json.loads(lines[-1]).get("host_enqueue") or {}
        ms = lambda k: "-" if h.get(k) is None else f"{h[k] * 1e3:.3f}"
        us = lambda k: "-" if h.get(k) is None else f"{h[k] * 1e6:.2f}"
        print(f"| {family} | {hidden} | {ms('plain_step_time_s')} | {ms('graph_step_time_s')} | "
              f"{us('plain_per_action_s')} | {us('graph_per_action_s')} | {h.get('actions', '-')} |")
PY
}

# Runs "$@" with what is left of the time budget, its output to $OUT/$1.txt; records the result.
step() {
    local name="$1"
    shift
    local left=$((DEADLINE - SECONDS))
    if (( left <= 5 )); then
        echo "| $name | not run: out of time |" >> "$SUMMARY"
        FAILURES=$((FAILURES + 1))
        return
    fi
    local rc=0
    timeout "$left" "$@" > "$OUT/$name.txt" 2>&1 || rc=$?
    local verdict="ok"
    (( rc == 0 )) || { verdict="FAILED (exit $rc)"; FAILURES=$((FAILURES + 1)); }
    (( rc == 124 )) && verdict="TIMED OUT"
    echo "| $name | $verdict |" >> "$SUMMARY"
    echo "$name: $verdict"
}

run() {
    cd "$(dirname "$0")"
    OUT="${OUT:-./gpu-results}"
    mkdir -p "$OUT"
    DEADLINE=$((SECONDS + RUN_SECONDS))
    FAILURES=0
    SUMMARY="$OUT/summary.md"
    {
        echo "# pipefill GPU check"
        echo
        echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "- commit: $(cat commit.txt 2>/dev/null || echo unknown)"
        echo "- card: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi failed')"
        echo "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null || echo unknown)"
        echo
        echo "| step | result |"
        echo "| --- | --- |"
    } > "$SUMMARY"
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
    local links="$PWD/cuda-libs"
    link_libraries "$links" > "$OUT/libraries.txt" 2>&1 || true
    export LD_LIBRARY_PATH="$links${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PIPEFILL_REQUIRE_GPU=1 PIPEFILL_BIN="$PWD/pipefill"
    step ptx-check-cupy python3 ./ptx-check.py ./kernels.ptx
    local t
    for t in "${GPU_TESTS[@]}"; do
        step "test-$t" "./tests/$t" --test-threads=1 --nocapture
    done
    if grep -q "NCCL refused" "$OUT/test-gpu_nccl.txt" 2>/dev/null; then
        echo "| note | gpu_nccl: NCCL refused, not run: $(grep -m1 'NCCL refused' "$OUT/test-gpu_nccl.txt") |" >> "$SUMMARY"
    fi
    grep -o "nccl train [a-z0-9-]*: losses equal.*" "$OUT/test-gpu_nccl.txt" 2>/dev/null |
        while read -r line; do echo "| note | gpu_nccl: $line |" >> "$SUMMARY"; done || true
    step bench-overlap ./pipefill bench overlap --hidden 512,1024,2048,4096 --rows 256,1024
    local b
    export PIPEFILL_KERNELS_SIZES="$KERNELS_SIZES" CRITERION_HOME="$OUT/criterion"
    for b in "${GPU_BENCHES[@]}"; do
        step "bench-$b" "./benches/$b" --bench
    done
    local tmp="$OUT/files"
    mkdir -p "$tmp"
    step profile-cuda ./pipefill profile --backend cuda --layers 8 --hidden 2048 --batch 1024 \
        --microbatches 8 --sizes none --out "$tmp/costs-cuda.json"
    local family
    for family in 1f1b interleaved-1f1b zb-h1 zbv; do
        step "train-$family" ./pipefill train --backend cuda --ranks 4 --schedule "$family" \
            --layers 16 --hidden 2048 --batch 1024 --microbatches 8 --steps 5 --format json \
            --svg "$tmp/train-$family.svg"
    done
    graph_table "$tmp"
    echo "summary: $SUMMARY"
    cat "$SUMMARY"
    if (( FAILURES > 0 )); then
        echo "$FAILURES step(s) failed or did not run: see $OUT/<step>.txt" >&2
        exit 1
    fi
}

case "${1:-}" in
    build) shift; build "$@" ;;
    run) run ;;
    *) usage ;;
esac
