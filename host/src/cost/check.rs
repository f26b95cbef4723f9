//! Checked reading of JSON objects: every field by path, with the kind of quantity it must hold.
//!
//! The cost file is read through these helpers instead of a derived `Deserialize`, so that every
//! error names the exact field (`layers[3].forward`), what was found, and what would be accepted.

use serde_json::{Map, Value};

use super::CostError;

/// The largest time accepted, in seconds (about 31,700 years): far above any real action, low
/// enough that every sum and product the simulator, the bound and the planner form over up to
/// 2^26 stage-microbatch pairs stays finite, so no loop ever sees an infinity.
pub const MAX_SECONDS: f64 = 1e12;

/// The largest size accepted, in bytes (1 EB), for the same reason.
pub const MAX_BYTES: f64 = 1e18;

/// The smallest bandwidth accepted, in bytes per second: a transfer of [`MAX_BYTES`] then takes at
/// most `1e18` seconds, still finite when summed.
pub const MIN_BANDWIDTH: f64 = 1.0;

/// The kind of number a field holds; decides the accepted range and the wording of errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quantity {
    /// A time in seconds, `>= 0`.
    Seconds,
    /// A size in bytes, `>= 0`.
    Bytes,
    /// Bytes per second, `> 0`.
    BytesPerSecond,
    /// A share in `0..=1`.
    Share,
    /// A multiple of a microbatch size, `> 0`.
    Scale,
}

impl Quantity {
    /// What a valid value looks like, for the "Fix:" part of errors.
    pub(crate) fn expected(self) -> &'static str {
        match self {
            Quantity::Seconds => "a number of seconds from 0 to 1e12, e.g. 0.0015",
            Quantity::Bytes => "a number of bytes from 0 to 1e18, e.g. 1048576",
            Quantity::BytesPerSecond => "a number of bytes per second from 1 to 1e18, e.g. 2.5e10",
            Quantity::Share => "a number between 0 and 1, e.g. 0.1",
            Quantity::Scale => {
                "a positive multiple of the microbatch size the layer's times were measured at, \
                 e.g. 0.5 for half as many rows"
            }
        }
    }

    /// `Some(problem)` when `v` is out of range for this quantity.
    pub(crate) fn problem(self, v: f64) -> Option<String> {
        if v.is_nan() {
            return Some("is NaN".into());
        }
        if !v.is_finite() {
            return Some(format!("is not finite ({})", num(v)));
        }
        match self {
            Quantity::Seconds | Quantity::Bytes if v < 0.0 => {
                Some(format!("is negative ({})", num(v)))
            }
            Quantity::BytesPerSecond | Quantity::Scale if v <= 0.0 => {
                Some(format!("must be positive, found {}", num(v)))
            }
            Quantity::Share if !(0.0..=1.0).contains(&v) => {
                Some(format!("must lie between 0 and 1, found {}", num(v)))
            }
            Quantity::Seconds if v > MAX_SECONDS => Some(format!(
                "is too large ({} s, more than {MAX_SECONDS:e})",
                num(v)
            )),
            Quantity::Bytes | Quantity::BytesPerSecond if v > MAX_BYTES => Some(format!(
                "is too large ({}, more than {MAX_BYTES:e})",
                num(v)
            )),
            Quantity::BytesPerSecond if v < MIN_BANDWIDTH => Some(format!(
                "is below {MIN_BANDWIDTH} byte per second ({})",
                num(v)
            )),
            Quantity::Scale if v > MAX_BYTES => Some(format!("is too large ({})", num(v))),
            _ => None,
        }
    }

    /// Checks `v`, naming `field` in the error.
    pub(crate) fn check(self, field: &str, v: f64) -> Result<f64, CostError> {
        match self.problem(v) {
            Some(p) => Err(CostError::field(field, p, self.expected())),
            None => Ok(v),
        }
    }
}

/// A JSON object being read, with its path in the file (empty for the top level).
pub(crate) struct Fields<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

/// The JSON type of a value, as errors name it.
pub(crate) fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("a boolean ({b})"),
        Value::Number(n) => format!("a number ({n})"),
        Value::String(s) => format!("a string (\"{}\")", crate::input::excerpt(s)),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

