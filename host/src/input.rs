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
