//! The `--cost` flag: uniform costs written inline, e.g. `F=1,I=1,W=1` or `F=2ms,B=4ms,A=64MiB,O=8MiB`.
//!
//! Keys (short or long form), each at most once:
//!
//! | key | long form | meaning | unit |
//! | --- | --- | --- | --- |
//! | `F` | `forward` | forward time | seconds |
//! | `I` | `backward_input` | backward for inputs | seconds |
//! | `W` | `backward_weight` | backward for weights | seconds |
//! | `B` | `backward` | full backward | seconds |
//! | `A` | `activation_bytes` | activation bytes held per microbatch | bytes |
//! | `R` | `released_at_input` | part of `A` freed when I ends | bytes |
//! | `P` | `parameter_bytes` | parameter bytes | bytes |
//! | `O` | `output_bytes`, `bytes` | bytes sent across a stage boundary per microbatch | bytes |
//!
//! Times take an optional suffix `s`, `ms`, `us`, `ns` (plain numbers are seconds, or abstract time
//! units when all costs are given that way); sizes take `K`, `M`, `G` (powers of 1000) or `KiB`, `MiB`,
//! `GiB` (powers of 1024), with or without a trailing `B`. `F` is required, and the backward as in
//! [`super::resolve_backward`].
//!
//! The values are **one rank's work at `V = 1`**: a schedule with `V` chunks per rank gives each stage
//! `1/V` of every time and size except `O`, so schedules with different `V` share the same model.

use super::check::Quantity;
use super::{resolve_backward, CostError, StageCost};
use crate::input::excerpt;

/// The keys, as `(short, long forms, quantity)`.
const KEYS: &[(&str, &[&str], Quantity)] = &[
    ("F", &["forward"], Quantity::Seconds),
    ("I", &["backward_input"], Quantity::Seconds),
    ("W", &["backward_weight"], Quantity::Seconds),
    ("B", &["backward"], Quantity::Seconds),
    ("A", &["activation_bytes"], Quantity::Bytes),
    ("R", &["released_at_input"], Quantity::Bytes),
    ("P", &["parameter_bytes"], Quantity::Bytes),
    ("O", &["output_bytes", "bytes"], Quantity::Bytes),
];

const FIX: &str =
    "write KEY=VALUE pairs separated by commas, e.g. F=1,I=1,W=1 or F=2ms,B=4ms,A=64MiB; \
                   keys F, I, W, B (times), A, R, P, O (bytes)";

/// Parses the `--cost` flag into one rank's [`StageCost`] (at `V = 1`).
///
/// ```
/// use pipefill_host::cost::parse_cost_flag;
/// let c = parse_cost_flag("F=1,I=1,W=2").unwrap();
/// assert_eq!((c.forward, c.backward), (1.0, 3.0));
/// let c = parse_cost_flag("F=2ms,B=4ms,A=1KiB").unwrap();
/// assert_eq!((c.backward_input, c.activation_bytes), (0.002, 1024.0));
/// assert!(parse_cost_flag("F=-1,B=1").unwrap_err().to_string().contains("negative"));
/// ```
pub fn parse_cost_flag(text: &str) -> Result<StageCost, CostError> {
    let mut values: [Option<f64>; 8] = [None; 8];
    for part in text.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(CostError::flag(text, "has an empty entry", FIX));
        }
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| CostError::flag(part, "is not KEY=VALUE", FIX))?;
        let key = key.trim();
        let slot = key_slot(key)
            .ok_or_else(|| CostError::flag(part, format!("unknown key `{}`", excerpt(key)), FIX))?;
        if values[slot].is_some() {
            return Err(CostError::flag(
                part,
                format!("key `{}` is given twice", excerpt(key)),
                "give each key once",
            ));
        }
        let q = KEYS[slot].2;
        let v = parse_value(value.trim(), q).ok_or_else(|| {
            CostError::flag(
                part,
                format!("cannot read `{}` as a {}", excerpt(value.trim()), noun(q)),
                unit_help(q),
            )
        })?;
        if let Some(problem) = q.problem(v) {
            return Err(CostError::flag(part, problem, q.expected()));
        }
        values[slot] = Some(v);
    }
    let [f, i, w, b, a, r, p, o] = values;
    let forward = f.ok_or_else(|| CostError::flag(text, "F (forward time) is missing", FIX))?;
    let (backward_input, backward_weight, backward) =
        resolve_backward("", i, w, b).map_err(|e| match e {
            CostError::Field { field, problem, .. } => CostError::flag(
                text,
                format!("{} {problem}", key_name(&field)),
                "give I and W, or B, or B with one of I and W, e.g. F=1,I=1,W=1 or F=1,B=2",
            ),
            other => other,
        })?;
    let activation_bytes = a.unwrap_or(0.0);
    let released_at_input = r.unwrap_or(0.0);
    if released_at_input > activation_bytes {
        return Err(CostError::flag(
            text,
            format!("R ({released_at_input}) is larger than A ({activation_bytes})"),
            "R is the part of the activation bytes A freed at I: at most A",
        ));
    }
    Ok(StageCost {
        forward,
        backward_input,
        backward_weight,
        backward,
        activation_bytes,
        released_at_input,
        parameter_bytes: p.unwrap_or(0.0),
        output_bytes: o.unwrap_or(0.0),
        input_bytes: 0.0,
        selective_bytes: 0.0,
        selective_time: 0.0,
        recompute: super::Recompute::None,
    })
}

