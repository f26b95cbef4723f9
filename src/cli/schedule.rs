//! `pipefill schedule`: generate a schedule of a family, validate a schedule file, or list the families.
//!
//! ```text
//! pipefill schedule --schedule NAME --ranks P --microbatches M [--chunks V] [--group-size G]
//!                   [--format text|json|csv] [--with-transfers] [--out FILE]
//! pipefill schedule --schedule auto --ranks P --microbatches M [--chunks V --placement looped|vshape]
//!                   [--cost F=..,I=..,W=.. | --costs FILE] [--comm-latency T]
//!                   [--memory-limit BYTES | --max-in-flight N] [--objective makespan|span]
//!                   [--time-budget S] [--seed N]
//! pipefill schedule --validate FILE [--with-transfers]
//! pipefill schedule --list
//! ```
//!
//! Bad input (unknown family, `P = 0`, a refused combination, a malformed file, an invalid schedule)
//! is one error naming the field and the fix, exit code 2. Output files are written atomically.

use std::path::{Path, PathBuf};

use pipefill_host::auto::{AutoSchedule, AUTO};
use pipefill_host::schedule::families::{self, FAMILIES};
use pipefill_host::schedule::format::{self, Format};
use pipefill_host::schedule::lower::lower;
use pipefill_host::schedule::validate::{validate, ValidationReport};
use pipefill_host::schedule::{Params, Placement, Schedule, ScheduleError};

use super::auto_flags::{self, AutoArgs, CostArgs};
use super::output::write_out;
use super::sizes;
use super::CliError;

/// Flags of `pipefill schedule`.
#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("mode").required(true).args(["schedule", "validate", "list"])
))]
pub struct Args {
    /// Family to generate (see --list), e.g. 1f1b, interleaved-1f1b, zbv.
    #[arg(long, value_name = "NAME", requires_all = ["ranks", "microbatches"])]
    pub schedule: Option<String>,
    /// P: number of ranks (pipeline workers).
    #[arg(long, value_name = "P")]
    pub ranks: Option<usize>,
    /// M: microbatches per training step.
    #[arg(long, value_name = "M")]
    pub microbatches: Option<usize>,
    /// V: stages per rank (virtual stages); the family's default when omitted.
    #[arg(long, value_name = "V")]
    pub chunks: Option<usize>,
    /// Interleaved families: microbatches per group (Megatron's microbatch_group_size_per_vp_stage); default P.
    #[arg(long, value_name = "G")]
    pub group_size: Option<usize>,
    /// Output format: text (terminal grid), json (canonical) or csv (PyTorch pipelining's CSV:
    /// compute-only, or compute+comms with --with-transfers).
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json", "csv"])]
    pub format: String,
    /// Print the lowered schedule: every activation or gradient that crosses ranks gets a send after
    /// the action that computes it and a receive before the action that uses it (PyTorch's
    /// SEND_F/RECV_F/SEND_B/RECV_B), each send its WAIT_SEND_F/WAIT_SEND_B and each stage its
    /// REDUCE_GRAD/WAIT_REDUCE_GRAD: PyTorch 2.15's compute_comms form; this is what the runtime
    /// executes. With --validate, prints the file lowered (in --format) after the check.
    #[arg(long)]
    pub with_transfers: bool,
    /// Write the schedule to FILE (atomically) instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Validate a schedule file (JSON, CSV or text grid): prints OK with the peak in-flight
    /// activations per rank, or the error (exit code 2). With --with-transfers the report goes to
    /// standard error and the lowered schedule (in --format) to standard output or --out, so the
    /// output reads back as a schedule.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["ranks", "microbatches", "chunks", "group_size"])]
    pub validate: Option<PathBuf>,
    /// List the schedule families: placement, whether they split I/W, constraints.
    #[arg(long)]
    pub list: bool,
    /// Costs and memory limit for `--schedule auto`.
    #[command(flatten)]
    pub cost: CostArgs,
    /// The automatic scheduler's flags.
    #[command(flatten)]
    pub auto: AutoArgs,
}

