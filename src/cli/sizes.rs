//! The command line's size estimates: every command that builds something whose size grows with
//! its flags (schedules of `P x V x M` (stage, microbatch) pairs, their text grids, simulations and
//! traces) estimates the bytes first and goes through [`memory`] (or [`text_grid`] for output), which
//! refuses an estimate above the machine's available memory (Linux `MemAvailable`) or above
//! [`ABSURD_BYTES`] with exit code 2 and one line: the flags, the estimate, the bound and the fix.
//! What can be streamed is streamed, so the estimates here cover what must be held at once.
//!
//! The per-action figures are upper bounds measured on the release build (peak RSS over actions
//! at several sizes, `docs/measurements.md`, "Sizes and budgets"); `tests/cli_sizes.rs` checks
//! each refusal and that the streamed outputs (text grid, trace) run within a bounded peak RSS.
//! Work that grows faster than memory (the exact split of `partition` and `plan`) is estimated
//! in seconds and bounded by [`work`], which also shows progress for long work.

use crate::model::{available_memory, Bytes, ABSURD_BYTES};
use pipefill_host::schedule::families;

pub use super::auto_flags::Shape;
use super::CliError;

/// Bytes held per action of a generated and validated schedule (the action lists, the validator's
/// slots and bookkeeping, the lowering's copies when transfers are asked for).
pub const SCHEDULE_BYTES_PER_ACTION: u64 = 128;

/// Bytes held per action of a simulation (the schedule, the simulator's state, the timeline's spans
/// and transfers, the bound's and the memory profile's tables), trace written as a stream.
pub const SIMULATE_BYTES_PER_ACTION: u64 = 400;

/// Bytes kept per action of each trained step (its report: the measured timeline, the actions'
/// times), until the run's summary picks the median step.
pub const STEP_BYTES_PER_ACTION: u64 = 128;

/// Refuses `steps` training steps of `shape` whose kept reports cannot be held.
pub fn step_reports(steps: usize, shape: &Shape) -> Result<(), CliError> {
    let bytes = actions(shape)
        .and_then(|n| n.checked_mul(STEP_BYTES_PER_ACTION))
        .and_then(|b| b.checked_mul(steps as u64));
    memory(
        &format!(
            "--steps {steps} with {}: the reports the run keeps ({} actions a step)",
            flags(shape),
            count(actions(shape))
        ),
        bytes,
        "train in runs of fewer --steps with --checkpoint and --resume, or fewer --ranks, \
         --chunks or --microbatches",
    )
}

/// Fixed bytes of any command (the binary, the allocator, small tables).
pub const BASE_BYTES: u64 = 64 << 20;

/// The largest text grid written (1 GiB): a grid that wide is of no use in a terminal, and its
/// CSV or JSON is a few bytes per action.
pub const MAX_TEXT_BYTES: u64 = 1 << 30;

/// `V` of `family` when `--chunks` is not given (1 for names the registry does not know: the
/// family's own check refuses them later).
pub fn default_chunks(family: &str) -> usize {
    families::family(family).map_or(1, |f| f.default_chunks)
}

/// Actions of a schedule of `shape`: `3 x P x V x M` (`F`, `I`, `W` of every pair); `None` on
/// overflow.
pub fn actions(shape: &Shape) -> Option<u64> {
    [shape.ranks, shape.chunks, shape.microbatches]
        .into_iter()
        .try_fold(3u64, |n, v| n.checked_mul(v as u64))
}

/// The flags of `shape`, for messages.
fn flags(shape: &Shape) -> String {
    format!(
        "--ranks {} --chunks {} --microbatches {}",
        shape.ranks, shape.chunks, shape.microbatches
    )
}

/// Refuses a schedule of `shape` whose actions cannot be held (checked before it is generated).
pub fn schedule_shape(shape: &Shape, with_transfers: bool) -> Result<(), CliError> {
    let per = SCHEDULE_BYTES_PER_ACTION * if with_transfers { 3 } else { 1 };
    let bytes = actions(shape).and_then(|n| n.checked_mul(per));
    memory(
        &format!("{}: {} actions", flags(shape), count(actions(shape))),
        bytes,
        "fewer --ranks, --chunks or --microbatches",
    )
}

/// Refuses simulating `schedules` schedules of `shape` (the largest `V` asked for) whose state,
/// all held until the report, cannot fit.
pub fn simulation(shape: &Shape, schedules: usize) -> Result<(), CliError> {
    let n = actions(shape);
    let bytes = n
        .and_then(|n| n.checked_mul(SIMULATE_BYTES_PER_ACTION))
        .and_then(|b| b.checked_mul(schedules.max(1) as u64));
    memory(
        &format!(
            "simulating {schedules} schedule(s) of {}: {} actions each",
            flags(shape),
            count(n)
        ),
        bytes,
        "fewer --ranks, --chunks or --microbatches, or one --schedule at a time",
    )
}

/// Refuses a text grid of `ranks` rows and about `bytes` of text above [`MAX_TEXT_BYTES`].
pub fn text_grid(ranks: usize, bytes: u64) -> Result<(), CliError> {
    if bytes <= MAX_TEXT_BYTES {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "--format text: the grid of {ranks} ranks would be about {} of text, above the {} a \
         terminal grid may take; use --format csv or --format json (a few bytes per action), or \
         fewer --ranks or --microbatches",
        Bytes(bytes),
        Bytes(MAX_TEXT_BYTES)
    )))
}

