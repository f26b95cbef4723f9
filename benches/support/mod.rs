//! What every bench shares so that `cargo bench` works as a regression run (docs/benchmarks.md,
//! "Benchmarks as a regression run"). Included by path from each bench (`host/benches` too), so it uses only what both
//! crates depend on (`serde`, `serde_json`).
//!
//! A bench's `main` makes a [`Run`], measures, [`Run::record`]s each figure (one stable
//! `pipefill-bench name=... value=... unit=...` line each) and ends with [`Run::finish`]; a criterion
//! bench runs its groups and ends with [`Run::finish_criterion`], which reads back the medians
//! criterion wrote in this run. Both then save the figures under criterion's `--save-baseline NAME`
//! (`base` by default) or compare them with `--baseline NAME`, print one `REGRESSION ...` or
//! `ok ...` line per figure, and exit with status 1 if any figure is worse than the baseline by more
//! than its threshold.

pub mod args;
pub mod callgrind;
pub mod criterion_out;
pub mod measure;
pub mod stats;
pub mod store;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use args::{BenchArgs, Mode};
use measure::{Better, Measurement};

/// One bench binary's run: its arguments, its figures, and the baseline it saves or compares.
pub struct Run {
    bench: String,
    /// The command line, read as criterion reads it.
    pub args: BenchArgs,
    home: PathBuf,
    threshold_override: Option<f64>,
    criterion_threshold: f64,
    before: criterion_out::Snapshot,
    measurements: Vec<Measurement>,
}

impl Run {
    /// Reads the command line and `PIPEFILL_BENCH_THRESHOLD`; on a bad one prints the error and
    /// exits with status 2.
    pub fn start(bench: &str) -> Self {
        let args = BenchArgs::from_env_or_exit(bench);
        let env = std::env::var("PIPEFILL_BENCH_THRESHOLD").ok();
        let threshold_override = measure::threshold_from_env(env.as_deref()).unwrap_or_else(|e| {
            eprintln!("error: bench {bench}: {e}");
            std::process::exit(2)
        });
        let home = store::criterion_home();
        let before = criterion_out::snapshot(&home);
        Self {
            bench: bench.to_string(),
            args,
            home,
            threshold_override,
            criterion_threshold: measure::DEFAULT_THRESHOLD,
            before,
            measurements: Vec::new(),
        }
    }

    /// The regression threshold for the figures criterion measured (relative, 0.10 = 10%).
    pub fn criterion_threshold(mut self, threshold: f64) -> Self {
        self.criterion_threshold = threshold;
        self
    }

