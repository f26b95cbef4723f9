#!/usr/bin/env bash
# Compares two saved `cargo bench` outputs by their `pipefill-bench name=... value=...` lines.
#
#   cargo bench --workspace -- --quick | tee before.txt     # on main
#   cargo bench --workspace -- --quick | tee after.txt      # on the branch
#   scripts/bench-compare.sh before.txt after.txt [THRESHOLD_PERCENT]
#
# Prints one `REGRESSION`, `ok`, `new` or `gone` line per figure and exits 1 if any figure is worse
# than before by more than its threshold: THRESHOLD_PERCENT when given, else the `threshold=` on the
# figure's line (each bench sets its own from the noise it measured; docs/benchmarks.md,
# "Benchmarks as a regression run"). `better=higher` figures (speedups) regress when they fall. Exit 2 on bad usage.
set -euo pipefail

usage() {
    echo "usage: $0 BEFORE.txt AFTER.txt [THRESHOLD_PERCENT]" >&2
    exit 2
}
[[ $# -eq 2 || $# -eq 3 ]] || usage
for f in "$1" "$2"; do
    [[ -r "$f" ]] || { echo "error: cannot read $f: give the saved output of \`cargo bench\`" >&2; exit 2; }
done
threshold="${3:-}"
if [[ -n "$threshold" ]] && ! [[ "$threshold" =~ ^[0-9]+([.][0-9]+)?$ && "$threshold" != 0 ]]; then
    echo "error: THRESHOLD_PERCENT '$threshold' is not a positive number: give it like 15" >&2
    exit 2
fi

awk -v override="$threshold" '
function field(key,    i, kv) {
    for (i = 2; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == key) return substr($i, length(key) + 2)
    }
    return ""
}
$1 != "pipefill-bench" { next }
FNR == NR { before[field("name")] = field("value"); next }
{
    name = field("name"); shown = field("value"); value = shown + 0; unit = field("unit")
    better = field("better"); t = (override != "" ? override / 100 : field("threshold") + 0)
    if (t <= 0) t = 0.10
    seen[name] = 1
    if (!(name in before)) { printf "new name=%s value=%s unit=%s\n", name, shown, unit; next }
    base = before[name] + 0
    change = (base != 0 ? (value - base) / (base < 0 ? -base : base) : 0)
    worse = (better == "higher" ? -change : change)
    verdict = (worse > t ? "REGRESSION" : "ok")
    if (verdict == "REGRESSION") regressions++
    compared++
    printf "%s name=%s baseline=%s value=%s unit=%s change=%+.1f%% threshold=%.1f%% better=%s\n",
        verdict, name, before[name], shown, unit, change * 100, t * 100, better
}
END {
    for (name in before) if (!(name in seen)) printf "gone name=%s (only in the first file)\n", name
    printf "%d figures compared, %d regressions\n", compared, regressions
    exit (regressions > 0 ? 1 : 0)
}' "$1" "$2"
