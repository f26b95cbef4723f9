#!/usr/bin/env bash
# The GPU checks in two halves (docs/gpu.md, "The GPU check: scripts/gpu-check.sh").
#
#   scripts/gpu-check.sh build [DIR]   here (Rust toolchain, no GPU needed): checks and installs its
#                                      prerequisites (rust-src, ptxas, jq), then puts into DIR (default
#                                      gpu-bundle/, git-ignored): the release binary (and, where MPI is
#                                      installed here, a second one built with `--features mpi`), the GPU
#                                      test and bench executables, the PTX, a cubin assembled from it for
#                                      sm_90 with ptxas, the CuPy check, and this script. At most 64 MiB
#                                      (what travels to the GPU machine).
#   DIR/gpu-check.sh run               there (NVIDIA driver, no Rust): from DIR only, within a budget of
#                                      RUN_BUDGET seconds (300), every step under its own cap, everything
#                                      written to $OUT (or ./gpu-results): summary.md first.
#   DIR/gpu-check.sh run STEP...       only the steps whose names start with one of STEP (a rerun of
#                                      what failed), same budget rules.
#
# Steps, most valuable first (a step's output is $OUT/<step>.txt):
#   env             nvidia-smi (name, driver, compute mode, MIG), the CUDA libraries found and linked,
#                   then `pipefill device --json`: NCCL's version and every library the process loaded
#   module-load     `pipefill device`: the kernels loaded (the sm_90 cubin, else the PTX through the
#                   driver's JIT) with the JIT's logs and every kernel's registers; if this fails, the
#                   run stops here (the log says why) and every later step reads "not run"
#   cupy-simt       the PTX's SIMT kernels through CuPy against NumPy (independent of Rust)
#   cupy-tc         the PTX's tensor-core kernels and BF16 conversions through CuPy against NumPy
#   test-*          the GPU tests with PIPEFILL_REQUIRE_GPU=1 (--include-ignored: plain `cargo test`
#                   lists them as ignored); the NCCL cases each on their own, "NOT VERIFIED" when NCCL
#                   refuses two ranks on one GPU
#   train-*         train --backend cuda for four families at P = 4, then the --graph table, then
#                   --graph --devices per-rank against the plain run (with 2 GPUs or more; else NOT
#                   VERIFIED: tests/gpu_devices.rs captures across two contexts of one GPU)
#   mpi-cuda        two GPU ranks as two MPI processes over NCCL, losses against one process (where
#                   MPI is installed there and the bundle has the mpi binary; else NOT VERIFIED);
#                   mpi-cuda-graph: the same with --graph (each process captures its rank's step,
#                   its NCCL calls included), losses against the plain two-process run
#   bench-*         bench overlap, the gpu_sync bench, then the kernels bench at small sizes (last)
#
# Results: ok, FAILED (exit N), TIMED OUT, NOT VERIFIED (why), not run (why). Exit 0 only when every
# step that ran is ok; on a machine without a GPU the run ends within seconds with nothing ok.
set -euo pipefail

LIMIT_BYTES=$((64 * 1024 * 1024))
RUN_BUDGET=300
# Caps in seconds (no step may take more than 180).
CAP_TEST=90
CAP_NCCL=45
# Test binaries, most valuable first; NCCL cases run one by one (name:test).
GPU_TESTS=(gpu_kernels gpu_tc gpu_stage gpu_streams gpu_cli gpu_tc_cli gpu_graph gpu_graph_cli gpu_bf16 gpu_devices gpu_nccl)
NCCL_CASES=(
    "gpu_nccl:two_processes_exchange_and_reduce_over_nccl_on_one_gpu"
    "gpu_nccl:two_processes_train_1f1b_and_zbv_over_nccl_like_one_process"
    "gpu_bf16:two_processes_train_bf16_stages_over_nccl_like_one_process"
)
GPU_BENCHES=(gpu_sync kernels)
# The kernels bench's shapes: small, so it fits what is left of the budget.
KERNELS_SIZES="1024,2048,model"
CUBIN_ARCH=sm_90
NVCC_WHEEL="nvidia-cuda-nvcc-cu12==12.9.86"

usage() {
    echo "usage: $0 build [DIR] | run [STEP...]" >&2
    exit 2
}

# ---------------------------------------------------------------------------------------------
# build

# Executables of the JSON messages on stdin (cargo --message-format=json), one per line.
executables() {
    jq -r 'select(.reason == "compiler-artifact" and .executable != null and ((.target.kind | index("test")) or (.target.kind | index("bench")))) | .executable'
}

