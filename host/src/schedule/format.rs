//! Schedule file formats: JSON (canonical), CSV (PyTorch pipelining's compute-only CSV), text grid.
//!
//! - **JSON** ([`to_json`], [`from_json`]), the canonical file:
//!   `{"name", "ranks", "chunks", "microbatches", "placement", "actions": [["0F0", ...], ...]}`, one
//!   list of action strings per rank (`{stage}{op}{microbatch}`, `({f};{b})OVERLAP_F_B` for a pair).
//!   Unknown fields are refused (they are usually typos).
//! - **CSV** ([`to_csv`], [`from_csv`]), as PyTorch pipelining's `_dump_csv` / `_load_csv`, in both of
//!   its forms: `format="compute_only"` (compute actions, and the `REDUCE_GRAD` PyTorch writes after a
//!   stage's last backward) and `format="compute_comms"` (also `SEND_F` / `RECV_F` / `SEND_B` /
//!   `RECV_B` and FSDP's `UNSHARD` / `RESHARD`, as its lowering writes them). One row per rank, one
//!   action per cell, no header. Empty cells (PyTorch's idle steps) are skipped when reading. `P` is the number of rows; `M`, `V` and the placement are
//!   inferred (`M` = largest microbatch + 1, `V` = number of stages / `P`, `looped` if every action
//!   sits on `stage % P`, else `vshape`; with `P = 1` both placements are the same map and reading
//!   gives `looped`). CSV -> schedule -> CSV is lossless; schedule -> CSV -> schedule keeps everything
//!   but the name (CSV has none; the reader is given one) and, for `P = 1`, the placement label.
//! - **Text grid** ([`to_text`], [`from_text`]) for the terminal: a `#` header line with the name,
//!   `P`, `V`, `M` and placement, then one row per rank, one column per time slot. When the schedule
//!   validates, an item's column is its start slot in the unit-time dry run (every item takes one slot
//!   and starts once its rank is free and its dependencies finished), so idle slots (`.`) show the
//!   bubbles; otherwise columns are list positions.
//!
//! Each format reads back what it writes: JSON -> schedule -> JSON and CSV -> schedule -> CSV give the
//! same text (for canonical input), and every schedule survives a write and a read unchanged. Every
//! read error names the field, row or cell, and the fix.
//!
//! ```
//! use pipefill_host::schedule::{families, format, Params};
//! # fn main() -> Result<(), pipefill_host::schedule::ScheduleError> {
//! let s = families::generate("1f1b", &Params::new(2, 2))?;
//! assert_eq!(format::to_csv(&s), "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
//! assert_eq!(format::from_csv(&format::to_csv(&s), "1f1b")?, s);
//! assert_eq!(format::from_json(&format::to_json(&s))?, s);
//! assert_eq!(format::from_text(&format::to_text(&s))?, s);
//! # Ok(())
//! # }
//! ```

use std::ops::Range;
use std::str::FromStr;

use serde::Deserialize;

use super::validate::validate;
use super::{Item, Placement, Schedule, ScheduleError};

/// A file format on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The terminal grid.
    Text,
    /// Canonical JSON.
    Json,
    /// PyTorch pipelining's CSV (compute-only, or compute+comms with transfers).
    Csv,
}

impl FromStr for Format {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            "csv" => Ok(Format::Csv),
            other => Err(ScheduleError::Format(format!(
                "unknown format `{other}`: use text, json or csv"
            ))),
        }
    }
}

/// Writes `s` in `format`.
pub fn write(s: &Schedule, format: Format) -> String {
    match format {
        Format::Text => to_text(s),
        Format::Json => to_json(s),
        Format::Csv => to_csv(s),
    }
}

/// Writes `s` in `format` to `out`; the text grid row by row ([`TextGrid::write`]).
pub fn write_to(s: &Schedule, format: Format, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    match format {
        Format::Text => TextGrid::new(s).write(out),
        other => out.write_all(write(s, other).as_bytes()),
    }
}

/// Reads a schedule file of any of the three formats: JSON if the first non-blank character is `{`,
/// a text grid if it is `#`, CSV otherwise. `name` names a CSV schedule (CSV has no name field).
pub fn read(text: &str, name: &str) -> Result<Schedule, ScheduleError> {
    let text = crate::input::without_bom(text);
    match text.trim_start().chars().next() {
        Some('{') => from_json(text),
        Some('#') => from_text(text),
        _ => from_csv(text, name),
    }
}

