//! Timelines as pictures: Chrome trace JSON (Perfetto, chrome://tracing), a self-contained SVG Gantt
//! chart, and a compact text Gantt for the terminal.
//!
//! All three take [`Timeline`](crate::timeline::Timeline)s, predicted or measured alike, and several at once for comparison
//! (e.g. a measured timeline above the predicted one, or several schedules). Times in a timeline are
//! seconds (or the abstract unit of `--cost` flags); the Chrome trace writes microseconds as its format
//! requires.
//!
//! - [`chrome_trace`]: one process per rank (per timeline), compute on one track and transfers on
//!   communication tracks (as many as needed so transfers never overlap on a track), flow arrows from
//!   each transfer to the item that consumes it, real durations.
//! - [`svg_gantt`]: one panel per timeline on a common time axis, one lane per rank, one colour per op,
//!   microbatch numbers in the boxes, idle time hatched, a legend and a time axis.
//! - [`text_gantt`]: one row per rank, each cell a fixed slice of time, op letter and microbatch.

mod chrome;
mod svg;
mod text;

pub use chrome::{chrome_trace, write_chrome_trace};
pub use svg::{svg_gantt, SvgOptions};
pub use text::text_gantt;

use crate::schedule::{Item, Op};

/// The label of an item in charts: `F3` (op and microbatch) or `F3/B1` for an overlapped pair.
pub fn short_label(item: &Item) -> String {
    match item {
        Item::One(a) => format!("{}{}", a.op, a.microbatch),
        Item::Overlap { forward, backward } => format!(
            "{}{}/{}{}",
            forward.op, forward.microbatch, backward.op, backward.microbatch
        ),
        other => other.to_string(),
    }
}

/// The colour of a transfer or parameter operation (`SEND_*`, `REDUCE_GRAD`, ...) in the SVG chart.
pub const OTHER_COLOUR: &str = "#9d9d9d";

/// The colour of an op in the SVG chart (colour-blind-safe Tableau-like palette).
pub fn op_colour(op: Op) -> &'static str {
    match op {
        Op::F => "#4c78a8",
        Op::B => "#54a24b",
        Op::I => "#f58518",
        Op::W => "#b279a2",
    }
}