impl<'a> Fields<'a> {
    /// Reads `value` at `path` as an object; `what` describes the expected object for the fix.
    pub(crate) fn object(value: &'a Value, path: &str, what: &str) -> Result<Self, CostError> {
        match value {
            Value::Object(map) => Ok(Fields {
                path: path.to_string(),
                map,
            }),
            other => Err(CostError::field(
                if path.is_empty() { "(top level)" } else { path },
                format!("expected an object, found {}", kind(other)),
                what,
            )),
        }
    }

    /// The path of `key` inside this object.
    pub(crate) fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Whether `key` is present.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// The raw value of `key`, if present.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }

    /// Refuses keys not in `allowed` (catches misspellings such as `foward`).
    pub(crate) fn only(&self, allowed: &[&str]) -> Result<(), CostError> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => Err(CostError::field(
                self.path_of(k),
                "is not a known field",
                match closest(k, allowed) {
                    Some(near) => format!(
                        "did you mean `{near}`? Known fields: {}",
                        allowed.join(", ")
                    ),
                    None => format!("use only the known fields: {}", allowed.join(", ")),
                },
            )),
        }
    }

    /// The number at `key`, checked against `q`; `None` when absent.
    pub(crate) fn number(&self, key: &str, q: Quantity) -> Result<Option<f64>, CostError> {
        let path = self.path_of(key);
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(v) => q.check(&path, v).map(Some),
                None => Err(CostError::field(
                    path,
                    "is not representable as a number",
                    q.expected(),
                )),
            },
            Some(other) => Err(CostError::field(
                path,
                format!("expected a number, found {}", kind(other)),
                q.expected(),
            )),
        }
    }

    /// The number at `key`, which must be present.
    pub(crate) fn required(&self, key: &str, q: Quantity) -> Result<f64, CostError> {
        self.number(key, q)?.ok_or_else(|| {
            CostError::field(
                self.path_of(key),
                "is missing",
                format!("add `{key}`: {}", q.expected()),
            )
        })
    }

    /// The string at `key`; `None` when absent.
    pub(crate) fn string(&self, key: &str) -> Result<Option<String>, CostError> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(CostError::field(
                self.path_of(key),
                format!("expected a string, found {}", kind(other)),
                "write the name in quotes, e.g. \"layer0\"",
            )),
        }
    }

    /// The array at `key`, which must be present and non-empty.
    pub(crate) fn array(&self, key: &str, what: &str) -> Result<&'a [Value], CostError> {
        let path = self.path_of(key);
        match self.map.get(key) {
            None => Err(CostError::field(
                path,
                "is missing",
                format!("add `{key}`: {what}"),
            )),
            Some(Value::Array(a)) if a.is_empty() => Err(CostError::field(
                path,
                "is empty",
                format!("give at least one entry: {what}"),
            )),
            Some(Value::Array(a)) => Ok(a),
            Some(other) => Err(CostError::field(
                path,
                format!("expected an array, found {}", kind(other)),
                what,
            )),
        }
    }
}

/// The entry of `allowed` nearest to `key` (edit distance at most 3), for "did you mean".
fn closest<'b>(key: &str, allowed: &[&'b str]) -> Option<&'b str> {
    allowed
        .iter()
        .map(|a| (edit_distance(key, a), *a))
        .filter(|(d, _)| *d <= 3)
        .min_by_key(|(d, _)| *d)
        .map(|(_, a)| a)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// `v` as an error shows it: plain when it is short, else in scientific notation (`1e308`, not
/// its 309 digits).
fn num(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-4..1e6).contains(&a) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("foward", "forward"), 1);
        assert_eq!(closest("foward", &["forward", "name"]), Some("forward"));
        assert_eq!(closest("zzzzzzzz", &["forward", "name"]), None);
    }

    #[test]
    fn quantities() {
        assert!(Quantity::Seconds.problem(-1.0).is_some());
        assert!(Quantity::Seconds.problem(f64::NAN).is_some());
        assert!(Quantity::Seconds.problem(0.0).is_none());
        assert!(Quantity::BytesPerSecond.problem(0.0).is_some());
        assert!(Quantity::Share.problem(1.5).is_some());
    }
}
