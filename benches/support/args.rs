//! The command line `cargo bench` hands to every bench binary, read the way criterion reads it.
//!
//! `cargo bench -- ARGS` passes `--bench` and `ARGS` to every bench target, criterion's or not, so a
//! custom-harness bench must accept everything criterion accepts: the flags it acts on
//! (`--save-baseline`, `--baseline`, `--baseline-lenient`, `--discard-baseline`, `--quick`, `--list`,
//! `--exact`, `--ignored`, `--test`, a filter) and the ones it only passes through (plot, output and
//! statistics settings, libtest's `--nocapture`). An unknown flag is refused, as criterion does.

use std::fmt;

/// What the binary was asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `cargo bench`: measure.
    Bench,
    /// `cargo test --benches` (no `--bench`) or `-- --test`: check it runs, measure nothing.
    Test,
    /// `--list`: name the benchmarks.
    List,
}

/// What happens to the figures of this run, as criterion's baseline flags say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// Save under this name (`--save-baseline NAME`; `base` without a flag, as criterion does).
    Save(String),
    /// Compare with this saved baseline (`--baseline NAME`, strict: a missing baseline is an error;
    /// `--baseline-lenient NAME`: figures without a saved value are only printed).
    Compare {
        /// The baseline's name.
        name: String,
        /// Whether a missing baseline is an error.
        strict: bool,
    },
    /// `--discard-baseline`: save nothing.
    Discard,
}

/// A command line the benches refuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// A flag neither criterion nor the benches know.
    Unknown(String),
    /// A flag that takes a value came last.
    MissingValue(String),
    /// Two baseline flags at once (criterion refuses them too).
    Conflict(String, String),
    /// A baseline name that cannot be a directory name.
    BadName(String),
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(a) => write!(
                f,
                "unknown argument `{a}`: the benches take criterion's flags (see `cargo bench --bench runtime -- --help`)"
            ),
            Self::MissingValue(a) => write!(f, "`{a}` needs a value, e.g. `{a} main`"),
            Self::Conflict(a, b) => write!(f, "`{a}` and `{b}` cannot be used together: pick one"),
            Self::BadName(n) => write!(
                f,
                "baseline name `{n}` is not a plain name: use letters, digits, `-`, `_` or `.`"
            ),
        }
    }
}

impl std::error::Error for ArgError {}

/// Criterion's flags that take a value (long and short forms), which the benches accept and ignore
/// unless listed in [`BenchArgs`].
const VALUE_FLAGS: &[&str] = &[
    "--color",
    "--colour",
    "-c",
    "--format",
    "--profile-time",
    "--load-baseline",
    "--sample-size",
    "--warm-up-time",
    "--measurement-time",
    "--nresamples",
    "--noise-threshold",
    "--confidence-level",
    "--significance-level",
    "--plotting-backend",
    "--output-format",
];

/// Criterion's switches the benches accept and ignore.
const IGNORED_SWITCHES: &[&str] = &[
    "--verbose",
    "-v",
    "--quiet",
    "--noplot",
    "-n",
    "--nocapture",
    "--show-output",
    "--include-ignored",
    "--version",
    "-V",
    "--help",
    "-h",
];

/// The parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchArgs {
    /// Measure, check, or list.
    pub mode: Mode,
    /// Save, compare or discard.
    pub baseline: Baseline,
    /// `--quick`: criterion's short sampling; the custom benches take fewer steps.
    pub quick: bool,
    /// `--ignored`: criterion then runs nothing.
    pub ignored: bool,
    /// `--exact`: the filter must equal a name instead of occurring in it.
    pub exact: bool,
    /// Positional arguments in order; criterion takes the first as its filter.
    pub positional: Vec<String>,
}

/// The switches that choose the [`Mode`], as seen on the command line.
#[derive(Default)]
struct Modes {
    bench: bool,
    test: bool,
    list: bool,
}

