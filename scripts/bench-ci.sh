#!/usr/bin/env bash
# The deterministic bench suite (`cargo bench --bench instructions`) as a CI gate: saves a baseline
# on the base commit (built in a temporary git worktree), runs the working tree against it, prints
# the table of changes and exits 1 on a regression (docs/benchmarks-ci.md).
#
#   scripts/bench-ci.sh [BASE]          # BASE: a commit, branch or tag (default: main)
#
# Both builds share one target directory ($CARGO_TARGET_DIR, else ./target), so the dependencies are
# built once; the workspace's own crates are cleaned before each build, because cargo names and
# fingerprints them by their path inside the workspace, the same in both trees, and would otherwise
# take one tree's build for the other's. Extra arguments after BASE go to the bench (e.g. a filter:
# `scripts/bench-ci.sh main sim/`).
# Exit status: 0 no regression, 1 a regression, 2 an error (bad BASE, a build or a bench that failed).
# When the base has no `instructions` bench yet, the branch's figures are printed and the exit is 0.
set -euo pipefail

usage() {
    echo "usage: $0 [BASE [BENCH ARGS...]]" >&2
    exit 2
}
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && usage
root=$(git rev-parse --show-toplevel) || usage
cd "$root"
base_ref="${1:-main}"
shift || true
if ! base=$(git rev-parse --verify --quiet "${base_ref}^{commit}"); then
    echo "error: BASE '$base_ref' is not a commit here: give a branch, tag or commit (e.g. main)" >&2
    exit 2
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
export PIPEFILL_REQUIRE_VALGRIND=1
name="ci-base-${base:0:12}"
work=$(mktemp -d "${TMPDIR:-/tmp}/pipefill-bench-ci.XXXXXX")
cleanup() {
    git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
start=$SECONDS

# Removes the bench-profile builds of the workspace's own crates (of the tree in the current folder).
clean_workspace_crates() {
    local p args=()
    for p in $(cargo tree --workspace --depth 0 --prefix none 2>/dev/null | awk 'NF {print $1}' | sort -u); do
        args+=(-p "$p")
    done
    [[ ${#args[@]} -gt 0 ]] && cargo clean --quiet --profile bench "${args[@]}"
}

echo "== base ${base:0:12} ($base_ref): saving baseline \`$name\`"
git worktree add --detach --quiet "$work/base" "$base"
if ! (cd "$work/base" && clean_workspace_crates &&
    cargo bench --bench instructions -- --save-baseline "$name" "$@") \
    >"$work/base.txt" 2>"$work/base.err"; then
    if grep -q "no bench target named" "$work/base.err"; then
        echo "the base has no \`instructions\` bench: nothing to compare with; the branch's figures:"
        clean_workspace_crates
        cargo bench --bench instructions -- --discard-baseline "$@" | grep '^pipefill-bench'
        exit 0
    fi
    tail -n 30 "$work/base.err" >&2
    echo "error: the base's suite failed (above)" >&2
    exit 2
fi
echo "   $(grep -c '^pipefill-bench' "$work/base.txt") figures, $((SECONDS - start)) s so far"

echo "== branch (this working tree) against \`$name\`"
clean_workspace_crates
set +e
cargo bench --bench instructions -- --baseline "$name" "$@" >"$work/branch.txt" 2>"$work/branch.err"
rc=$?
set -e
if [[ $rc -ne 0 && $rc -ne 1 ]]; then
    tail -n 30 "$work/branch.err" >&2
    echo "error: the branch's suite failed with status $rc (above)" >&2
    exit 2
fi

# The table of changes, from the bench's own verdict lines (`ok`, `REGRESSION`, `new`).
awk '
function field(key,    i, kv) {
    for (i = 2; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == key) return substr($i, length(key) + 2)
    }
    return ""
}
BEGIN { printf "%-84s %16s %16s %9s %9s  %s\n", "figure", "base", "branch", "change", "limit", "verdict" }
$1 == "ok" || $1 == "REGRESSION" {
    printf "%-84s %16s %16s %9s %9s  %s\n", field("name"), field("baseline"), field("value"),
        field("change"), field("threshold"), $1
}
$1 == "new" { printf "%-84s %16s %16s %9s %9s  %s\n", field("name"), "-", "-", "-", "-", "new" }
' "$work/branch.txt"
grep -E '^instructions: ' "$work/branch.txt" || true
echo "== $((SECONDS - start)) s in all"
if [[ $rc -eq 1 ]]; then
    echo "REGRESSION: a figure is worse than on the base by more than its threshold (above)"
fi
exit $rc