    /// Whether a custom bench should measure: in bench mode, when `filter` selects one of `names`.
    /// With `--list` it prints the names as criterion does (`name: benchmark`); under
    /// `cargo test --benches` it says that it measured nothing.
    pub fn should_measure(&self, filter: Option<&str>, names: &[&str]) -> bool {
        let selected: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| self.args.selects(filter, n))
            .collect();
        match self.args.mode {
            Mode::List => {
                selected.iter().for_each(|n| println!("{n}: benchmark"));
                false
            }
            Mode::Test => {
                if !selected.is_empty() {
                    println!(
                        "Testing {}: not run (it measures only under `cargo bench`)",
                        self.bench
                    );
                }
                false
            }
            Mode::Bench if selected.is_empty() => false,
            Mode::Bench => {
                self.exit_if_baseline_missing();
                true
            }
        }
    }

    /// Under `--baseline NAME` (strict), a custom bench whose baseline was never saved stops
    /// before it measures, with status 2.
    fn exit_if_baseline_missing(&self) {
        if let args::Baseline::Compare { name, strict: true } = &self.args.baseline {
            let path = store::baseline_path(&self.home, &self.bench, name);
            if !path.exists() {
                eprintln!("error: bench {}: {}", self.bench, missing(name, &path));
                std::process::exit(2);
            }
        }
    }

    /// Whether `--quick` asked for a short run.
    pub fn quick(&self) -> bool {
        self.args.quick
    }

    /// Prints `m`'s machine-readable line and keeps it for the baseline. `PIPEFILL_BENCH_THRESHOLD`
    /// overrides its threshold.
    pub fn record(&mut self, mut m: Measurement) {
        if let Some(t) = self.threshold_override {
            m.threshold = t;
        }
        println!("{}", m.line());
        self.measurements.push(m);
    }

    /// Shorthand for [`Run::record`] of a figure where lower is better.
    pub fn lower(&mut self, name: &str, value: f64, unit: &str, threshold: f64) {
        self.record(Measurement::new(name, value, unit, Better::Lower).threshold(threshold));
    }

    /// Shorthand for [`Run::record`] of a figure where higher is better.
    pub fn higher(&mut self, name: &str, value: f64, unit: &str, threshold: f64) {
        self.record(Measurement::new(name, value, unit, Better::Higher).threshold(threshold));
    }

    /// Ends a custom bench: saves its figures under the baseline name, or compares them with the
    /// saved baseline. Status 1 on a regression, 2 when `--baseline NAME` was never saved.
    pub fn finish(self) -> ExitCode {
        if self.measurements.is_empty() {
            return ExitCode::SUCCESS;
        }
        match &self.args.baseline {
            args::Baseline::Save(name) => {
                let path = store::baseline_path(&self.home, &self.bench, name);
                match store::save(&path, &self.measurements) {
                    Ok(()) => {
                        println!(
                            "saved baseline `{name}` of {}: {}",
                            self.bench,
                            path.display()
                        );
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("error: bench {}: {e}", self.bench);
                        ExitCode::from(2)
                    }
                }
            }
            args::Baseline::Compare { name, strict } => {
                let path = store::baseline_path(&self.home, &self.bench, name);
                match store::load(&path) {
                    Ok(Some(saved)) => {
                        self.compare(name, |m| saved.measurements.get(&m.name).map(|b| b.value))
                    }
                    Ok(None) if !strict => {
                        println!("no baseline `{name}` of {} to compare with", self.bench);
                        ExitCode::SUCCESS
                    }
                    Ok(None) => {
                        eprintln!("error: bench {}: {}", self.bench, missing(name, &path));
                        ExitCode::from(2)
                    }
                    Err(e) => {
                        eprintln!("error: bench {}: {e}", self.bench);
                        ExitCode::from(2)
                    }
                }
            }
            args::Baseline::Discard => ExitCode::SUCCESS,
        }
    }

    /// Ends a criterion bench (after its groups and `final_summary`): prints one line per benchmark
    /// criterion measured in this run (median, ns) and, under `--baseline`/`--baseline-lenient`,
    /// compares each median with the baseline's. Criterion itself saved the baseline.
    pub fn finish_criterion(mut self) -> ExitCode {
        let mut dirs = BTreeMap::new();
        for r in criterion_out::written_since(&self.home, &self.before) {
            let m = Measurement::new(&r.id, r.median_ns, "ns", Better::Lower)
                .threshold(self.criterion_threshold);
            dirs.insert(m.name.clone(), r.dir);
            self.record(m);
        }
        let args::Baseline::Compare { name, .. } = &self.args.baseline else {
            return ExitCode::SUCCESS;
        };
        self.compare(name, |m| {
            let dir = dirs.get(&m.name)?;
            criterion_out::median_ns(&dir.join(name).join("estimates.json"))
        })
    }

    /// Prints a verdict per figure (in order) against `baseline`; status 1 if any regressed.
    fn compare(&self, name: &str, baseline: impl FnMut(&Measurement) -> Option<f64>) -> ExitCode {
        let (lines, regressions) = verdicts(&self.measurements, name, baseline);
        lines.iter().for_each(|l| println!("{l}"));
        println!(
            "{}: {} figures against baseline `{name}`, {regressions} regressions",
            self.bench,
            self.measurements.len()
        );
        if regressions > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        }
    }
}

/// One line per figure of `measurements` (in order) against the baseline named `name`, whose value
/// of a figure `baseline` returns: `REGRESSION ...`, `ok ...`, or `new ...` when it has none; and
/// the number of regressions.
pub fn verdicts(
    measurements: &[Measurement],
    name: &str,
    mut baseline: impl FnMut(&Measurement) -> Option<f64>,
) -> (Vec<String>, usize) {
    let mut regressions = 0;
    let lines = measurements
        .iter()
        .map(|m| match baseline(m) {
            Some(b) => {
                let v = m.against(b);
                regressions += usize::from(v.regressed);
                v.line(m)
            }
            None => format!("new name={} (not in baseline `{name}`)", m.name),
        })
        .collect();
    (lines, regressions)
}

/// The error for a baseline that was never saved.
fn missing(name: &str, path: &std::path::Path) -> String {
    format!(
        "baseline `{name}` not found at {}: run `cargo bench -- --save-baseline {name}` on the \
         reference tree first",
        path.display()
    )
}