/// Runs `pipefill schedule`.
pub fn run(args: Args) -> Result<(), CliError> {
    if let Some(path) = &args.out {
        super::output::check_output("--out", path)?;
    }
    if args.list {
        print!("{}", list());
        return Ok(());
    }
    let fmt: Format = args
        .format
        .parse()
        .map_err(|e: ScheduleError| CliError::Usage(e.to_string()))?;
    if let Some(path) = &args.validate {
        if !args.with_transfers {
            // Nothing but the report is printed: a flag about the schedule's output cannot apply.
            if args.out.is_some() {
                return Err(CliError::Usage(
                    "--out with --validate writes the lowered schedule: add --with-transfers, or \
                     drop --out (the report goes to standard output)"
                        .into(),
                ));
            }
            if fmt != Format::Text {
                return Err(CliError::Usage(format!(
                    "--format {} with --validate sets the format of the lowered schedule: add \
                     --with-transfers, or drop --format",
                    args.format
                )));
            }
            println!("{}", validate_file(path)?);
            return Ok(());
        }
        // The report to stderr: stdout (or --out) holds only the schedule.
        eprintln!("{}", validate_file(path)?);
        let (s, _) = read_schedule_file("--validate", path)?;
        return write_schedule(&lowered(&s)?, fmt, args.out.as_deref());
    }
    if args.schedule.as_deref() == Some(AUTO) {
        sizes::schedule_shape(&shape_flags(&args), args.with_transfers)?;
        let mut out = solve(&args)?;
        eprintln!("{}", auto_flags::summary(&out));
        if args.with_transfers {
            out.schedule = lowered(&out.schedule)?;
        }
        if fmt == Format::Json {
            let text = out.to_json();
            return write_out(args.out.as_deref(), |w| w.write_all(text.as_bytes()));
        }
        write_schedule(&out.schedule, fmt, args.out.as_deref())
    } else {
        auto_flags::only_for_auto(args.cost.given().or(args.auto.given()))?;
        sizes::schedule_shape(&shape_flags(&args), args.with_transfers)?;
        let mut s = generate(&args)?;
        if args.with_transfers {
            s = lowered(&s)?;
        }
        write_schedule(&s, fmt, args.out.as_deref())
    }
}

/// The sizes the flags ask for, for the estimate before generating.
fn shape_flags(args: &Args) -> sizes::Shape {
    let name = args.schedule.as_deref().unwrap_or_default();
    sizes::Shape {
        ranks: args.ranks.unwrap_or(0),
        microbatches: args.microbatches.unwrap_or(0),
        chunks: args.chunks.unwrap_or_else(|| sizes::default_chunks(name)),
    }
}

/// Writes `s` in `fmt` to `--out` or standard output, streamed; a text grid too large to be of use
/// is refused (exit 2) before a line is written.
fn write_schedule(s: &Schedule, fmt: Format, out: Option<&Path>) -> Result<(), CliError> {
    if fmt == Format::Text {
        let grid = format::TextGrid::new(s);
        sizes::text_grid(s.ranks, grid.bytes())?;
        return write_out(out, |w| grid.write(w));
    }
    write_out(out, |w| format::write_to(s, fmt, w))
}

/// `s` with its transfers (see `pipefill_host::schedule::lower`).
fn lowered(s: &Schedule) -> Result<Schedule, CliError> {
    lower(s).map_err(|e| CliError::Usage(e.to_string()))
}

/// Solves `--schedule auto` under the cost flags and the auto flags.
fn solve(args: &Args) -> Result<AutoSchedule, CliError> {
    let need = |v: Option<usize>, flag: &str| {
        v.ok_or_else(|| CliError::Usage(format!("--schedule auto needs {flag}")))
    };
    let default_v = if args.auto.steer.placement == Placement::Vshape {
        2
    } else {
        1
    };
    let shape = auto_flags::Shape {
        ranks: need(args.ranks, "--ranks P")?,
        microbatches: need(args.microbatches, "--microbatches M")?,
        chunks: args.chunks.unwrap_or(default_v),
    };
    let model = args
        .cost
        .spec()?
        .model_for(shape.ranks, shape.chunks)
        .map_err(|e| CliError::Usage(format!("costs for `auto`: {e}")))?;
    let limit = auto_flags::limit(args.cost.memory_limit, args.auto.steer.max_in_flight);
    auto_flags::solve_auto(shape, model, limit, &args.auto)
}

