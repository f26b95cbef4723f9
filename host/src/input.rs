//! Text that came from outside (schedule, cost, model and checkpoint files): what every reader does
//! to it before parsing.

/// `text` without a leading UTF-8 byte-order mark. Spreadsheet programs and some editors write one
/// at the start of CSV and JSON files; it is not content, and a parser that sees it reports a
/// misleading error at the first character.
///
/// ```
/// assert_eq!(pipefill_host::input::without_bom("\u{feff}{\"a\": 1}"), "{\"a\": 1}");
/// assert_eq!(pipefill_host::input::without_bom("0F0,1F0"), "0F0,1F0");
/// ```
pub fn without_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// The most characters of a user's token an error message quotes.
pub const EXCERPT_CHARS: usize = 40;

/// `token` as an error quotes it: whole when short, else its first [`EXCERPT_CHARS`] characters and
/// its length, so that a damaged 10 MB cell gives a one-line error, not a 10 MB one.
///
/// ```
/// use pipefill_host::input::excerpt;
/// assert_eq!(excerpt("2X0"), "2X0");
/// let long = "9".repeat(1000);
/// assert_eq!(excerpt(&long), format!("{}... (1000 bytes)", "9".repeat(40)));
/// assert_eq!(excerpt("1\nextra"), "1\\nextra");
/// ```
pub fn excerpt(token: &str) -> String {
    match token.char_indices().nth(EXCERPT_CHARS) {
        None => visible(token),
        Some((end, _)) => format!("{}... ({} bytes)", visible(&token[..end]), token.len()),
    }
}

/// `text` with its control characters (line breaks, tabs, NUL, ...) escaped as `\n`, `\t`,
/// `\u{0}`: a quoted token never breaks the error's line.
fn visible(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped = c.is_control().then(|| c.escape_default());
            let plain = (!c.is_control()).then_some(c);
            escaped.into_iter().flatten().chain(plain)
        })
        .collect()
}

/// The most characters of a parser's message an error keeps (after [`message`] shortened its
/// quoted tokens).
pub const MESSAGE_CHARS: usize = 240;

/// A parser's error message (serde_json, toml, a nested reader's) as one short line: only its
/// first line, long quoted tokens shortened ([`shorten`]), at most [`MESSAGE_CHARS`] characters. A damaged file may hold a 10 MB string or a nested value
/// whose own error spans lines; the user's error stays one line either way.
///
/// ```
/// use pipefill_host::input::message;
/// let long = format!("invalid type: string \"{}\", expected u64", "a".repeat(1000));
/// assert_eq!(
///     message(&long),
///     format!("invalid type: string \"{}... (1000 bytes)\", expected u64", "a".repeat(40))
/// );
/// assert_eq!(message("duplicate `3F1`\nrank 0  2F0 [3F1]"), "duplicate `3F1`");
/// ```
pub fn message(text: &str) -> String {
    let short = shorten(text.lines().next().unwrap_or_default().trim_end());
    match short.char_indices().nth(MESSAGE_CHARS) {
        None => short,
        Some((end, _)) => format!("{}...", &short[..end]),
    }
}

/// `text` with every quoted token (between `"` or `` ` `` characters) longer than twice
/// [`EXCERPT_CHARS`] shortened by [`excerpt`] and control characters escaped, and at most twice
/// [`MESSAGE_CHARS`] characters in all: what an error built around a user's token shows of it.
///
/// ```
/// use pipefill_host::input::shorten;
/// let e = format!("found `rank {}`; list ranks in order", "9".repeat(100));
/// let short = format!("found `rank {}... (105 bytes)`; list ranks in order", "9".repeat(35));
/// assert_eq!(shorten(&e), short);
/// assert_eq!(shorten(&short), short);
/// ```
pub fn shorten(text: &str) -> String {
    // Quoted tokens are the odd pieces between quote characters.
    let short: String = text
        .split_inclusive(['"', '`'])
        .enumerate()
        .map(|(i, piece)| {
            if i % 2 == 0 {
                return piece.to_string();
            }
            let (body, quote) = match piece.char_indices().last() {
                Some((i, c)) if c == '"' || c == '`' => (&piece[..i], &piece[i..]),
                _ => (piece, ""),
            };
            // Up to twice the excerpt's length stays whole, so that shortening twice (a reader's
            // error inside another's) leaves an excerpt as it is.
            match body.chars().nth(2 * EXCERPT_CHARS) {
                Some(_) => format!("{}{quote}", excerpt(body)),
                None => piece.to_string(),
            }
        })
        .map(|piece| visible(&piece))
        .collect();
    // A quote inside a token pairs the quotes wrongly; the length is bounded all the same.
    match short.char_indices().nth(2 * MESSAGE_CHARS) {
        None => short,
        Some((end, _)) => format!("{}... ({} bytes)", &short[..end], text.len()),
    }
}

/// A serde_json error as one short line: [`message`] of its text without serde's position, then
/// `at line L column C`.
pub fn json_error(e: &serde_json::Error) -> String {
    match e.line() {
        0 => json_reason(e),
        line => format!("{} at line {line} column {}", json_reason(e), e.column()),
    }
}

/// [`json_error`] followed by the line of `text` it points at (excerpted), which shows the field:
/// `invalid type: string "x", expected u64 at line 4 column 13 (`"step": "x",`)`.
pub fn json_error_in(text: &str, e: &serde_json::Error) -> String {
    let line = e
        .line()
        .checked_sub(1)
        .and_then(|l| text.lines().nth(l))
        .map(str::trim)
        .filter(|l| !l.is_empty());
    match line {
        Some(l) => format!("{} (`{}`)", json_error(e), excerpt(l)),
        None => json_error(e),
    }
}

/// A serde_json error's reason as one short line ([`message`]), without its position.
pub fn json_reason(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    message(text.strip_suffix(&suffix).unwrap_or(&text))
}

/// Checks that no JSON object in `text` names a key twice (serde_json keeps the last silently);
/// `Err((line, column, key))` at the second occurrence, `Ok` also for text that is not JSON
/// (the caller's parser reports that).
///
/// ```
/// use pipefill_host::input::duplicate_key;
/// assert!(duplicate_key(r#"{"a": 1, "b": {"a": 2}}"#).is_ok());
/// assert_eq!(duplicate_key("{\"a\": 1,\n \"a\": 2}").unwrap_err().2, "a");
/// ```
pub fn duplicate_key(text: &str) -> Result<(), (usize, usize, String)> {
    use serde::de::Deserializer as _;
    let mut de = serde_json::Deserializer::from_str(text);
    match de.deserialize_any(NoDuplicates) {
        Err(e) if e.is_data() => {
            let key = e.to_string();
            let key = key
                .strip_prefix(DUPLICATE)
                .and_then(|k| k.split(" at line").next())
                .unwrap_or_default()
                .to_string();
            Err((e.line(), e.column(), key))
        }
        _ => Ok(()),
    }
}

/// The start of the error [`NoDuplicates`] raises.
const DUPLICATE: &str = "duplicate key ";

/// A visitor that walks any JSON value and fails on a key seen twice in one object.
struct NoDuplicates;

impl<'de> serde::de::Visitor<'de> for NoDuplicates {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Walk)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("{DUPLICATE}{key}")));
            }
            map.next_value_seed(Walk)?;
        }
        Ok(())
    }
}

/// [`NoDuplicates`] as a seed, for nested values.
struct Walk;

impl<'de> serde::de::DeserializeSeed<'de> for Walk {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(NoDuplicates)
    }
}