impl BenchArgs {
    /// Parses `args` (without the program name).
    pub fn parse<I, S>(args: I) -> Result<Self, ArgError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut it = args.into_iter().map(Into::into);
        let mut modes = Modes::default();
        let mut out = BenchArgs {
            mode: Mode::Bench,
            baseline: Baseline::Save("base".into()),
            quick: false,
            ignored: false,
            exact: false,
            positional: Vec::new(),
        };
        let mut baseline_flag: Option<String> = None;
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with('-') => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let value = |it: &mut dyn Iterator<Item = String>| {
                inline
                    .clone()
                    .or_else(|| it.next())
                    .ok_or_else(|| ArgError::MissingValue(flag.clone()))
            };
            if out.switch(&flag, &mut modes) {
                continue;
            }
            let chosen = match flag.as_str() {
                "--save-baseline" | "-s" => Some(Baseline::Save(value(&mut it)?)),
                "--baseline" | "-b" => Some(Baseline::Compare {
                    name: value(&mut it)?,
                    strict: true,
                }),
                "--baseline-lenient" => Some(Baseline::Compare {
                    name: value(&mut it)?,
                    strict: false,
                }),
                "--discard-baseline" => Some(Baseline::Discard),
                f if VALUE_FLAGS.contains(&f) => {
                    value(&mut it)?;
                    None
                }
                f if IGNORED_SWITCHES.contains(&f) => None,
                f if f.starts_with('-') && f.len() > 1 => return Err(ArgError::Unknown(arg)),
                _ => {
                    out.positional.push(arg);
                    None
                }
            };
            if let Some(b) = chosen {
                if let Some(prev) = baseline_flag.replace(flag.clone()) {
                    return Err(ArgError::Conflict(prev, flag));
                }
                out.baseline = b;
            }
        }
        if let Baseline::Save(n) | Baseline::Compare { name: n, .. } = &out.baseline {
            if !plain_name(n) {
                return Err(ArgError::BadName(n.clone()));
            }
        }
        // As criterion: `cargo bench` passes `--bench`; `cargo test --benches` passes nothing.
        out.mode = if modes.list {
            Mode::List
        } else if !modes.bench || modes.test {
            Mode::Test
        } else {
            Mode::Bench
        };
        Ok(out)
    }

    /// Sets the flag if it is a plain switch (`--bench`, `--test`, `--list`, `--quick`, `--ignored`,
    /// `--exact`); `false` for any other argument.
    fn switch(&mut self, flag: &str, modes: &mut Modes) -> bool {
        let target = match flag {
            "--bench" => &mut modes.bench,
            "--test" => &mut modes.test,
            "--list" => &mut modes.list,
            "--quick" => &mut self.quick,
            "--ignored" => &mut self.ignored,
            "--exact" => &mut self.exact,
            _ => return false,
        };
        *target = true;
        true
    }

    /// Parses this process's arguments; on a bad command line prints the error and exits with
    /// status 2.
    pub fn from_env_or_exit(bench: &str) -> Self {
        match Self::parse(std::env::args().skip(1)) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("error: bench {bench}: {e}");
                std::process::exit(2);
            }
        }
    }

    /// The filter: the first positional argument, as criterion reads it.
    pub fn filter(&self) -> Option<&str> {
        self.positional.first().map(String::as_str)
    }

    /// Whether a benchmark named `name` runs under `filter`. Criterion reads the filter as a regular
    /// expression; the custom benches match it as plain text (contained in the name, or equal to it
    /// with `--exact`), so a filter written with regex syntax skips them.
    pub fn selects(&self, filter: Option<&str>, name: &str) -> bool {
        if self.ignored {
            return false;
        }
        match filter {
            None => true,
            Some(f) if self.exact => name == f,
            Some(f) => name.contains(f),
        }
    }
}

/// A baseline name that is safe as one directory or file name.
fn plain_name(n: &str) -> bool {
    !n.is_empty()
        && n != "."
        && n != ".."
        && n != "new"
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}
