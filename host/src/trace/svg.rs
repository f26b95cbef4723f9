//! A self-contained SVG Gantt chart of one or more timelines, stacked on a common time axis.
//!
//! Each timeline is a panel headed by its name, source, makespan and bubble fraction; each rank a lane.
//! Items are boxes coloured by op (an overlapped pair is split: forward colour on top, backward colour
//! below) with the microbatch number inside when it fits and a tooltip (`<title>`) with the action and
//! its times. Idle time inside a panel's makespan is hatched grey, so bubbles stand out. Where a
//! measured rank was ready but not running (descheduled: lost to other work on the machine), dark
//! hatching covers that share of the item's box (at its end) and the time just before it that the
//! rank was woken late ([`Span::descheduled`](crate::timeline::Span::descheduled),
//! [`Span::woken_late`](crate::timeline::Span::woken_late)). On a stage run with recomputation,
//! the start of each `I` or `B` box, the forward run again to rebuild the stash, is hatched white
//! ([`SvgOptions::rebuild_share`], per panel). A time axis with round ticks and gridlines and a legend close
//! the chart. No scripts, fonts or external files.

use std::fmt::Write;

use super::{op_colour, short_label};
use crate::schedule::{Item, Op};
use crate::timeline::{Source, Timeline};

/// Layout options of [`svg_gantt`].
#[derive(Debug, Clone, PartialEq)]
pub struct SvgOptions {
    /// Width of the plotting area in pixels (the time axis).
    pub width: f64,
    /// Height of one rank's lane in pixels.
    pub lane_height: f64,
    /// Title above the chart (none when empty).
    pub title: String,
    /// Time unit of the timelines: `"s"` scales the axis to s, ms or us as fits; anything else is
    /// printed as given.
    pub unit: String,
    /// Per panel (timeline, in the order given) and global stage, the share of each of the stage's
    /// `I` and `B` boxes that is the forward run again before the backward (recomputation:
    /// [`CostModel::rebuild_shares`](crate::cost::CostModel::rebuild_shares)), hatched at the
    /// box's start; 0 (or a panel or stage past the end) for a stage without recomputation.
    pub rebuild_share: Vec<Vec<f64>>,
}

impl Default for SvgOptions {
    fn default() -> Self {
        SvgOptions {
            width: 1100.0,
            lane_height: 22.0,
            title: String::new(),
            unit: "s".into(),
            rebuild_share: Vec::new(),
        }
    }
}

const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 16.0;
const LANE_GAP: f64 = 3.0;
const PANEL_HEAD: f64 = 24.0;
const PANEL_GAP: f64 = 16.0;
const AXIS: f64 = 40.0;
const LEGEND: f64 = 30.0;