/// Whether a `--cost` text gives its times in seconds: some time key (`F`, `I`, `W`, `B`) carries
/// a unit suffix (`s`, `ms`, `us`, `ns`). When none does, the times are abstract units (the
/// default `F=1,I=1,W=1`), and reports say "units", not "s".
///
/// ```
/// use pipefill_host::cost::flag::times_in_seconds;
/// assert!(!times_in_seconds("F=1,I=1,W=1,A=64MiB"));
/// assert!(times_in_seconds("F=2ms,B=4ms"));
/// assert!(times_in_seconds("forward=1s,backward=2"));
/// ```
pub fn times_in_seconds(text: &str) -> bool {
    text.split(',')
        .filter_map(|part| part.split_once('='))
        .any(|(key, value)| {
            let value = value.trim();
            key_slot(key.trim()).is_some_and(|slot| KEYS[slot].2 == Quantity::Seconds)
                && suffix_start(value) < value.len()
        })
}

/// Parses a time for a command-line flag (`0.5`, `20us`, `1.5ms`; plain numbers are seconds):
/// finite and `>= 0`. The error says what would be accepted.
///
/// ```
/// assert_eq!(pipefill_host::cost::flag::parse_time("20us"), Ok(2e-5));
/// assert!(pipefill_host::cost::flag::parse_time("-1").is_err());
/// ```
pub fn parse_time(text: &str) -> Result<f64, String> {
    parse_checked(text, Quantity::Seconds)
}

/// Parses a size in bytes for a command-line flag (`1048576`, `4e10`, `64MiB`, `40GB`, `2G`,
/// `1TiB`): from 0 to 1e18. Every command's byte-size flag goes through it.
///
/// ```
/// use pipefill_host::cost::flag::parse_bytes;
/// assert_eq!(parse_bytes("40GB"), Ok(4e10));
/// assert_eq!(parse_bytes("4e10"), Ok(4e10));
/// assert_eq!(parse_bytes("1GiB"), Ok(1073741824.0));
/// assert!(parse_bytes("40 apples").is_err());
/// ```
pub fn parse_bytes(text: &str) -> Result<f64, String> {
    parse_checked(text, Quantity::Bytes)
}

/// [`parse_bytes`] as a whole number of bytes (rounded down).
pub fn parse_bytes_u64(text: &str) -> Result<u64, String> {
    // At most 1e18 (checked), which a u64 holds.
    parse_bytes(text).map(|v| v.floor() as u64)
}

/// Parses a bandwidth in bytes per second (`2.5e10`, `25GB`, `100GiB`; "per second" implied): `> 0`.
pub fn parse_bandwidth(text: &str) -> Result<f64, String> {
    let v = parse_value(text.trim(), Quantity::Bytes).ok_or_else(|| {
        format!(
            "cannot read `{}`: {}",
            excerpt(text),
            Quantity::BytesPerSecond.expected()
        )
    })?;
    match Quantity::BytesPerSecond.problem(v) {
        Some(p) => Err(format!(
            "`{}` {p}: {}",
            excerpt(text),
            Quantity::BytesPerSecond.expected()
        )),
        None => Ok(v),
    }
}