/// The canonical JSON form: fields in schema order, one line per rank list.
pub fn to_json(s: &Schedule) -> String {
    let quote = |t: &str| serde_json::Value::String(t.to_string()).to_string();
    let rows: Vec<String> = s
        .actions
        .iter()
        .map(|list| {
            let cells: Vec<String> = list.iter().map(|it| quote(&it.to_string())).collect();
            format!("    [{}]", cells.join(", "))
        })
        .collect();
    format!(
        "{{\n  \"name\": {},\n  \"ranks\": {},\n  \"chunks\": {},\n  \"microbatches\": {},\n  \
         \"placement\": {},\n  \"actions\": [\n{}\n  ]\n}}\n",
        quote(&s.name),
        s.ranks,
        s.chunks,
        s.microbatches,
        quote(s.placement.name()),
        rows.join(",\n")
    )
}

/// The JSON file as written on disk.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonFile {
    name: String,
    ranks: usize,
    chunks: usize,
    microbatches: usize,
    placement: String,
    actions: Vec<Vec<String>>,
    /// What the automatic scheduler found (`auto::SolverInfo`); optional, not needed to
    /// run the schedule.
    #[serde(default)]
    #[allow(dead_code)]
    solver: Option<serde_json::Value>,
}

/// Reads the canonical JSON form.
pub fn from_json(text: &str) -> Result<Schedule, ScheduleError> {
    let text = crate::input::without_bom(text);
    let f: JsonFile = serde_json::from_str(text).map_err(|e| {
        ScheduleError::Format(format!(
            "schedule JSON: {}; expected {{\"name\", \"ranks\", \"chunks\", \"microbatches\", \
             \"placement\", \"actions\": [[\"0F0\", ...], ...]}}",
            crate::input::json_error(&e)
        ))
    })?;
    for (field, v) in [
        ("ranks", f.ranks),
        ("chunks", f.chunks),
        ("microbatches", f.microbatches),
    ] {
        if v == 0 {
            return Err(ScheduleError::Format(format!(
                "schedule JSON: field `{field}` is 0; it must be at least 1"
            )));
        }
    }
    let placement: Placement = f.placement.parse().map_err(|_| {
        ScheduleError::Format(format!(
            "schedule JSON: field `placement` is `{}`; use \"looped\" or \"vshape\"",
            f.placement
        ))
    })?;
    if f.actions.len() != f.ranks {
        return Err(ScheduleError::Format(format!(
            "schedule JSON: field `actions` has {} rank lists but `ranks` is {}; give one list per rank",
            f.actions.len(),
            f.ranks
        )));
    }
    let actions = f
        .actions
        .iter()
        .enumerate()
        .map(|(r, list)| {
            list.iter()
                .enumerate()
                .map(|(i, t)| {
                    t.parse::<Item>().map_err(|e| {
                        ScheduleError::Format(format!("schedule JSON: actions[{r}][{i}]: {e}"))
                    })
                })
                .collect()
        })
        .collect::<Result<_, _>>()?;
    Ok(Schedule {
        name: f.name,
        ranks: f.ranks,
        chunks: f.chunks,
        microbatches: f.microbatches,
        placement,
        actions,
    })
}

/// PyTorch pipelining's CSV: one row per rank, one item per cell (compute-only, or compute+comms
/// for a schedule with transfers).
pub fn to_csv(s: &Schedule) -> String {
    s.actions
        .iter()
        .map(|list| {
            let cells: Vec<String> = list.iter().map(Item::to_string).collect();
            cells.join(",") + "\n"
        })
        .collect()
}