/// The SVG document for `timelines`, stacked top to bottom on one time scale.
///
/// ```
/// use pipefill_host::timeline::{Source, Timeline};
/// use pipefill_host::trace::{svg_gantt, SvgOptions};
/// let mut t = Timeline::new("demo", Source::Predicted, 2);
/// t.push(0, "0F0".parse().unwrap(), 0.0, 1.0);
/// t.push(1, "1F0".parse().unwrap(), 1.0, 2.0);
/// let svg = svg_gantt(&[&t], &SvgOptions::default());
/// assert!(svg.starts_with("<svg") && svg.contains(">0</text>") && svg.ends_with("</svg>\n"));
/// ```
pub fn svg_gantt(timelines: &[&Timeline], opts: &SvgOptions) -> String {
    let horizon = timelines.iter().map(|t| t.makespan()).fold(0.0, f64::max);
    let horizon = if horizon > 0.0 { horizon } else { 1.0 };
    let title_h = if opts.title.is_empty() { 0.0 } else { 22.0 };
    let panels_h: f64 = timelines
        .iter()
        .map(|t| panel_height(t, opts) + PANEL_GAP)
        .sum();
    let width = LEFT + opts.width + RIGHT;
    let height = TOP + title_h + panels_h + AXIS + LEGEND;
    let x = |t: f64| LEFT + t / horizon * opts.width;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="11">"##
    );
    s.push_str(concat!(
        r##"<defs><pattern id="idle" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">"##,
        r##"<rect width="6" height="6" fill="#f2f2f2"/><line x1="0" y1="0" x2="0" y2="6" stroke="#c8c8c8" stroke-width="2"/></pattern>"##,
        r##"<pattern id="lost" width="5" height="5" patternUnits="userSpaceOnUse" patternTransform="rotate(-45)">"##,
        r##"<line x1="0" y1="0" x2="0" y2="5" stroke="#202020" stroke-width="2" stroke-opacity="0.7"/></pattern>"##,
        r##"<pattern id="rebuild" width="4" height="4" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">"##,
        r##"<line x1="0" y1="0" x2="0" y2="4" stroke="white" stroke-width="1.5" stroke-opacity="0.8"/></pattern></defs>"##,
        "\n",
        r##"<rect width="100%" height="100%" fill="white"/>"##,
        "\n"
    ));
    let mut y = TOP;
    if !opts.title.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"##,
            y + 12.0,
            esc(&opts.title)
        );
        y += title_h;
    }
    let grid_top = y;
    let ticks = nice_ticks(horizon, 10);
    let (scale, unit) = axis_unit(horizon, &opts.unit);
    let axis_y = grid_top + panels_h - PANEL_GAP / 2.0;
    // Gridlines first, so boxes are drawn over them.
    for &tk in &ticks {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.2}" y1="{grid_top:.1}" x2="{0:.2}" y2="{axis_y:.1}" stroke="#000" stroke-opacity="0.12"/>"##,
            x(tk)
        );
    }
    for (i, t) in timelines.iter().enumerate() {
        let shares = opts.rebuild_share.get(i).map_or(&[][..], Vec::as_slice);
        y = panel(&mut s, t, y, &x, opts, shares) + PANEL_GAP;
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{axis_y:.1}" x2="{:.2}" y2="{axis_y:.1}" stroke="#333"/>"##,
        x(horizon)
    );
    for &tk in &ticks {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.2}" y1="{axis_y:.1}" x2="{0:.2}" y2="{1:.1}" stroke="#333"/><text x="{0:.2}" y="{2:.1}" text-anchor="middle">{3}</text>"##,
            x(tk),
            axis_y + 5.0,
            axis_y + 17.0,
            fmt_num(tk * scale)
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#333">time ({})</text>"##,
        LEFT + opts.width,
        axis_y + 32.0,
        esc(unit)
    );
    let lost = timelines
        .iter()
        .flat_map(|t| t.spans.iter().flatten())
        .any(|sp| sp.descheduled() > 0.0 || sp.woken_late() > 0.0);
    let rebuilt = opts.rebuild_share.iter().flatten().any(|&f| f > 0.0);
    legend(&mut s, axis_y + AXIS, lost, rebuilt);
    s.push_str("</svg>\n");
    s
}

/// Height of one panel (heading and lanes).
fn panel_height(t: &Timeline, opts: &SvgOptions) -> f64 {
    PANEL_HEAD + t.ranks() as f64 * (opts.lane_height + LANE_GAP)
}

/// Draws one timeline's panel from `y` (`shares`: its stages' rebuild shares); returns the `y`
/// below it.
fn panel(
    s: &mut String,
    t: &Timeline,
    y: f64,
    x: &dyn Fn(f64) -> f64,
    opts: &SvgOptions,
    shares: &[f64],
) -> f64 {
    let source = match t.source {
        Source::Predicted => "predicted",
        Source::Measured => "measured",
    };
    let makespan = t.makespan();
    let (scale, unit) = axis_unit(makespan.max(f64::MIN_POSITIVE), &opts.unit);
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="{:.1}" font-size="12"><tspan font-weight="bold">{}</tspan> ({source}): makespan {} {}, bubble {:.1}%</text>"##,
        y + 15.0,
        esc(&t.name),
        fmt_num(makespan * scale),
        esc(unit),
        100.0 * t.bubble_fraction()
    );
    let mut y = y + PANEL_HEAD;
    let h = opts.lane_height;
    let chunks = chunk_count(t);
    for (r, lane) in t.spans.iter().enumerate() {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">rank {r}</text>"##,
            LEFT - 8.0,
            y + h / 2.0 + 4.0
        );
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{y:.1}" width="{:.2}" height="{h:.1}" fill="url(#idle)"/>"##,
            (x(makespan) - LEFT).max(0.0)
        );
        for span in lane {
            let shade = chunk_opacity(&span.item(), t.ranks(), chunks);
            let mut tip = format!(
                "{} on rank {r}: {} to {} {}",
                span.item(),
                fmt_num(span.start * scale),
                fmt_num(span.end * scale),
                unit
            );
            let (inside, before) = (span.descheduled(), span.woken_late());
            if inside > 0.0 || before > 0.0 {
                let _ = write!(
                    tip,
                    "; descheduled {} {unit}, woken late {} {unit} before it",
                    fmt_num(inside * scale),
                    fmt_num(before * scale)
                );
            }
            let share = rebuild_share(&span.item(), shares);
            if share > 0.0 {
                tip.push_str("; starts with its forward run again (recomputation)");
            }
            span_box(
                s,
                &span.item(),
                (x(span.start), x(span.end)),
                y,
                h,
                shade,
                &tip,
            );
            let (x0, x1) = (
                x(span.start),
                x(span.start + share * (span.end - span.start)),
            );
            if x1 - x0 >= 0.05 {
                let _ = writeln!(
                    s,
                    r##"<rect x="{x0:.2}" y="{y:.1}" width="{:.2}" height="{h:.1}" fill="url(#rebuild)"><title>{}</title></rect>"##,
                    x1 - x0,
                    esc(&tip)
                );
            }
            // Ready but not running: the descheduled share at the box's end, the late wake-up
            // just before it.
            let lost = [
                (x(span.end - inside.min(span.end - span.start)), x(span.end)),
                (x(span.start - before), x(span.start)),
            ];
            for (x0, x1) in lost {
                if x1 - x0 >= 0.05 {
                    let _ = writeln!(
                        s,
                        r##"<rect x="{x0:.2}" y="{y:.1}" width="{:.2}" height="{h:.1}" fill="url(#lost)"><title>{}</title></rect>"##,
                        x1 - x0,
                        esc(&tip)
                    );
                }
            }
        }
        y += h + LANE_GAP;
    }
    y
}

