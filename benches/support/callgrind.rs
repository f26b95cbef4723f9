//! Deterministic figures: instructions (and estimated cycles) counted by valgrind's callgrind.
//!
//! A bench that uses this module (`benches/instructions.rs`) is its own harness. In bench mode it
//! runs itself again once per case, under
//! `valgrind --tool=callgrind --collect-atstart=no --toggle-collect=pipefill_measured`, with the
//! case's name in [`CASE_VAR`] and an empty environment. That child builds the case's inputs
//! (not counted), then calls [`pipefill_measured`] once with the work to count: callgrind counts
//! exactly the instructions run inside that call and its callees. The parent reads the totals
//! from the child's output file ([`Counts::parse`]).
//!
//! The cache simulation has fixed sizes ([`CACHE_ARGS`]), not the host's, so the estimated
//! cycles are the same on every machine; the estimate is iai-callgrind's:
//! `L1 hits + 5 x LL hits + 35 x RAM hits` ([`Counts::estimated_cycles`]).
//!
//! Why not the iai-callgrind crate: its runner (a second binary, installed by
//! `cargo install iai-callgrind-runner` at the library's exact version) owns the bench's command
//! line and baselines, so the shared [`super::Run`] (the `pipefill-bench` lines, `--baseline`,
//! `REGRESSION` and the exit status) would have to be rebuilt by parsing its output. Valgrind is
//! all this needs (`docs/benchmarks-ci.md`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable that makes the bench binary a child: the name of the case to run.
pub const CASE_VAR: &str = "PIPEFILL_CALLGRIND_CASE";

/// The environment variable naming the valgrind to run (default: `valgrind` on `PATH`).
pub const VALGRIND_VAR: &str = "PIPEFILL_VALGRIND";

/// With this environment variable set to `1`, a missing valgrind is an error (status 2); without it
/// the bench prints that it skipped and exits 0, so that `cargo bench --workspace` passes on a
/// machine without valgrind. `scripts/bench-ci.sh` and `.ci/run` set it.
pub const REQUIRE_VAR: &str = "PIPEFILL_REQUIRE_VALGRIND";

/// The environment variable for how many cases run at once (default: the available cores, at
/// most 4). The counts do not depend on it.
pub const JOBS_VAR: &str = "PIPEFILL_BENCH_JOBS";

/// The one function whose instructions are counted (callgrind's `--toggle-collect`).
pub const MEASURED_SYMBOL: &str = "pipefill_measured";

/// Regression threshold for instruction counts (relative). Two runs of an unchanged tree, the
/// second from another worktree and target directory, agreed on every count within the noise
/// recorded in `docs/benchmarks-ci.md`; the threshold sits above that noise and between the 0.5%
/// change that must pass and the 2% change that must be flagged (`benches/support_check.rs`).
pub const IR_THRESHOLD: f64 = 0.01;

/// Regression threshold for estimated cycles (relative): as [`IR_THRESHOLD`].
pub const CYCLES_THRESHOLD: f64 = 0.01;

/// Callgrind's cache simulation with fixed caches (32 KiB 8-way L1 I and D, 8 MiB 16-way LL, 64 B
/// lines), so the estimate does not depend on the host's caches.
pub const CACHE_ARGS: &[&str] = &[
    "--cache-sim=yes",
    "--I1=32768,8,64",
    "--D1=32768,8,64",
    "--LL=8388608,16,64",
];

/// Runs `work` once and hands on its result; callgrind counts the instructions of this call only.
/// Not inlined, and not mangled, so callgrind finds it by its plain name ([`MEASURED_SYMBOL`]).
#[no_mangle]
#[inline(never)]
pub fn pipefill_measured(work: &mut dyn FnMut() -> Result<(), String>) -> Result<(), String> {
    std::hint::black_box(work())
}

/// The events callgrind counted in the measured call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts {
    /// By event name (`Ir`, `Dr`, `Dw`, `I1mr`, ...).
    pub events: BTreeMap<String, u64>,
}