# sudo where there is one and we are not root (as .ci/run does).
as_root() {
    if [[ "$(id -u)" != 0 ]] && command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi
}

# ptxas from PIPEFILL_PTXAS, PATH, or the nvidia-cuda-nvcc wheel; empty when none.
find_ptxas() {
    if [[ -n "${PIPEFILL_PTXAS:-}" ]]; then echo "$PIPEFILL_PTXAS"; return; fi
    if command -v ptxas >/dev/null; then command -v ptxas; return; fi
    local dir
    dir=$(python3 -c 'import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])' 2>/dev/null) || return 0
    [[ -x "$dir/bin/ptxas" ]] || chmod +x "$dir/bin/ptxas" 2>/dev/null || true
    [[ -x "$dir/bin/ptxas" ]] && echo "$dir/bin/ptxas"
    return 0
}

# Checks build's prerequisites before the long build, installing what can be installed.
prerequisites() {
    echo "== prerequisites"
    if ! rustup component list --installed 2>/dev/null | grep -q '^rust-src'; then
        rustup component add rust-src
    fi
    if [[ -z "$(find_ptxas)" ]]; then
        python3 -m pip install --quiet --disable-pip-version-check "$NVCC_WHEEL"
    fi
    [[ -n "$(find_ptxas)" ]] || { echo "error: no ptxas (install the $NVCC_WHEEL wheel or set PIPEFILL_PTXAS)" >&2; exit 2; }
    if ! command -v jq >/dev/null; then
        as_root apt-get update -qq && as_root apt-get install -y -qq jq >/dev/null
    fi
    command -v jq >/dev/null || { echo "error: build needs jq (apt-get install jq)" >&2; exit 2; }
    echo "rust-src: installed; ptxas: $(find_ptxas); jq: $(command -v jq)"
}

build() {
    local dir="${1:-gpu-bundle}"
    local root
    root="$(cd "$(dirname "$0")/.." && pwd)"
    cd "$root"
    prerequisites
    rm -rf "$dir"
    mkdir -p "$dir/tests" "$dir/benches"
    if command -v mpicc >/dev/null || [[ -e /usr/include/x86_64-linux-gnu/mpi.h || -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ]]; then
        # First, so that the default build below is what target/release/pipefill holds for the
        # tests (the feature changes only the root crate; the dependencies are shared).
        cargo build --release --bin pipefill --features mpi
        cp target/release/pipefill "$dir/pipefill-mpi"
    else
        echo "note: no MPI here (libopenmpi-dev): the bundle has no pipefill-mpi; the run reports mpi-cuda NOT VERIFIED"
    fi
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
    ptx=$(ls -t target/release/build/pipefill-cuda-*/out/kernels.ptx 2>/dev/null | while read -r f; do
        [[ -s "$f" ]] && { echo "$f"; break; }; done)
    [[ -n "$ptx" ]] || { echo "error: no built PTX under target/release/build (is rust-src installed?)" >&2; exit 1; }
    cp "$ptx" "$dir/kernels.ptx"
    # The binary uses the cubin only beside the PTX it was assembled from (PIPEFILL_CUBIN).
    "$(find_ptxas)" -arch="$CUBIN_ARCH" -O3 "$dir/kernels.ptx" -o "$dir/kernels.$CUBIN_ARCH.cubin"
    cp scripts/gpu/ptx_check.py "$dir/ptx-check.py"
    cp "$0" "$dir/gpu-check.sh"
    git rev-parse HEAD > "$dir/commit.txt" 2>/dev/null || echo unknown > "$dir/commit.txt"
    for name in "${GPU_TESTS[@]}"; do
        [[ -x "$dir/tests/$name" ]] || { echo "error: test executable $name missing from $dir" >&2; exit 1; }
    done
    local size
    size=$(du -sb "$dir" | cut -f1)
    if (( size > LIMIT_BYTES )); then
        # Debug line tables are what makes them big; the GPU run can do without.
        find "$dir" -type f -perm -u+x ! -name '*.sh' ! -name '*.py' -exec strip --strip-debug {} +
        size=$(du -sb "$dir" | cut -f1)
    fi
    if (( size > LIMIT_BYTES )); then
        echo "error: $dir is $size bytes, over the 64 MiB that travels to the GPU machine" >&2
        exit 1
    fi
    echo "gpu bundle: $dir ($((size / 1024 / 1024)) MiB, commit $(cat "$dir/commit.txt"))"
    ls -l "$dir" "$dir/tests" "$dir/benches"
}