/// Draws one span's box from `x0` to `x1` at `y` (height `h`): its op's colour (a pair split in two
/// halves, a transfer or parameter operation grey), a tooltip, and its label when it fits.
fn span_box(
    s: &mut String,
    item: &Item,
    (x0, x1): (f64, f64),
    y: f64,
    h: f64,
    shade: f64,
    tip: &str,
) {
    let w = (x1 - x0).max(0.5);
    let rect = |s: &mut String, colour: &str| {
        let _ = write!(
            s,
            r##"<rect x="{x0:.2}" y="{y:.1}" width="{w:.2}" height="{h:.1}" fill="{}" stroke="white" stroke-width="0.6"><title>{}</title></rect>"##,
            tint(colour, shade),
            esc(tip)
        );
    };
    match *item {
        Item::Comm(_) | Item::Param(_) => rect(s, super::OTHER_COLOUR),
        Item::One(a) => rect(s, op_colour(a.op)),
        Item::Overlap { forward, backward } => {
            let _ = write!(
                s,
                r##"<g><title>{}</title><rect x="{x0:.2}" y="{y:.1}" width="{w:.2}" height="{:.1}" fill="{}"/><rect x="{x0:.2}" y="{:.1}" width="{w:.2}" height="{:.1}" fill="{}"/><rect x="{x0:.2}" y="{y:.1}" width="{w:.2}" height="{h:.1}" fill="none" stroke="white" stroke-width="0.6"/></g>"##,
                esc(tip),
                h / 2.0,
                tint(op_colour(forward.op), shade),
                y + h / 2.0,
                h / 2.0,
                tint(op_colour(backward.op), shade)
            );
        }
    }
    let label = match *item {
        Item::One(a) => a.microbatch.to_string(),
        _ => short_label(item),
    };
    if w >= 6.5 * label.len() as f64 + 3.0 {
        let _ = write!(
            s,
            r##"<text x="{:.2}" y="{:.1}" text-anchor="middle" fill="white" font-size="10">{}</text>"##,
            x0 + w / 2.0,
            y + h / 2.0 + 3.5,
            esc(&label)
        );
    }
    s.push('\n');
}

/// The share of `item`'s box that rebuilds a stash: an `I` or `B` on a stage with a share.
fn rebuild_share(item: &Item, shares: &[f64]) -> f64 {
    match *item {
        Item::One(a) if matches!(a.op, Op::I | Op::B) => {
            shares.get(a.stage).copied().unwrap_or(0.0).clamp(0.0, 1.0)
        }
        _ => 0.0,
    }
}

/// The number of chunks (stages per rank) a timeline shows: `max stage / P + 1`.
fn chunk_count(t: &Timeline) -> usize {
    let p = t.ranks().max(1);
    t.spans
        .iter()
        .flatten()
        .flat_map(|s| s.item().actions())
        .map(|a| a.stage / p + 1)
        .max()
        .unwrap_or(1)
}