/// The environment variable that lowers the memory bound below what the machine reports (a
/// shared machine, a test): bytes, e.g. `PIPEFILL_MAX_MEMORY=2000000000`.
pub const MAX_MEMORY_VAR: &str = "PIPEFILL_MAX_MEMORY";

/// The memory a run may take: the machine's available memory (`MemAvailable`), lowered by
/// [`MAX_MEMORY_VAR`] when set; `None` when neither is known. A bad value of the variable is
/// refused (exit 2).
pub fn available() -> Result<Option<u64>, CliError> {
    let cap = match std::env::var(MAX_MEMORY_VAR) {
        Ok(v) => Some(v.trim().parse::<u64>().map_err(|_| {
            CliError::Usage(format!(
                "{MAX_MEMORY_VAR}=`{v}` is not a byte count; give whole bytes, e.g. \
                 {MAX_MEMORY_VAR}=2000000000, or unset it"
            ))
        })?),
        Err(_) => None,
    };
    Ok(match (available_memory(), cap) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    })
}

/// Refuses `bytes` (`None`: beyond 64 bits) of memory, plus [`BASE_BYTES`], above [`available`] or
/// [`ABSURD_BYTES`]: one line naming `what`, the estimate, the bound and `fix`.
pub fn memory(what: &str, bytes: Option<u64>, fix: &str) -> Result<(), CliError> {
    let need = bytes.and_then(|b| b.checked_add(BASE_BYTES));
    let (bound, whose) = match available()? {
        Some(a) if a < ABSURD_BYTES => (
            a,
            "available here (MemAvailable in /proc/meminfo, or PIPEFILL_MAX_MEMORY when lower)",
        ),
        _ => (ABSURD_BYTES, "that any machine this runs on has"),
    };
    match need {
        Some(n) if n <= bound => Ok(()),
        Some(n) => Err(CliError::Usage(format!(
            "{what} need an estimated {} of memory, above the {} {whose}; fix: {fix}",
            Bytes(n),
            Bytes(bound)
        ))),
        None => Err(CliError::Usage(format!(
            "{what} need more than 2^64 bytes of memory; fix: {fix}"
        ))),
    }
}

/// A count for messages (`more than 2^64` when it overflowed).
fn count(n: Option<u64>) -> String {
    n.map_or("more than 2^64".into(), |n| n.to_string())
}

/// The longest work accepted, in estimated seconds on the development machine: above it the
/// command is refused before it starts, naming the fix.
pub const MAX_WORK_SECONDS: f64 = 300.0;

/// Work estimated to take longer than this shows progress on standard error (when standard
/// error is a terminal, or when [`PROGRESS_VAR`] is set).
pub const PROGRESS_AFTER_SECONDS: f64 = 2.0;

/// The environment variable that asks for progress lines on standard error even when it is not a
/// terminal (`PIPEFILL_PROGRESS=1`).
pub const PROGRESS_VAR: &str = "PIPEFILL_PROGRESS";

/// Refuses `what`, estimated at `seconds`, above [`MAX_WORK_SECONDS`] (one line: the estimate,
/// the bound and `fix`); otherwise starts its [`Progress`] (shown only for long work), which ends
/// when dropped.
pub fn work(what: &str, seconds: f64, fix: &str) -> Result<Progress, CliError> {
    if seconds > MAX_WORK_SECONDS {
        return Err(CliError::Usage(format!(
            "{what} takes an estimated {seconds:.0} s, above the {MAX_WORK_SECONDS:.0} s a run \
             may take; fix: {fix}"
        )));
    }
    Ok(Progress::start(what, seconds))
}

/// Progress of long work on standard error: a line when it starts with the estimate, then one
/// every two seconds with the time so far and the estimate, from a thread that stops when this is dropped.
#[derive(Debug)]
pub struct Progress {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// Starts showing progress of `what` (estimated at `seconds`) when it is long and standard
    /// error is a terminal or [`PROGRESS_VAR`] is set; otherwise shows nothing.
    fn start(what: &str, seconds: f64) -> Self {
        use std::io::IsTerminal;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let asked = std::env::var_os(PROGRESS_VAR).is_some_and(|v| !v.is_empty() && v != "0");
        let show = seconds > PROGRESS_AFTER_SECONDS && (asked || std::io::stderr().is_terminal());
        let thread = show.then(|| {
            let (stop, what) = (stop.clone(), what.to_string());
            // A first line at once: the estimate says the work is long, whatever the clock later
            // says (a fast machine may finish before the first two-second line).
            eprintln!("pipefill: {what}: started, an estimated {seconds:.0} s in all");
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                let mut shown = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    let secs = start.elapsed().as_secs();
                    if secs >= shown + 2 {
                        shown = secs;
                        eprintln!(
                            "pipefill: {what}: {secs} s so far, an estimated {seconds:.0} s in all"
                        );
                    }
                }
            })
        });
        Progress { stop, thread }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