# ---------------------------------------------------------------------------------------------
# run

# Library folders to search, in order of preference: the Python wheels (user site, site-packages,
# sys.prefix), then the CUDA toolkit and the system (the ld cache last).
library_dirs() {
    python3 - <<'PY' 2>/dev/null || true
import glob, site, sys
roots = []
try:
    roots.append(site.getusersitepackages())
except Exception:
    pass
try:
    roots += site.getsitepackages()
except Exception:
    pass
roots += glob.glob(sys.prefix + "/lib/python3*/site-packages")
seen = set()
for r in roots:
    for d in sorted(glob.glob(r + "/nvidia/**/lib", recursive=True)):
        if d not in seen:
            seen.add(d)
            print(d)
PY
    echo /usr/local/cuda/lib64
    echo /usr/local/cuda/targets/x86_64-linux/lib
    echo /usr/lib/x86_64-linux-gnu
}

# A folder of symlinks named as cudarc looks for them (lib{n}.so, .so.12), for each CUDA library
# found; the first found in library_dirs' order wins (a wheel's NCCL before an older system one).
link_libraries() {
    local links="$1" lib dir found name
    mkdir -p "$links"
    mapfile -t dirs < <(library_dirs)
    for lib in cublas cublasLt nvrtc nccl curand; do
        found=""
        for dir in "${dirs[@]}"; do
            [[ -d "$dir" ]] || continue
            found=$(find "$dir" -maxdepth 1 -name "lib${lib}.so*" 2>/dev/null | sort | tail -n 1)
            [[ -n "$found" ]] && break
        done
        if [[ -z "$found" ]]; then
            found=$(ldconfig -p 2>/dev/null | awk -v n="lib${lib}.so" '$1 ~ "^"n {print $NF; exit}')
        fi
        [[ -n "$found" ]] || { echo "lib${lib}: not found"; continue; }
        for name in "lib${lib}.so" "lib${lib}.so.12"; do
            [[ -e "$links/$name" ]] || ln -s "$found" "$links/$name"
        done
        echo "lib${lib}: $found"
    done
}

# Writes summary.md from its parts: the environment lines, the step table, the tables after it
# (rewritten after every step, so a run cut short still leaves a summary).
write_summary() {
    {
        cat "$OUT/.head"
        echo
        echo "| step | result | seconds | cap |"
        echo "| --- | --- | --- | --- |"
        cat "$OUT/.rows"
        cat "$OUT/.tables"
    } > "$SUMMARY"
}

# Records one step's result in the summary.
record() {
    local name="$1" verdict="$2" secs="$3" cap="$4"
    echo "| $name | $verdict | $secs | $cap |" >> "$OUT/.rows"
    write_summary
    echo "$name: $verdict (${secs} s)"
    case "$verdict" in
        ok) ;;
        "NOT VERIFIED"*) NOT_VERIFIED=$((NOT_VERIFIED + 1)) ;;
        *) FAILURES=$((FAILURES + 1)) ;;
    esac
}

