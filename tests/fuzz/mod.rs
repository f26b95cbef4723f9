//! The damage the fuzz tests do to valid input files: structured mutations (byte flips, truncation,
//! duplication, extreme numbers, deep nesting, a byte-order mark, long tokens, wrong types, missing
//! and extra keys), seeded from the environment so that any failure is reproducible.
//!
//! `PIPEFILL_FUZZ_SEED` (default: a fixed seed), `PIPEFILL_FUZZ_CASES` (default: each test's own
//! count) and `PIPEFILL_FUZZ_FIRST` (the first case, default 0) set the run; every test prints the
//! seed it used.

pub mod valid;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The seed every fuzz test uses when `PIPEFILL_FUZZ_SEED` is not set.
pub const DEFAULT_SEED: u64 = 0x5eed_f022;

/// The run's seed and cases: `PIPEFILL_FUZZ_CASES` of them (`default_cases` unless set) from case
/// `PIPEFILL_FUZZ_FIRST` (0 unless set; to replay one case, give it with `PIPEFILL_FUZZ_CASES=1`).
/// The seed is printed so a failure can be replayed.
pub fn settings(test: &str, default_cases: usize) -> (u64, std::ops::Range<usize>) {
    let var = |name: &str| {
        std::env::var(name).ok().map(|v| {
            v.trim()
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{name}={v:?}: {e} (give a whole number)"))
        })
    };
    let seed = var("PIPEFILL_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let cases = var("PIPEFILL_FUZZ_CASES").map_or(default_cases, |c| c as usize);
    let first = var("PIPEFILL_FUZZ_FIRST").unwrap_or(0) as usize;
    eprintln!(
        "{test}: PIPEFILL_FUZZ_SEED={seed} PIPEFILL_FUZZ_FIRST={first} PIPEFILL_FUZZ_CASES={cases}"
    );
    (seed, first..first.saturating_add(cases))
}

/// The random source of case `case` of reader `reader` under `seed`: each case replays alone.
pub fn rng(seed: u64, reader: &str, case: usize) -> ChaCha8Rng {
    let h = reader.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    ChaCha8Rng::seed_from_u64(h ^ (case as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Numbers at and past every edge a reader checks: overflow, NaN and infinity (as JSON does not
/// write them, and as TOML and CSV do), negatives, subnormals, integer limits and long digit runs.
const EXTREMES: &[&str] = &[
    "1e308",
    "-1e308",
    "1e309",
    "1.7976931348623157e308",
    "1e-320",
    "5e-324",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "Infinity",
    "-1",
    "-0",
    "0",
    "0.0",
    "1.5",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "1e19",
    "1e100",
    "0x10",
    "1_000",
    "+1",
    ".5",
    "1e",
];

/// Values of the wrong type for any field.
const WRONG_TYPES: &[&str] = &[
    "\"text\"",
    "\"\"",
    "null",
    "true",
    "[]",
    "{}",
    "[1, 2]",
    "{\"a\": 1}",
    "\"1e308\"",
];

/// Text of characters a reader may meet in a damaged file.
const ODD_TEXT: &[&str] = &[
    "\u{feff}", "\0", "\r\n", "\t", "\u{fffd}", "\u{202e}", "é", "\"", "\\", ",", ":", "#", "{",
    "}", "[", "]", "=",
];

/// One damaged copy of `valid`: one to three mutations, bytes kept valid UTF-8 where the reader
/// takes text (`text`), any bytes otherwise.
pub fn mutate(rng: &mut ChaCha8Rng, valid: &[u8], text: bool) -> Vec<u8> {
    let mut out = valid.to_vec();
    for _ in 0..rng.random_range(1..=3) {
        out = mutate_once(rng, out);
    }
    if text {
        String::from_utf8_lossy(&out).into_owned().into_bytes()
    } else {
        out
    }
}

/// A random position in `0..=len`.
fn pos(rng: &mut ChaCha8Rng, len: usize) -> usize {
    rng.random_range(0..=len)
}

/// A random range of `v`, at most `max` long.
fn span(rng: &mut ChaCha8Rng, len: usize, max: usize) -> std::ops::Range<usize> {
    let a = pos(rng, len);
    let b = (a + rng.random_range(0..=max)).min(len);
    a..b
}

/// The byte ranges of the numbers in `v` (digit runs with sign, point and exponent).
fn numbers(v: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        if v[i].is_ascii_digit() {
            let mut a = i;
            if a > 0 && v[a - 1] == b'-' {
                a -= 1;
            }
            while i < v.len() && (v[i].is_ascii_digit() || b".eE+-".contains(&v[i])) {
                i += 1;
            }
            out.push(a..i);
        } else {
            i += 1;
        }
    }
    out
}

/// The byte ranges of the values after a `:` or `=` (a JSON or TOML field's value, up to the next
/// `,`, newline or closing bracket).
fn values(v: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    for (i, &c) in v.iter().enumerate() {
        if c == b':' || c == b'=' {
            // At most 200 bytes: a value is short, and a scan to the end from every `:` of a
            // deeply nested text would take quadratic time.
            let a = i + 1;
            let window = &v[a..v.len().min(a + 200)];
            let len = window
                .iter()
                .position(|&c| b",\n}]".contains(&c))
                .unwrap_or(window.len());
            out.push(a..a + len);
        }
    }
    out
}

/// The lines of `v`, as byte ranges without their newline.
fn lines(v: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut a = 0;
    for (i, &c) in v.iter().enumerate() {
        if c == b'\n' {
            out.push(a..i);
            a = i + 1;
        }
    }
    out.push(a..v.len());
    out
}

/// `v` with `r` replaced by `with`.
fn splice(mut v: Vec<u8>, r: std::ops::Range<usize>, with: &[u8]) -> Vec<u8> {
    v.splice(r, with.iter().copied());
    v
}

/// A random element of `from`.
fn pick<'a, T>(rng: &mut ChaCha8Rng, from: &'a [T]) -> Option<&'a T> {
    (!from.is_empty()).then(|| &from[rng.random_range(0..from.len())])
}

fn mutate_once(rng: &mut ChaCha8Rng, v: Vec<u8>) -> Vec<u8> {
    let len = v.len();
    match rng.random_range(0..16) {
        // A flipped bit.
        0 if len > 0 => {
            let mut v = v;
            let i = rng.random_range(0..len);
            v[i] ^= 1 << rng.random_range(0..8);
            v
        }
        // A random byte.
        1 if len > 0 => {
            let mut v = v;
            let i = rng.random_range(0..len);
            v[i] = rng.random();
            v
        }
        // Truncated.
        2 => {
            let at = pos(rng, len);
            v[..at].to_vec()
        }
        // A run duplicated in place.
        3 => {
            let r = span(rng, len, 64);
            let copy = v[r.clone()].to_vec();
            splice(v, r.end..r.end, &copy)
        }
        // A run deleted.
        4 => {
            let r = span(rng, len, 32);
            splice(v, r, b"")
        }
        // A number made extreme.
        5 | 6 => {
            let n = numbers(&v);
            match (pick(rng, &n).cloned(), pick(rng, EXTREMES)) {
                (Some(r), Some(x)) => splice(v, r, x.as_bytes()),
                _ => v,
            }
        }
        // A value of the wrong type.
        7 => {
            let n = values(&v);
            match (pick(rng, &n).cloned(), pick(rng, WRONG_TYPES)) {
                (Some(r), Some(x)) => splice(v, r, format!(" {x}").as_bytes()),
                _ => v,
            }
        }
        // A line (a key, a row) missing, doubled or swapped with another.
        8 => {
            let l = lines(&v);
            match pick(rng, &l).cloned() {
                Some(r) => {
                    let end = (r.end + 1).min(len);
                    match rng.random_range(0..3) {
                        0 => splice(v, r.start..end, b""),
                        1 => {
                            let copy = v[r.start..end].to_vec();
                            let copy = if copy.ends_with(b"\n") {
                                copy
                            } else {
                                [&b"\n"[..], &copy].concat()
                            };
                            splice(v, end..end, &copy)
                        }
                        _ => {
                            let other = pick(rng, &l).cloned().unwrap_or(r.clone());
                            let (a, b) = if other.start < r.start {
                                (other, r)
                            } else {
                                (r, other)
                            };
                            if a.end > b.start {
                                return v;
                            }
                            let (ta, tb) = (v[a.clone()].to_vec(), v[b.clone()].to_vec());
                            let v = splice(v, b, &ta);
                            splice(v, a, &tb)
                        }
                    }
                }
                None => v,
            }
        }
        // An extra key after an opening brace (JSON) or an extra line (TOML, CSV, text).
        9 => match v.iter().position(|&c| c == b'{') {
            Some(i) => splice(v, i + 1..i + 1, b"\"extra\": 1, "),
            None => {
                let at = lines(&v).first().map_or(0, |r| r.end);
                splice(v, at..at, b"\nextra = 1\n")
            }
        },
        // Deep nesting.
        10 => {
            let depth = rng.random_range(100..20_000);
            let open = if rng.random() { "[" } else { "{\"a\":" };
            let mut w = open.repeat(depth).into_bytes();
            w.extend_from_slice(&v);
            w
        }
        // A byte-order mark (sometimes two).
        11 => {
            let bom = "\u{feff}".repeat(rng.random_range(1..=2));
            [bom.as_bytes(), &v].concat()
        }
        // A long token: a huge number, a huge name, a long run of one character.
        12 => {
            let n = rng.random_range(1_000..200_000);
            let token = match rng.random_range(0..3) {
                0 => "9".repeat(n),
                1 => "x".repeat(n),
                _ => format!("\"{}\"", "a".repeat(n)),
            };
            let r = pick(rng, &numbers(&v)).cloned().unwrap_or(len..len);
            splice(v, r, token.as_bytes())
        }
        // Odd characters somewhere.
        13 => {
            let at = pos(rng, len);
            let s = pick(rng, ODD_TEXT).copied().unwrap_or("");
            splice(v, at..at, s.as_bytes())
        }
        // Windows line ends.
        14 => String::from_utf8_lossy(&v)
            .replace('\n', "\r\n")
            .into_bytes(),
        // Empty or blank.
        _ => match rng.random_range(0..3) {
            0 => Vec::new(),
            1 => b"   \n\n".to_vec(),
            _ => b"\xef\xbb\xbf".to_vec(),
        },
    }
}