/// Reads PyTorch pipelining's CSV in either form (compute-only or compute+comms); `P`, `V`, `M` and the placement are inferred (see the
/// module docs). Trailing blank lines are ignored; a blank line before the last row is a rank with no
/// actions. Cells may be quoted.
pub fn from_csv(text: &str, name: &str) -> Result<Schedule, ScheduleError> {
    let text = crate::input::without_bom(text);
    let lines: Vec<&str> = text.trim_end().lines().collect();
    if lines.is_empty() || lines.iter().all(|l| l.trim().is_empty()) {
        return Err(ScheduleError::Format(
            "schedule CSV is empty: write one row per rank, e.g. `0F0,0B0`".into(),
        ));
    }
    let rows = lines
        .iter()
        .enumerate()
        .map(|(r, line)| {
            line.split(',')
                .enumerate()
                .map(|(c, cell)| (c, cell.trim().trim_matches('"').trim()))
                .filter(|(_, cell)| !cell.is_empty())
                .map(|(c, cell)| {
                    cell.parse::<Item>().map_err(|e| {
                        ScheduleError::Format(format!(
                            "schedule CSV row {} (rank {r}), cell {}: {e}",
                            r + 1,
                            c + 1
                        ))
                    })
                })
                .collect::<Result<Vec<Item>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    infer(name, rows, "schedule CSV")
}

/// Builds a schedule from rank lists alone: `P` = number of lists, `M` and `V` from the largest
/// microbatch and stage, the placement from where the stages sit. `what` names the input in errors.
fn infer(name: &str, actions: Vec<Vec<Item>>, what: &str) -> Result<Schedule, ScheduleError> {
    let ranks = actions.len();
    let items = || actions.iter().flatten();
    let (Some(max_stage), Some(max_mb)) = (
        items().flat_map(Item::stages).max(),
        items().flat_map(Item::microbatches).max(),
    ) else {
        return Err(ScheduleError::Format(format!(
            "{what} holds no actions: write one row per rank, e.g. `0F0,0B0`"
        )));
    };
    let stages = max_stage + 1;
    if stages % ranks != 0 {
        return Err(ScheduleError::Format(format!(
            "{what}: the stages run 0..={max_stage} ({stages} stages), not a multiple of the {ranks} \
             rows (ranks); every rank must hold the same number of stages"
        )));
    }
    let chunks = stages / ranks;
    let fits = |pl: Placement| {
        actions.iter().enumerate().all(|(r, l)| {
            l.iter()
                .flat_map(Item::stages)
                .all(|stage| pl.rank_of(stage, ranks) == r)
        })
    };
    let placement = if fits(Placement::Looped) || chunks != 2 || !fits(Placement::Vshape) {
        Placement::Looped
    } else {
        Placement::Vshape
    };
    Ok(Schedule {
        name: name.to_string(),
        ranks,
        chunks,
        microbatches: max_mb + 1,
        placement,
        actions,
    })
}

/// How many list positions on each side of a marked item [`context_grid`] shows.
const CONTEXT_COLUMNS: usize = 5;
/// How many ranks above and below a marked item [`context_grid`] shows when `P` is large.
const CONTEXT_RANKS: usize = 3;

/// Draws the rank lists around the marked `(rank, position)` cells, marked cells in brackets.
/// Columns are list positions; used by validation errors to show where a problem sits.
pub(crate) fn context_grid(s: &Schedule, marks: &[(usize, usize)]) -> String {
    let lo = marks.iter().map(|m| m.1).min().unwrap_or(0);
    let hi = marks.iter().map(|m| m.1).max().unwrap_or(0);
    let start = lo.saturating_sub(CONTEXT_COLUMNS);
    let end = (hi + CONTEXT_COLUMNS + 1).min(start + 4 * CONTEXT_COLUMNS + 1);
    let near = |r: usize| {
        s.ranks <= 2 * CONTEXT_RANKS + 2
            || marks
                .iter()
                .any(|m| r + CONTEXT_RANKS >= m.0 && r <= m.0 + CONTEXT_RANKS)
    };
    let rows: Vec<usize> = (0..s.actions.len()).filter(|&r| near(r)).collect();
    let cell = |r: usize, col: usize| match s.actions[r].get(col) {
        Some(it) => Some((it.to_string(), marks.contains(&(r, col)))),
        None => Some((String::new(), false)),
    };
    render(&rows, start..end, "position", cell)
}

/// The terminal grid: a `#` header line, then one row per rank, one column per time slot (see the
/// module docs). Read back by [`from_text`]. The text of [`TextGrid::write`].
pub fn to_text(s: &Schedule) -> String {
    let mut out = Vec::new();
    // Writing into a `Vec` cannot fail, and every cell is UTF-8.
    let _ = TextGrid::new(s).write(&mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// The terminal grid of [`to_text`], laid out but not drawn: its size is known
/// ([`TextGrid::bytes`]) before it is written one rank's row at a time ([`TextGrid::write`]), so
/// memory grows with the schedule's actions and one row, not with ranks x slots.
#[derive(Debug)]
pub struct TextGrid<'a> {
    s: &'a Schedule,
    /// Per rank, each item's column.
    columns: Vec<Vec<usize>>,
    /// Columns (time slots).
    width: usize,
    /// Characters per cell.
    cell: usize,
    /// Characters of the `rank N` label.
    label_width: usize,
}

impl<'a> TextGrid<'a> {
    /// Lays out `s`: columns are unit-time start slots when it validates, list positions otherwise.
    pub fn new(s: &'a Schedule) -> Self {
        let columns: Vec<Vec<usize>> = match validate(s) {
            Ok(report) => report.slots,
            Err(_) => s.actions.iter().map(|l| (0..l.len()).collect()).collect(),
        };
        let width = columns
            .iter()
            .filter_map(|c| c.last())
            .max()
            .map_or(0, |w| w + 1);
        // The widest cell (` 2F0 `) or column number plus 2; at least 3 (an idle ` . `).
        let widest_item = s
            .actions
            .iter()
            .zip(&columns)
            .flat_map(|(list, cols)| list.iter().zip(cols))
            .map(|(it, _)| it.to_string().len() + 2)
            .max();
        let cell = widest_item
            .into_iter()
            .chain((width > 0).then(|| (width - 1).to_string().len() + 2))
            .max()
            .unwrap_or(3);
        let label_width = s
            .actions
            .len()
            .checked_sub(1)
            .map_or(1, |r| r.to_string().len())
            + 6;
        TextGrid {
            s,
            columns,
            width,
            cell,
            label_width,
        }
    }

    /// An upper bound of the grid's bytes: every line at its full width (trailing idle cells are
    /// trimmed when written). Saturates instead of overflowing.
    pub fn bytes(&self) -> u64 {
        let line = (self.width as u64)
            .saturating_mul(self.cell as u64)
            .saturating_add(self.label_width as u64 + 1);
        line.saturating_mul(self.s.actions.len() as u64 + 1)
            .saturating_add(200 + self.s.name.len() as u64)
    }

    /// Writes the grid to `out`, one line at a time.
    pub fn write(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        let (s, width, cell, label_width) = (self.s, self.width, self.cell, self.label_width);
        writeln!(
            out,
            "# name={} ranks={} chunks={} microbatches={} placement={}",
            s.name.replace(char::is_whitespace, "_"),
            s.ranks,
            s.chunks,
            s.microbatches,
            s.placement
        )?;
        let mut line = format!("{:<label_width$}", "slot");
        for c in 0..width {
            line.push_str(&format!("{:^cell$}", c));
        }
        writeln!(out, "{}", line.trim_end())?;
        let mut row: Vec<Option<String>> = vec![None; width];
        for (r, (list, cols)) in s.actions.iter().zip(&self.columns).enumerate() {
            row.iter_mut().for_each(|c| *c = None);
            for (it, &col) in list.iter().zip(cols) {
                row[col] = Some(it.to_string());
            }
            line.clear();
            line.push_str(&format!("{:<label_width$}", format!("rank {r}")));
            for t in &row {
                let t = match t {
                    Some(t) => format!(" {t} "),
                    None => " . ".to_string(),
                };
                line.push_str(&format!("{:^cell$}", t));
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// Reads the terminal grid written by [`to_text`]: rows `rank N` followed by cells, `.` for an idle
/// slot; the `#` header's `key=value` pairs (`name`, `ranks`, `chunks`, `microbatches`, `placement`)
/// are used when present, otherwise inferred as for CSV. Other lines are ignored.
pub fn from_text(text: &str) -> Result<Schedule, ScheduleError> {
    let text = crate::input::without_bom(text);
    let mut header: Vec<(String, String)> = Vec::new();
    let mut actions: Vec<Vec<Item>> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        if let Some(h) = line.trim().strip_prefix('#') {
            for kv in h.split_whitespace() {
                let (k, v) = kv.split_once('=').ok_or_else(|| {
                    ScheduleError::Format(format!(
                        "schedule text line {line_no}: header entry `{}` is not key=value",
                        crate::input::excerpt(kv)
                    ))
                })?;
                header.push((k.to_string(), v.to_string()));
            }
            continue;
        }
        let mut words = line.split_whitespace();
        if words.next() != Some("rank") {
            continue;
        }
        let want = actions.len();
        let label = words.next().unwrap_or("");
        if label.parse::<usize>().ok() != Some(want) {
            return Err(ScheduleError::Format(format!(
                "schedule text line {line_no}: expected the row `rank {want}`, found `rank {label}`; \
                 list ranks in order from 0"
            )));
        }
        let row = words
            .filter(|w| *w != ".")
            .map(|w| w.trim_start_matches('[').trim_end_matches(']'))
            .map(|w| {
                w.parse::<Item>().map_err(|e| {
                    ScheduleError::Format(format!(
                        "schedule text line {line_no} (rank {want}): {e}"
                    ))
                })
            })
            .collect::<Result<Vec<Item>, _>>()?;
        actions.push(row);
    }
    if actions.is_empty() {
        return Err(ScheduleError::Format(
            "schedule text has no `rank N` rows; write one row per rank, e.g. `rank 0  0F0 0B0`"
                .into(),
        ));
    }
    let mut s = infer("text", actions, "schedule text")?;
    apply_header(&mut s, &header)?;
    Ok(s)
}

/// Applies the `#` header of a text grid over the inferred values.
fn apply_header(s: &mut Schedule, header: &[(String, String)]) -> Result<(), ScheduleError> {
    for (k, v) in header {
        // Errors quote what the user wrote, shortened.
        let (qk, qv) = (crate::input::excerpt(k), crate::input::excerpt(v));
        let number = || {
            v.parse::<usize>().map_err(|_| {
                ScheduleError::Format(format!(
                    "schedule text header: `{qk}={qv}` needs a whole number"
                ))
            })
        };
        match k.as_str() {
            "name" => s.name = v.clone(),
            "ranks" if number()? != s.ranks => {
                return Err(ScheduleError::Format(format!(
                    "schedule text header says ranks={qv} but there are {} `rank` rows",
                    s.ranks
                )))
            }
            "ranks" => {}
            "chunks" => s.chunks = number()?,
            "microbatches" => s.microbatches = number()?,
            "placement" => {
                s.placement = v.parse().map_err(|_| {
                    ScheduleError::Format(format!(
                        "schedule text header: `placement={qv}`: use looped or vshape"
                    ))
                })?
            }
            _ => {
                return Err(ScheduleError::Format(format!(
                    "schedule text header: unknown key `{qk}`; use name, ranks, chunks, \
                     microbatches, placement"
                )))
            }
        }
    }
    Ok(())
}

/// Renders a grid: one row per rank in `rows`, one column per index in `cols`; `cell` gives the text
/// of a cell and whether it is marked (drawn in brackets), or `None` for an empty cell (`.`).
fn render(
    rows: &[usize],
    cols: Range<usize>,
    axis: &str,
    cell: impl Fn(usize, usize) -> Option<(String, bool)>,
) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|&r| {
            cols.clone()
                .map(|c| match cell(r, c) {
                    Some((t, true)) => format!("[{t}]"),
                    Some((t, false)) => format!(" {t} "),
                    None => " . ".to_string(),
                })
                .collect()
        })
        .collect();
    let width = cells
        .iter()
        .flatten()
        .map(String::len)
        .chain(cols.clone().map(|c| c.to_string().len() + 2))
        .max()
        .unwrap_or(3);
    let label_width = rows.last().map_or(1, |r| r.to_string().len()) + 6;
    let mut out = format!("{:<label_width$}", axis);
    for c in cols.clone() {
        out.push_str(&format!("{:^width$}", c));
    }
    let mut prev: Option<usize> = None;
    for (row, &r) in cells.iter().zip(rows) {
        if prev.is_some_and(|p| p + 1 != r) {
            out.push_str("\n...");
        }
        prev = Some(r);
        out.push('\n');
        out.push_str(&format!("{:<label_width$}", format!("rank {r}")));
        for t in row {
            out.push_str(&format!("{:^width$}", t));
        }
    }
    let trimmed: Vec<&str> = out.lines().map(str::trim_end).collect();
    trimmed.join("\n")
}