impl Counts {
    /// Reads a callgrind output file's `events:` line and its `totals:` (or `summary:`) line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut names: Option<Vec<&str>> = None;
        let mut totals: Option<Vec<&str>> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("events:") {
                names = Some(rest.split_whitespace().collect());
            } else if let Some(rest) = line
                .strip_prefix("totals:")
                .or_else(|| line.strip_prefix("summary:"))
            {
                totals = Some(rest.split_whitespace().collect());
            }
        }
        let names = names.ok_or("no `events:` line in the callgrind output")?;
        let totals = totals.ok_or("no `totals:` line in the callgrind output")?;
        let mut events = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            // Callgrind leaves out trailing zero counts.
            let value = match totals.get(i) {
                Some(v) => v
                    .parse::<u64>()
                    .map_err(|e| format!("callgrind total `{v}` of {name}: {e}"))?,
                None => 0,
            };
            events.insert((*name).to_string(), value);
        }
        Ok(Counts { events })
    }

    /// The count of one event (0 when callgrind did not report it).
    pub fn get(&self, event: &str) -> u64 {
        self.events.get(event).copied().unwrap_or(0)
    }

    /// Instructions executed.
    pub fn ir(&self) -> u64 {
        self.get("Ir")
    }

    /// iai-callgrind's estimate from the cache simulation: `L1 hits + 5 x LL hits + 35 x RAM
    /// hits`; `None` without the cache events.
    pub fn estimated_cycles(&self) -> Option<u64> {
        let needed = ["Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw"];
        if !needed.iter().all(|e| self.events.contains_key(*e)) {
            return None;
        }
        let accesses = self.ir() + self.get("Dr") + self.get("Dw");
        let l1_misses = self.get("I1mr") + self.get("D1mr") + self.get("D1mw");
        let ram = self.get("ILmr") + self.get("DLmr") + self.get("DLmw");
        let l1_hits = accesses.saturating_sub(l1_misses);
        let ll_hits = l1_misses.saturating_sub(ram);
        Some(l1_hits + 5 * ll_hits + 35 * ram)
    }
}

/// The valgrind to run: [`VALGRIND_VAR`], else `valgrind` found on `PATH`; the error says how to
/// install it.
pub fn find_valgrind() -> Result<PathBuf, String> {
    if let Some(v) = std::env::var_os(VALGRIND_VAR) {
        let path = PathBuf::from(v);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{VALGRIND_VAR}={} is not a file: point it at valgrind, or unset it",
                path.display()
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("valgrind"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "valgrind not found on PATH: install it (`apt-get install valgrind`, as .ci/run \
                 does) or set {VALGRIND_VAR}=/path/to/valgrind"
            )
        })
}

/// How many cases run at once: [`JOBS_VAR`], else the available cores (at most 4).
pub fn jobs() -> Result<usize, String> {
    match std::env::var(JOBS_VAR) {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "{JOBS_VAR}={v:?} is not a positive whole number: set it like {JOBS_VAR}=2, or unset it"
            )),
        },
        Err(_) => Ok(std::thread::available_parallelism().map_or(1, |n| n.get().min(4))),
    }
}

/// The valgrind command that runs case `case` of the bench binary `exe`, writing callgrind's
/// output to `out`. The child starts with an empty environment (only [`CASE_VAR`]), so that what
/// the caller's environment holds cannot move its stack or change what it does.
pub fn command(valgrind: &Path, exe: &Path, case: &str, out: &Path) -> Command {
    let mut c = Command::new(valgrind);
    c.env_clear()
        .env(CASE_VAR, case)
        .arg("--tool=callgrind")
        .arg("--collect-atstart=no")
        .arg(format!("--toggle-collect={MEASURED_SYMBOL}"))
        .args(CACHE_ARGS)
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe);
    c
}

/// Runs case `case` of `exe` under callgrind (output file in `dir`) and returns its counts.
pub fn count(valgrind: &Path, exe: &Path, case: &str, dir: &Path) -> Result<Counts, String> {
    let file: String = case
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let out = dir.join(format!("{file}.callgrind"));
    let output = command(valgrind, exe, case, &out)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", valgrind.display()))?;
    if !output.status.success() {
        return Err(format!(
            "case {case}: valgrind exited with {}:\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let text = std::fs::read_to_string(&out)
        .map_err(|e| format!("case {case}: cannot read {}: {e}", out.display()))?;
    let counts = Counts::parse(&text).map_err(|e| format!("case {case}: {e}"))?;
    if counts.ir() == 0 {
        return Err(format!(
            "case {case}: callgrind counted no instructions in `{MEASURED_SYMBOL}` (was the \
             function renamed or inlined?)"
        ));
    }
    Ok(counts)
}