# Whether step NAME was asked for (all are, when no STEP arguments were given).
wanted() {
    local name="$1" s
    (( ${#ONLY[@]} == 0 )) && return 0
    for s in "${ONLY[@]}"; do [[ "$name" == "$s"* ]] && return 0; done
    return 1
}

# step NAME CAP COMMAND...: runs the command under min(CAP, budget left), its output to
# $OUT/NAME.txt. The verdict is in STEP_RC / the summary. A step is not run once the run has
# stopped (STOPPED holds why) or the budget is spent.
step() {
    local name="$1" cap="$2"
    shift 2
    STEP_RC=""
    wanted "$name" || return 0
    if [[ -n "$STOPPED" ]]; then
        record "$name" "not run ($STOPPED)" 0 "$cap"
        return 0
    fi
    local left=$((DEADLINE - SECONDS))
    if (( left < 5 )); then
        record "$name" "not run (budget spent)" 0 "$cap"
        return 0
    fi
    local limit=$(( cap < left ? cap : left ))
    local start=$SECONDS rc=0
    if declare -F "$1" > /dev/null; then
        # A function of this script: run by a child bash (exported with export -f).
        timeout -k 5 "$limit" bash -c '"$@"' _ "$@" > "$OUT/$name.txt" 2>&1 || rc=$?
    else
        timeout -k 5 "$limit" "$@" > "$OUT/$name.txt" 2>&1 || rc=$?
    fi
    STEP_RC=$rc
    local secs=$((SECONDS - start)) verdict
    if (( rc == 0 )); then
        verdict=ok
    elif (( rc == 124 || rc == 137 )); then
        verdict="TIMED OUT"
    else
        verdict="FAILED (exit $rc)"
    fi
    # A step may say it verified nothing (no CuPy, NCCL refusing two ranks on one GPU).
    local why
    why=$(grep -m1 -oE "NOT VERIFIED: .*|NCCL refused[^;]*" "$OUT/$name.txt" 2>/dev/null | head -c 200 || true)
    if [[ -n "$why" && ( "$verdict" == ok || "$rc" == 3 ) ]]; then
        verdict="NOT VERIFIED (${why#NOT VERIFIED: })"
    fi
    record "$name" "$verdict" "$secs" "$limit"
}

# The environment lines of the summary and $OUT/env.txt.
environment() {
    local smi="nvidia-smi --query-gpu"
    {
        echo "- card: $($smi=name,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi failed')"
        echo "- driver: $($smi=driver_version --format=csv,noheader 2>/dev/null || echo unknown)"
        echo "- compute mode: $($smi=compute_mode --format=csv,noheader 2>/dev/null || echo unknown)"
        echo "- mig: $($smi=mig.mode.current --format=csv,noheader 2>/dev/null || echo unknown)"
    } >> "$OUT/.head"
    local device_json="$OUT/device.json"
    ./pipefill device --json > "$device_json" 2> "$OUT/device-json.stderr" || true
    if [[ ! -s "$device_json" ]]; then
        local why
        why=$(head -c 300 "$OUT/device-json.stderr" | tr '\n' ' ')
        {
            echo "- nccl: unknown (pipefill device gave no report: $why)"
            echo "- libraries: unknown (pipefill device gave no report)"
        } >> "$OUT/.head"
    fi
    [[ -s "$device_json" ]] && python3 - "$device_json" >> "$OUT/.head" <<'PY'

import json, sys
r = json.load(open(sys.argv[1]))
print(f"- cuda (driver): {r['driver_cuda_version']}")
print(f"- nccl: {r['nccl_version'] or 'none: ' + str(r['nccl_note'])}")
print(f"- libraries: {', '.join(r['libraries']) or 'none loaded'}")
print(f"- module: {r['module']['source']}")
PY
    echo "- linked for cudarc: $(tr '\n' ';' < "$OUT/libraries.txt")" >> "$OUT/.head"
    nvidia-smi
    nvidia-smi -q | grep -iE "compute mode|mig mode|persistence" || true
    cat "$OUT/libraries.txt"
    cat "$device_json"
    # Fails (and so stops nothing, but does not read ok) without nvidia-smi or a device report.
    nvidia-smi -L && [[ -s "$device_json" ]]
}

# Step time and host enqueue time per action with and without --graph (one run each: steps 0-1
# plain, 2 captured, 3-7 replayed), at a large size and at a small one where launches dominate.
graph_table() {
    local family hidden
    for hidden in 2048 256; do
        for family in 1f1b zbv; do
            step "train-graph-$family-h$hidden" 60 ./pipefill train --backend cuda --graph --ranks 4 \
                --schedule "$family" --plan uniform --layers 16 --hidden "$hidden" --batch 1024 \
                --microbatches 8 --steps 8 --format json
        done
    done
    python3 - "$OUT" >> "$OUT/.tables" <<'PY' || echo "(graph table: could not be made)" >> "$OUT/.tables"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
if not list(out.glob("train-graph-*.txt")):
    sys.exit(0)
print("\n## Step time with and without --graph (P = 4, 16 layers, batch 1024, M = 8; medians)\n")
print("| family | hidden | step plain ms | step graph ms | host us/action plain | host us/action graph | actions |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for hidden in (2048, 256):
    for family in ("1f1b", "zbv"):
        f = out / f"train-graph-{family}-h{hidden}.txt"
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
    write_summary
}

# The train table: step time, measured and predicted bubble per family.
train_table() {
    python3 - "$OUT" >> "$OUT/.tables" <<'PY' || echo "(train table: could not be made)" >> "$OUT/.tables"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
if not list(out.glob("train-cuda-*.txt")):
    sys.exit(0)
print("\n## train --backend cuda (P = 4, 16 layers, hidden 2048, batch 1024, M = 8, 5 steps)\n")
print("| family | step ms (median) | bubble measured | bubble predicted | last loss |")
print("| --- | --- | --- | --- | --- |")
for f in sorted(out.glob("train-cuda-*.txt")):
    lines = [l for l in f.read_text().splitlines() if l.startswith("{")]
    if not lines:
        print(f"| {f.stem[11:]} | no result | | | |")
        continue
    r = json.loads(lines[-1])
    print(f"| {r['schedule']} | {r['step_time_s'] * 1e3:.3f} | {r['bubble_measured']:.4f} | "
          f"{r['bubble_predicted']:.4f} | {r['losses'][-1]:.6g} |")
PY
    write_summary
}

# The losses of two runs' JSON outputs (files under $OUT) agree within a relative 1e-5.
same_losses() {
    python3 - "$OUT" "$1" "$2" "$3" <<'PY'
import json, pathlib, sys
out, a, b, what = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
read = lambda n: json.loads([l for l in (out / n).read_text().splitlines() if l.startswith("{")][-1])["losses"]
one, two = read(a), read(b)
worst = max(abs(x - y) / max(1e-12, abs(x)) for x, y in zip(one, two))
print(f"{what}: losses {two} against {one}: worst relative difference {worst:.2e}")
sys.exit(0 if len(one) == len(two) and worst <= 1e-5 else 1)
PY
}

# --graph with one GPU per rank (one graph across the GPUs) against the plain run.
graph_per_rank() {
    local flags=(train --backend cuda --devices per-rank --ranks 2 --schedule 1f1b --plan uniform
        --layers 4 --hidden 512 --batch 256 --microbatches 4 --steps 5 --format json)
    ./pipefill "${flags[@]}" > "$OUT/graph-per-rank-plain.json"
    ./pipefill "${flags[@]}" --graph > "$OUT/graph-per-rank-graph.json"
    same_losses graph-per-rank-plain.json graph-per-rank-graph.json "graph --devices per-rank"
}

# Two GPU ranks as two MPI processes with --graph against the same without it.
mpi_cuda_graph() {
    local flags=(train --backend cuda --ranks 2 --schedule 1f1b --plan uniform --layers 4 --hidden 512
        --batch 256 --microbatches 4 --steps 5 --format json --launcher mpi)
    local run=(env NCCL_MULTI_RANK_GPU_ENABLE=1 mpirun --allow-run-as-root --oversubscribe -n 2 ./pipefill-mpi)
    "${run[@]}" "${flags[@]}" > "$OUT/mpi-cuda-plain.json"
    "${run[@]}" "${flags[@]}" --graph > "$OUT/mpi-cuda-graph.json"
    same_losses mpi-cuda-plain.json mpi-cuda-graph.json "mpi-cuda --graph"
}

# Two GPU ranks as two MPI processes over NCCL (train --launcher mpi) against one process.
mpi_cuda() {
    local flags=(train --backend cuda --ranks 2 --schedule 1f1b --plan uniform --layers 4 --hidden 512
        --batch 256 --microbatches 4 --steps 3 --format json)
    ./pipefill "${flags[@]}" > "$OUT/mpi-cuda-one-process.json"
    NCCL_MULTI_RANK_GPU_ENABLE=1 mpirun --allow-run-as-root --oversubscribe -n 2 \
        ./pipefill-mpi "${flags[@]}" --launcher mpi > "$OUT/mpi-cuda-two-processes.json"
    same_losses mpi-cuda-one-process.json mpi-cuda-two-processes.json "mpi-cuda (two processes against one)"
}

run() {
    cd "$(dirname "$0")"
    ONLY=("$@")
    OUT="${OUT:-./gpu-results}"
    mkdir -p "$OUT"
    local work
    work="$(pwd)/.work"
    mkdir -p "$work"
    export CUDA_CACHE_PATH="$work/cuda-cache" CRITERION_HOME="$work/criterion"
    DEADLINE=$((SECONDS + RUN_BUDGET))
    FAILURES=0
    NOT_VERIFIED=0
    STOPPED=""
    SUMMARY="$OUT/summary.md"
    export OUT
    : > "$OUT/.rows"
    : > "$OUT/.tables"
    {
        echo "# pipefill GPU check"
        echo
        echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "- commit: $(cat commit.txt 2>/dev/null || echo unknown)"
        echo "- budget: $RUN_BUDGET s"
        if (( ${#ONLY[@]} > 0 )); then echo "- steps asked for: ${ONLY[*]}"; fi
    } > "$OUT/.head"
    write_summary
    local links="$PWD/cuda-libs"
    link_libraries "$links" > "$OUT/libraries.txt" 2>&1 || true
    export LD_LIBRARY_PATH="$links${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PIPEFILL_REQUIRE_GPU=1 PIPEFILL_BIN="$PWD/pipefill" RUST_BACKTRACE=1
    if [[ -f "kernels.$CUBIN_ARCH.cubin" ]]; then
        export PIPEFILL_CUBIN="$PWD/kernels.$CUBIN_ARCH.cubin"
    fi
    export -f environment mpi_cuda write_summary
    # The environment lines come first in the summary (whatever the steps asked for).
    ONLY_SAVED=("${ONLY[@]}")
    ONLY=()
    step env 20 environment
    step module-load 60 ./pipefill device
    ONLY=("${ONLY_SAVED[@]}")
    if [[ "$STEP_RC" != 0 ]]; then
        STOPPED="the kernels did not load: see module-load.txt"
    fi
    step cupy-simt 60 python3 ./ptx-check.py --module ./kernels.ptx --only simt
    step cupy-tc 60 python3 ./ptx-check.py --module ./kernels.ptx --only tc
    local t case bin name
    for t in "${GPU_TESTS[@]}"; do
        [[ "$t" == gpu_nccl ]] && continue
        # The NCCL cases of a binary run on their own below.
        local skip=()
        for case in "${NCCL_CASES[@]}"; do
            [[ "${case%%:*}" == "$t" ]] && skip+=(--skip "${case#*:}")
        done
        step "test-$t" "$CAP_TEST" "./tests/$t" --include-ignored --test-threads=1 --nocapture "${skip[@]}"
    done
    for case in "${NCCL_CASES[@]}"; do
        bin="${case%%:*}" name="${case#*:}"
        step "test-nccl-$name" "$CAP_NCCL" "./tests/$bin" --include-ignored --exact "$name" --nocapture
    done
    local family
    for family in 1f1b interleaved-1f1b zb-h1 zbv; do
        step "train-cuda-$family" 60 ./pipefill train --backend cuda --ranks 4 --schedule "$family" \
            --plan uniform --layers 16 --hidden 2048 --batch 1024 --microbatches 8 --steps 5 --format json
    done
    train_table
    graph_table
    local gpus
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
    if (( gpus >= 2 )); then
        step graph-per-rank 60 graph_per_rank
    elif wanted graph-per-rank; then
        record graph-per-rank "NOT VERIFIED (one GPU: --devices per-rank needs two)" 0 60
    fi
    local why=""
    if [[ ! -x ./pipefill-mpi ]]; then
        why="the bundle has no pipefill-mpi (no MPI where it was built)"
    elif ! command -v mpirun > /dev/null; then
        why="no mpirun on this machine"
    elif ldd ./pipefill-mpi | grep -q "not found"; then
        why="pipefill-mpi's MPI libraries are missing here"
    fi
    if [[ -z "$why" || -n "$STOPPED" ]]; then
        step mpi-cuda 90 mpi_cuda
        step mpi-cuda-graph 90 mpi_cuda_graph
    elif wanted mpi-cuda; then
        record mpi-cuda "NOT VERIFIED ($why)" 0 90
        record mpi-cuda-graph "NOT VERIFIED ($why)" 0 90
    fi
    step bench-overlap 60 ./pipefill bench overlap --hidden 1024,4096 --rows 1024 --repeats 3
    export PIPEFILL_KERNELS_SIZES="$KERNELS_SIZES"
    local b
    for b in "${GPU_BENCHES[@]}"; do
        step "bench-$b" 90 "./benches/$b" --bench
    done
    echo "- used: $SECONDS s of $RUN_BUDGET; $FAILURES failed or not run, $NOT_VERIFIED not verified" >> "$OUT/.head"
    write_summary
    echo "summary: $SUMMARY"
    cat "$SUMMARY"
    if (( FAILURES > 0 || NOT_VERIFIED > 0 )); then
        echo "$FAILURES step(s) failed or did not run, $NOT_VERIFIED not verified: see $OUT/<step>.txt" >&2
        exit 1
    fi
}

case "${1:-}" in
    build) shift; build "$@" ;;
    run) shift; run "$@" ;;
    *) usage ;;
esac