/// Generates the schedule the flags ask for.
fn generate(args: &Args) -> Result<Schedule, CliError> {
    let name = args.schedule.as_deref().unwrap_or_default();
    let need = |v: Option<usize>, flag: &str| {
        v.ok_or_else(|| CliError::Usage(format!("--schedule needs {flag}")))
    };
    let params = Params {
        ranks: need(args.ranks, "--ranks P")?,
        microbatches: need(args.microbatches, "--microbatches M")?,
        chunks: args.chunks,
        group_size: args.group_size,
    };
    families::generate(name, &params).map_err(|e| match e {
        // Refusals name P, M, V, G; on the command line, say which flag sets them.
        ScheduleError::Refused { .. } => CliError::Usage(format!(
            "{e} (flags: --ranks P, --microbatches M, --chunks V, --group-size G)"
        )),
        ScheduleError::UnknownFamily { .. } => CliError::Usage(format!(
            "--schedule: {e}, or auto; `pipefill schedule --list` describes them"
        )),
        other => CliError::Usage(other.to_string()),
    })
}

/// Reads a schedule file (JSON, CSV or text grid; named after the file's stem) and validates it,
/// for the flag `flag`: errors (exit code 2) name the flag, the path and the problem.
pub fn read_schedule_file(
    flag: &str,
    path: &Path,
) -> Result<(Schedule, ValidationReport), CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::Usage(format!(
            "{flag} `{}`: cannot read it: {e}; check the path",
            path.display()
        ))
    })?;
    let stem = path
        .file_stem()
        .map_or("schedule".into(), |s| s.to_string_lossy().into_owned());
    let in_file = |e: ScheduleError| CliError::Usage(format!("{flag} `{}`: {e}", path.display()));
    let s = format::read(&text, &stem).map_err(in_file)?;
    let report = validate(&s).map_err(in_file)?;
    Ok((s, report))
}

/// Reads and validates a schedule file; returns the OK report.
fn validate_file(path: &Path) -> Result<String, CliError> {
    let (s, report) = read_schedule_file("--validate", path)?;
    Ok(ok_report(&s, &report))
}

/// The `OK` text of `--validate`.
fn ok_report(s: &Schedule, report: &ValidationReport) -> String {
    let peaks: Vec<String> = report
        .peak_in_flight
        .iter()
        .enumerate()
        .map(|(r, p)| format!("  rank {r}: {p}"))
        .collect();
    format!(
        "OK {}: P={} V={} M={} placement={}, {} actions, unit-time makespan {} slots\n\
         peak in-flight activations (microbatch-stages) per rank:\n{}",
        s.name,
        s.ranks,
        s.chunks,
        s.microbatches,
        s.placement,
        s.action_count(),
        report.makespan_slots,
        peaks.join("\n")
    )
}

/// The `--list` table, from the registry.
fn list() -> String {
    let mut rows = vec![[
        "family".to_string(),
        "placement".into(),
        "I/W split".into(),
        "overlap".into(),
        "default V".into(),
        "constraints".into(),
        "summary".into(),
    ]];
    for f in FAMILIES {
        let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
        rows.push([
            f.name.to_string(),
            f.placement.to_string(),
            yes_no(f.splits_iw),
            yes_no(f.overlaps),
            f.default_chunks.to_string(),
            f.constraints.to_string(),
            f.summary.to_string(),
        ]);
    }
    rows.push([
        AUTO.to_string(),
        "looped|vshape".into(),
        "yes".into(),
        "no".into(),
        "1".into(),
        "needs costs (--cost/--costs); limit: --memory-limit or --max-in-flight".into(),
        "automatic: best schedule for the costs and limit (seeds, list scheduling, improvement, exact for small)".into(),
    ]);
    let widths: Vec<usize> = (0..7)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = r
                .iter()
                .zip(&widths)
                .map(|(t, w)| format!("{t:<w$}"))
                .collect();
            cells.join("  ").trim_end().to_string() + "\n"
        })
        .collect()
}