/// `#rrggbb` mixed with white: `strength` 1 keeps the colour, 0 gives white.
fn tint(hex: &str, strength: f64) -> String {
    let channel = |i: usize| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("00"), 16).unwrap_or(0);
    let mix = |c: u8| (255.0 - (255.0 - c as f64) * strength).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(channel(1)),
        mix(channel(3)),
        mix(channel(5))
    )
}

/// Later chunks are drawn lighter (chunk `c` of `V`: strength `1 - 0.45 c / (V - 1)`), so the
/// virtual stages of interleaved and V-shape schedules can be told apart.
fn chunk_opacity(item: &Item, ranks: usize, chunks: usize) -> f64 {
    if chunks <= 1 {
        return 1.0;
    }
    let stage = item.actions().next().map_or(0, |a| a.stage);
    let c = (stage / ranks.max(1)).min(chunks - 1);
    1.0 - 0.45 * c as f64 / (chunks - 1) as f64
}

/// The legend: one swatch per op, the pair, idle, and on a second row (`lost`) descheduled and
/// (`rebuilt`) the recomputed forwards.
fn legend(s: &mut String, y: f64, lost: bool, rebuilt: bool) {
    let entries: [(&str, &str); 4] = [
        ("F forward", op_colour(Op::F)),
        ("B full backward", op_colour(Op::B)),
        ("I backward (inputs)", op_colour(Op::I)),
        ("W backward (weights)", op_colour(Op::W)),
    ];
    let mut x = LEFT;
    for (name, colour) in entries {
        let _ = write!(
            s,
            r##"<rect x="{x:.1}" y="{:.1}" width="14" height="12" fill="{colour}"/><text x="{:.1}" y="{:.1}">{name}</text>"##,
            y - 10.0,
            x + 19.0,
            y
        );
        x += 26.0 + 6.5 * name.len() as f64;
    }
    let _ = write!(
        s,
        r##"<rect x="{x:.1}" y="{:.1}" width="14" height="6" fill="{}"/><rect x="{x:.1}" y="{:.1}" width="14" height="6" fill="{}"/><text x="{:.1}" y="{:.1}">overlapped F/B pair</text>"##,
        y - 10.0,
        op_colour(Op::F),
        y - 4.0,
        op_colour(Op::B),
        x + 19.0,
        y
    );
    x += 26.0 + 6.5 * 19.0;
    let _ = writeln!(
        s,
        r##"<rect x="{x:.1}" y="{:.1}" width="14" height="12" fill="url(#idle)" stroke="#bbb"/><text x="{:.1}" y="{:.1}">idle (bubble)</text><text x="{:.1}" y="{:.1}" fill="#555">lighter: later chunk (V &gt; 1)</text>"##,
        y - 10.0,
        x + 19.0,
        y,
        x + 19.0 + 6.5 * 14.0,
        y
    );
    // A second row.
    let mut x = LEFT;
    if lost {
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{:.1}" width="14" height="12" fill="url(#lost)" stroke="#bbb"/><text x="{:.1}" y="{:.1}">descheduled: ready but not running (in an item, or woken late before it)</text>"##,
            y + 6.0,
            x + 19.0,
            y + 16.0
        );
        x += 26.0 + 6.5 * 72.0;
    }
    if rebuilt {
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{:.1}" width="14" height="12" fill="{}"/><rect x="{x:.1}" y="{:.1}" width="14" height="12" fill="url(#rebuild)"/><text x="{:.1}" y="{:.1}">recomputed forward (start of I/B, its share from the costs)</text>"##,
            y + 6.0,
            op_colour(Op::I),
            y + 6.0,
            x + 19.0,
            y + 16.0
        );
    }
}

/// About `target` round tick positions (multiples of 1, 2 or 5 times a power of ten) in `0..=max`.
pub(crate) fn nice_ticks(max: f64, target: usize) -> Vec<f64> {
    if max.is_nan() || max <= 0.0 || max.is_infinite() {
        return vec![0.0];
    }
    let raw = max / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag);
    let n = (max / step + 1e-9).floor() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// For seconds, the scale and unit that keep axis numbers readable; otherwise `unit` as given.
pub(crate) fn axis_unit(horizon: f64, unit: &str) -> (f64, &str) {
    if unit != "s" {
        return (1.0, unit);
    }
    if horizon < 1e-3 {
        (1e6, "us")
    } else if horizon < 1.0 {
        (1e3, "ms")
    } else {
        (1.0, "s")
    }
}