/// A value with a unit suffix, range-checked.
fn parse_checked(text: &str, q: Quantity) -> Result<f64, String> {
    let v = parse_value(text.trim(), q)
        .ok_or_else(|| format!("cannot read `{}`: {}", excerpt(text), unit_help(q)))?;
    match q.problem(v) {
        Some(p) => Err(format!("`{}` {p}: {}", excerpt(text), q.expected())),
        None => Ok(v),
    }
}

/// `I (backward_input)` for a long key name.
fn key_name(long: &str) -> String {
    match KEYS.iter().find(|(_, l, _)| l.contains(&long)) {
        Some((short, _, _)) => format!("{short} ({long})"),
        None => long.to_string(),
    }
}

/// "time" or "size".
fn noun(q: Quantity) -> &'static str {
    if q == Quantity::Seconds {
        "time"
    } else {
        "size"
    }
}

/// The accepted forms of a value.
fn unit_help(q: Quantity) -> &'static str {
    if q == Quantity::Seconds {
        "write a number of seconds, optionally with a suffix s, ms, us or ns, e.g. 1.5ms"
    } else {
        "write a number of bytes (4e10), optionally with a suffix K, M, G, T (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), with or without B, e.g. 64MiB or 40GB"
    }
}

/// A number with an optional unit suffix for `q`.
/// The index in `KEYS` of a key in its short or long form.
fn key_slot(key: &str) -> Option<usize> {
    KEYS.iter()
        .position(|(short, long, _)| *short == key || long.contains(&key))
}

/// Where a value's unit suffix starts (its first letter other than an exponent's `e`); the
/// text's length when it has none.
fn suffix_start(text: &str) -> usize {
    text.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(text.len())
}

fn parse_value(text: &str, q: Quantity) -> Option<f64> {
    if let Ok(v) = text.parse::<f64>() {
        return Some(v); // includes `inf` and `NaN`, refused with a clear reason by the caller
    }
    let (num, suffix) = text.split_at(suffix_start(text));
    // Sub-second units divide (20us = 20 / 1e6, exactly 2e-5), so values read as written.
    let per = match (q, suffix) {
        (Quantity::Seconds, "ms") => Some(1e3),
        (Quantity::Seconds, "us") => Some(1e6),
        (Quantity::Seconds, "ns") => Some(1e9),
        _ => None,
    };
    if let Some(per) = per {
        return num.trim().parse::<f64>().ok().map(|v| v / per);
    }
    let scale = if q == Quantity::Seconds {
        match suffix {
            "" | "s" => 1.0,
            _ => return None,
        }
    } else {
        match suffix.strip_suffix('B').unwrap_or(suffix) {
            "" => 1.0,
            "K" | "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "Ki" => 1024.0,
            "Mi" => 1024.0 * 1024.0,
            "Gi" => 1024.0 * 1024.0 * 1024.0,
            "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return None,
        }
    };
    num.trim().parse::<f64>().ok().map(|v| v * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let c = parse_cost_flag("F=1,I=1,W=1").unwrap();
        assert_eq!(c, StageCost::uniform(1.0, 1.0, 1.0));
        let c = parse_cost_flag("forward=1, backward=3, bytes=2MB, P=1GiB").unwrap();
        assert_eq!((c.backward_input, c.output_bytes), (1.5, 2e6));
        assert_eq!(c.parameter_bytes, 1024.0 * 1024.0 * 1024.0);
        assert_eq!(parse_cost_flag("F=1e-3,B=2us").unwrap().backward, 2e-6);
    }

    #[test]
    fn refusals() {
        for (text, needle) in [
            ("", "empty"),
            ("F=1,,B=1", "empty"),
            ("F1", "KEY=VALUE"),
            ("F=1,X=2", "unknown key `X`"),
            ("F=1,F=2,B=1", "twice"),
            ("F=abc,B=1", "cannot read"),
            ("F=1min,B=1", "cannot read"),
            ("F=NaN,B=1", "NaN"),
            ("F=inf,B=1", "not finite"),
            ("F=1,B=-2", "negative"),
            ("B=1", "F (forward time) is missing"),
            ("F=1", "I (backward_input) is missing"),
            ("F=1,I=1", "W (backward_weight) is missing"),
            ("F=1,I=3,B=2", "I (backward_input) is larger than backward"),
            ("F=1,B=1,A=1,R=2", "larger than A"),
        ] {
            let e = parse_cost_flag(text).unwrap_err().to_string();
            assert!(e.contains(needle), "`{text}` gave `{e}`, wanted `{needle}`");
            assert!(e.contains("Fix:"), "{e}");
        }
    }
}
