//! Schedule file formats: JSON (canonical), CSV (PyTorch pipelining compute-only), text grid.

use std::ops::Range;

use super::Schedule;

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
    let cell = |r: usize, col: usize| {
        s.actions[r].get(col).map(|it| {
            let marked = marks.contains(&(r, col));
            (it.to_string(), marked)
        })
    };
    render(&rows, start..end, "position", cell)
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
    let label_width = rows.last().map_or(1, |r| r.to_string().len()) + 5;
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