/// A number with at most 4 significant digits and no trailing zeros.
pub(crate) fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits = (4 - 1 - v.abs().log10().floor() as i32).clamp(0, 9) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// XML-escapes text.
fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(
            nice_ticks(10.0, 10),
            (0..=10).map(f64::from).collect::<Vec<_>>()
        );
        assert_eq!(
            nice_ticks(33.0, 10),
            vec![0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0]
        );
        assert_eq!(nice_ticks(0.0, 10), vec![0.0]);
        assert_eq!(fmt_num(0.25), "0.25");
        assert_eq!(fmt_num(1234.5678), "1235");
        assert_eq!(fmt_num(12.0), "12");
    }

    #[test]
    fn panels_stack_on_one_scale() {
        let mut a = Timeline::new("a<b", Source::Predicted, 1);
        a.push(0, "0F0".parse().unwrap(), 0.0, 2.0);
        let mut b = Timeline::new("b", Source::Measured, 2);
        b.push(0, "0F0".parse().unwrap(), 0.0, 1.0);
        b.push(1, "(1F1;1B0)OVERLAP_F_B".parse().unwrap(), 1.0, 2.0);
        let svg = svg_gantt(&[&a, &b], &SvgOptions::default());
        assert!(svg.contains("a&lt;b</tspan> (predicted)"));
        assert!(svg.contains("b</tspan> (measured)"));
        assert_eq!(svg.matches(">rank 0<").count(), 2);
        // Both timelines end at 2: the full-width idle backgrounds have the same width.
        assert_eq!(
            svg.matches(r#"width="1100.00" height="22.0" fill="url(#idle)""#)
                .count(),
            3
        );
        assert!(svg.contains("F1/B0"));
        assert!(
            !svg.contains(r#"fill="url(#lost)""#),
            "nothing was descheduled"
        );
    }

    #[test]
    fn the_rebuild_starts_each_backward_of_a_recomputing_stage() {
        let mut t = Timeline::new("p", Source::Predicted, 2);
        t.push(0, "0I0".parse().unwrap(), 0.0, 2.0);
        t.push(1, "1B0".parse().unwrap(), 0.0, 4.0);
        t.push(1, "1F1".parse().unwrap(), 4.0, 5.0);
        // Stage 0 does not recompute; stage 1 spends a quarter of each backward rebuilding.
        let opts = SvgOptions {
            rebuild_share: vec![vec![0.0, 0.25]],
            ..SvgOptions::default()
        };
        let svg = svg_gantt(&[&t], &opts);
        // 1 s of 1B0 on a 5 s axis of 1100 px: 220 px from its start.
        assert!(
            svg.contains(r#"x="90.00" y="65.0" width="220.00" height="22.0" fill="url(#rebuild)""#),
            "{svg}"
        );
        assert_eq!(svg.matches(r#"fill="url(#rebuild)">"#).count(), 1);
        assert!(svg.contains("recomputed forward"));
        let plain = svg_gantt(&[&t], &SvgOptions::default());
        assert!(
            !plain.contains(r#"fill="url(#rebuild)">"#) && !plain.contains("recomputed forward")
        );
    }

    #[test]
    fn descheduled_time_is_hatched_in_the_box_and_before_it() {
        use crate::timeline::Span;
        let mut t = Timeline::new("m", Source::Measured, 1);
        // 1 s of the 2 s forward descheduled, woken 0.5 s late before it: on a 4 s axis of
        // 1100 px, boxes of 275 px and 137.5 px.
        let f0 = "0F0".parse().unwrap();
        t.spans[0].push(Span::new(f0, 1.0, 3.0).with_lost(1.0, 0.5));
        t.push(0, "0F1".parse().unwrap(), 3.0, 4.0);
        let svg = svg_gantt(&[&t], &SvgOptions::default());
        assert!(
            svg.contains(r#"x="640.00" y="40.0" width="275.00" height="22.0" fill="url(#lost)""#),
            "{svg}"
        );
        assert!(
            svg.contains(r#"x="227.50" y="40.0" width="137.50" height="22.0" fill="url(#lost)""#),
            "{svg}"
        );
        assert_eq!(svg.matches(r#"fill="url(#lost)">"#).count(), 2);
        assert!(svg.contains("descheduled 1 s, woken late 0.5 s before it"));
        assert!(svg.contains("descheduled: ready but not running"));
    }
}
