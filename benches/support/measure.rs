//! One figure a bench reports, its machine-readable line, and how it compares with a baseline.

use serde::{Deserialize, Serialize};

/// The prefix of every machine-readable line (`scripts/bench-compare.sh` reads these).
pub const LINE_PREFIX: &str = "pipefill-bench";

/// Relative change beyond which a figure counts as a regression unless the bench or
/// `PIPEFILL_BENCH_THRESHOLD` says otherwise (see docs/benchmarks.md).
pub const DEFAULT_THRESHOLD: f64 = 0.10;

/// Which way is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Times, bytes: smaller is better.
    Lower,
    /// Speedups, throughputs: larger is better.
    Higher,
}

impl Better {
    /// `lower` or `higher`, as in the machine-readable line.
    pub fn as_str(self) -> &'static str {
        match self {
            Better::Lower => "lower",
            Better::Higher => "higher",
        }
    }
}

/// One figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// `bench/what`, no spaces (see [`Measurement::new`]).
    pub name: String,
    /// The figure.
    pub value: f64,
    /// `s`, `ns`, `x`, `%`, ...
    pub unit: String,
    /// Which way is better.
    pub better: Better,
    /// Relative change in the worse direction that counts as a regression (0.10 = 10%).
    pub threshold: f64,
}

impl Measurement {
    /// A figure; spaces and `=` in `name` become `_` so that the line stays `key=value` pairs.
    pub fn new(name: &str, value: f64, unit: &str, better: Better) -> Self {
        Self {
            name: clean_name(name),
            value,
            unit: unit.to_string(),
            better,
            threshold: DEFAULT_THRESHOLD,
        }
    }

    /// The same figure with its own regression threshold (relative, 0.25 = 25%).
    pub fn threshold(mut self, threshold: f64) -> Self {
        self.threshold = threshold;
        self
    }

    /// `pipefill-bench name=... value=... unit=... better=... threshold=...`, one line, stable.
    pub fn line(&self) -> String {
        format!(
            "{LINE_PREFIX} name={} value={} unit={} better={} threshold={}",
            self.name,
            self.value,
            self.unit,
            self.better.as_str(),
            self.threshold
        )
    }

    /// This figure against `baseline`'s value of it.
    pub fn against(&self, baseline: f64) -> Verdict {
        let change = if baseline != 0.0 {
            (self.value - baseline) / baseline.abs()
        } else if self.value == 0.0 {
            0.0
        } else {
            f64::INFINITY.copysign(self.value)
        };
        let worse = match self.better {
            Better::Lower => change,
            Better::Higher => -change,
        };
        Verdict {
            baseline,
            change,
            regressed: worse > self.threshold,
        }
    }
}

/// A figure compared with its baseline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// The baseline's value.
    pub baseline: f64,
    /// `(value - baseline) / |baseline|`, signed.
    pub change: f64,
    /// Worse than the baseline by more than the threshold.
    pub regressed: bool,
}

impl Verdict {
    /// `REGRESSION name=...` or `ok name=...` with both values and the change.
    pub fn line(&self, m: &Measurement) -> String {
        format!(
            "{} name={} baseline={} value={} unit={} change={:+.1}% threshold={:.1}% better={}",
            if self.regressed { "REGRESSION" } else { "ok" },
            m.name,
            self.baseline,
            m.value,
            m.unit,
            self.change * 100.0,
            m.threshold * 100.0,
            m.better.as_str()
        )
    }
}

/// `name` with whitespace and `=` replaced by `_`.
pub fn clean_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_whitespace() || c == '=' {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// Reads `PIPEFILL_BENCH_THRESHOLD` (percent, e.g. `15`): `Ok(None)` when unset, an error naming the
/// variable and the fix when it is not a positive number.
pub fn threshold_from_env(value: Option<&str>) -> Result<Option<f64>, String> {
    let Some(v) = value else { return Ok(None) };
    match v.trim().parse::<f64>() {
        Ok(p) if p.is_finite() && p > 0.0 => Ok(Some(p / 100.0)),
        _ => Err(format!(
            "PIPEFILL_BENCH_THRESHOLD={v:?} is not a positive percentage: set it like PIPEFILL_BENCH_THRESHOLD=15, or unset it"
        )),
    }
}
