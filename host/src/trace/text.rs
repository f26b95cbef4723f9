//! A compact text Gantt chart for the terminal.
//!
//! One row per rank, each character a fixed slice of time (`1 cell = q`). An item fills its cells with
//! its op letter and microbatch, then `-` (`F12--`), or just the letter when it is too short (`*` for an
//! overlapped pair); idle cells inside the makespan are `.`. The slice is chosen so the shortest item
//! gets room for its label when the chart fits in `width` columns; longer schedules are scaled down
//! (short items may then vanish: use the SVG for those).

use std::fmt::Write;

use super::short_label;
use super::svg::{axis_unit, fmt_num};
use crate::schedule::Item;
use crate::timeline::Timeline;

/// The text chart of `timelines` (one block each, on one time scale), at most `width` cells wide.
/// `unit` is the timelines' time unit: `"s"` shows times in s, ms or us as fits; anything else
/// (`"units"` for abstract costs) is shown as given.
///
/// ```
/// use pipefill_host::timeline::{Source, Timeline};
/// use pipefill_host::trace::text_gantt;
/// let mut t = Timeline::new("demo", Source::Predicted, 2);
/// t.push(0, "0F0".parse().unwrap(), 0.0, 1.0);
/// t.push(1, "1F0".parse().unwrap(), 1.0, 2.0);
/// let text = text_gantt(&[&t], 80, "s");
/// assert!(text.contains("makespan 2 s"), "{text}");
/// assert!(text_gantt(&[&t], 80, "units").contains("makespan 2 units"));
/// assert!(text.contains("rank 0 |F0..|"), "{text}");
/// assert!(text.contains("rank 1 |..F0|"), "{text}");
/// ```
pub fn text_gantt(timelines: &[&Timeline], width: usize, unit: &str) -> String {
    let width = width.max(8);
    let horizon = timelines.iter().map(|t| t.makespan()).fold(0.0, f64::max);
    let mut out = String::new();
    if horizon <= 0.0 {
        for t in timelines {
            let _ = writeln!(out, "{}: empty timeline", t.name);
        }
        return out;
    }
    let q = cell_time(timelines, horizon, width);
    let cells = ((horizon / q).round() as usize).clamp(1, width);
    let rank_w = timelines
        .iter()
        .map(|t| t.ranks())
        .max()
        .unwrap_or(1)
        .saturating_sub(1)
        .to_string()
        .len();
    let base = unit;
    let (scale, unit) = axis_unit(q, base);
    for t in timelines {
        let _ = writeln!(
            out,
            "{} ({}): makespan {} {base}, bubble {:.1}%   [1 cell = {} {unit}]",
            t.name,
            match t.source {
                crate::timeline::Source::Predicted => "predicted",
                crate::timeline::Source::Measured => "measured",
            },
            fmt_num(t.makespan()),
            100.0 * t.bubble_fraction(),
            fmt_num(q * scale)
        );
        let end_cell = ((t.makespan() / q).round() as usize).min(cells);
        for (r, lane) in t.spans.iter().enumerate() {
            let mut row: Vec<char> = (0..cells)
                .map(|c| if c < end_cell { '.' } else { ' ' })
                .collect();
            for span in lane {
                let c0 = ((span.start / q).round() as usize).min(cells);
                let c1 = ((span.end / q).round() as usize).min(cells);
                if c1 <= c0 {
                    continue;
                }
                let label: Vec<char> = short_label(&span.item()).chars().collect();
                let n = c1 - c0;
                for (i, cell) in row[c0..c1].iter_mut().enumerate() {
                    *cell = if label.len() <= n {
                        label.get(i).copied().unwrap_or('-')
                    } else {
                        match span.item() {
                            Item::One(_) => label[0],
                            _ => '*',
                        }
                    };
                }
            }
            let line: String = row.into_iter().collect();
            let _ = writeln!(out, "rank {r:>rank_w$} |{}|", line.trim_end_matches(' '));
        }
    }
    out
}

/// The time per cell: the shortest item divided by the label length it needs, when the chart then fits
/// in `width`; otherwise coarser, down to `horizon / width`.
fn cell_time(timelines: &[&Timeline], horizon: f64, width: usize) -> f64 {
    let shortest = timelines
        .iter()
        .flat_map(|t| t.spans.iter().flatten())
        .map(|s| s.end - s.start)
        .filter(|d| *d > 0.0)
        .fold(f64::INFINITY, f64::min);
    let label = timelines
        .iter()
        .flat_map(|t| t.spans.iter().flatten())
        .map(|s| short_label(&s.item()).len())
        .filter(|&n| n <= 4)
        .max()
        .unwrap_or(1);
    let coarsest = horizon / width as f64;
    if !shortest.is_finite() {
        return coarsest;
    }
    (1..=label)
        .rev()
        .map(|k| shortest / k as f64)
        .find(|&q| horizon / q <= width as f64 + 1e-9)
        .unwrap_or(coarsest)
}
