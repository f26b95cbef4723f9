//! Chrome trace event JSON (the format Perfetto and chrome://tracing open).
//!
//! Layout: timeline `t`, rank `r` is process `t * 10000 + r` named `{timeline name} ({predicted or
//! measured}) rank r`; thread 0 is `compute` (one complete event `X` per item, named by its text form
//! such as `2F0`, with op, stage and microbatch in `args`); threads 1, 2, ... are `comm 0`, `comm 1`,
//! ...: every transfer leaving the rank is a complete event on the first comm track free at its start
//! (so events on one track never overlap), and a flow arrow (`s` on the transfer, `f` on the consumer's
//! compute event) links it to the item that waits for it. Times are microseconds.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::schedule::{Action, Item};
use crate::timeline::{Source, Span, Timeline, Transfer};

/// Process ids: `timeline * PID_STRIDE + rank`.
const PID_STRIDE: usize = 10_000;

/// Seconds to trace microseconds.
fn us(t: f64) -> f64 {
    t * 1e6
}

/// The Chrome trace JSON of `timelines` (one block of processes per timeline, in order).
///
/// ```
/// use pipefill_host::timeline::{Source, Timeline};
/// use pipefill_host::trace::chrome_trace;
/// let mut t = Timeline::new("demo", Source::Predicted, 1);
/// t.push(0, "0F0".parse().unwrap(), 0.0, 0.001);
/// let json: serde_json::Value = serde_json::from_str(&chrome_trace(&[&t])).unwrap();
/// let events = json["traceEvents"].as_array().unwrap();
/// assert!(events.iter().any(|e| e["ph"] == "X" && e["name"] == "0F0" && e["dur"] == 1000.0));
/// ```
pub fn chrome_trace(timelines: &[&Timeline]) -> String {
    let mut out = Vec::new();
    // Writing into a `Vec` cannot fail; serde_json writes UTF-8.
    let _ = write_chrome_trace(timelines, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// Writes the text of [`chrome_trace`] to `out` one event at a time: memory grows with the
/// timelines' actions (where each one started, for the flow arrows), not with the trace's text.
pub fn write_chrome_trace(
    timelines: &[&Timeline],
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    // `serde_json` writes an object's keys sorted: `displayTimeUnit` before `traceEvents`.
    out.write_all(br#"{"displayTimeUnit":"ms","traceEvents":["#)?;
    let mut first = true;
    let mut emit = |event: Value| -> std::io::Result<()> {
        if !std::mem::take(&mut first) {
            out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *out, &event).map_err(std::io::Error::from)
    };
    for (ti, t) in timelines.iter().enumerate() {
        timeline_events(ti, t, &mut emit)?;
    }
    out.write_all(b"]}")
}

/// Emits the events of one timeline.
fn timeline_events(
    ti: usize,
    t: &Timeline,
    out: &mut dyn FnMut(Value) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let source = match t.source {
        Source::Predicted => "predicted",
        Source::Measured => "measured",
    };
    let pid = |r: usize| ti * PID_STRIDE + r;
    // Where each action ran, to point flow arrows at consumers.
    let mut started: HashMap<Action, (usize, f64)> = HashMap::new();
    for (r, lane) in t.spans.iter().enumerate() {
        out(meta(
            "process_name",
            pid(r),
            0,
            format!("{} ({source}) rank {r}", t.name),
        ))?;
        out(
            json!({"name": "process_sort_index", "ph": "M", "pid": pid(r), "tid": 0,
                        "args": {"sort_index": pid(r)}}),
        )?;
        out(meta("thread_name", pid(r), 0, "compute".to_string()))?;
        for span in lane {
            for a in span.item().actions() {
                started.insert(a, (r, span.start));
            }
            out(json!({
                "name": span.item().to_string(),
                "cat": category(&span.item()),
                "ph": "X",
                "ts": us(span.start),
                "dur": us(span.end - span.start),
                "pid": pid(r),
                "tid": 0,
                "args": span_args(span),
            }))?;
        }
    }
    let lanes = comm_lanes(t);
    let mut named: HashMap<(usize, usize), ()> = HashMap::new();
    for (n, (tr, lane)) in t.transfers.iter().zip(lanes).enumerate() {
        let tid = 1 + lane;
        if named.insert((tr.from_rank(), tid), ()).is_none() {
            out(meta(
                "thread_name",
                pid(tr.from_rank()),
                tid,
                format!("comm {lane}"),
            ))?;
        }
        out(json!({
            "name": format!("{} -> {}", tr.producer(), tr.consumer()),
            "cat": "transfer",
            "ph": "X",
            "ts": us(tr.start),
            "dur": us(tr.end - tr.start),
            "pid": pid(tr.from_rank()),
            "tid": tid,
            "args": {"bytes": tr.bytes, "to_rank": tr.to_rank()},
        }))?;
        if let Some(&(r, start)) = started.get(&tr.consumer()) {
            let id = ti * 100_000_000 + n;
            out(
                json!({"name": "data", "cat": "transfer", "ph": "s", "id": id,
                            "ts": us(tr.start), "pid": pid(tr.from_rank()), "tid": tid}),
            )?;
            out(
                json!({"name": "data", "cat": "transfer", "ph": "f", "bp": "e", "id": id,
                            "ts": us(start), "pid": pid(r), "tid": 0}),
            )?;
        }
    }
    Ok(())
}

/// A metadata event naming a process or thread.
fn meta(kind: &str, pid: usize, tid: usize, name: String) -> Value {
    json!({"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
}

/// The event category: the op letter, or `F+B` for a pair (Perfetto colours by name).
fn category(item: &Item) -> String {
    match item {
        Item::One(a) => a.op.to_string(),
        Item::Overlap { forward, backward } => format!("{}+{}", forward.op, backward.op),
        Item::Comm(c) => c.op.word().to_string(),
        Item::Param(p) => p.op.word().to_string(),
    }
}

/// `args` of a compute event: its item, and the time its rank was ready but not running where
/// measured (`descheduled_us` inside it, `woken_late_us` before it).
fn span_args(span: &Span) -> Value {
    let mut args = item_args(&span.item());
    if span.descheduled() > 0.0 || span.woken_late() > 0.0 {
        args["descheduled_us"] = json!(us(span.descheduled()));
        args["woken_late_us"] = json!(us(span.woken_late()));
    }
    args
}

/// `args` of an item.
fn item_args(item: &Item) -> Value {
    let one =
        |a: &Action| json!({"op": a.op.to_string(), "stage": a.stage, "microbatch": a.microbatch});
    match item {
        Item::One(a) => one(a),
        Item::Overlap { forward, backward } => {
            json!({"forward": one(forward), "backward": one(backward)})
        }
        Item::Comm(c) => json!({"op": c.op.word(), "stage": c.stage, "microbatch": c.microbatch}),
        Item::Param(p) => json!({"op": p.op.word(), "stage": p.stage}),
    }
}

/// For each transfer, a comm track index on its sending rank such that transfers on one track never
/// overlap (greedy first-fit in start order).
fn comm_lanes(t: &Timeline) -> Vec<usize> {
    let mut order: Vec<usize> = (0..t.transfers.len()).collect();
    let key = |i: &usize| {
        let tr: &Transfer = &t.transfers[*i];
        (tr.from_rank(), tr.start)
    };
    order.sort_by(|a, b| {
        let (ra, sa) = key(a);
        let (rb, sb) = key(b);
        ra.cmp(&rb).then(sa.total_cmp(&sb))
    });
    let mut lane_of = vec![0; t.transfers.len()];
    let mut ends: Vec<Vec<f64>> = vec![Vec::new(); t.ranks().max(1)];
    for i in order {
        let tr = &t.transfers[i];
        let Some(busy) = ends.get_mut(tr.from_rank()) else {
            continue;
        };
        let lane = match busy.iter().position(|&end| end <= tr.start) {
            Some(l) => l,
            None => {
                busy.push(0.0);
                busy.len() - 1
            }
        };
        busy[lane] = tr.end;
        lane_of[i] = lane;
    }
    lane_of
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Op;

    fn transfer(from: usize, start: f64, end: f64, k: usize) -> Transfer {
        Transfer::new(
            from,
            from + 1,
            Action::new(Op::F, from, k),
            Action::new(Op::F, from + 1, k),
            start,
            end,
            8.0,
        )
    }

    #[test]
    fn overlapping_transfers_get_separate_tracks() {
        let mut t = Timeline::new("x", Source::Predicted, 2);
        t.push(0, "0F0".parse().unwrap(), 0.0, 1.0);
        t.push(0, "0F1".parse().unwrap(), 1.0, 2.0);
        t.push(1, "1F0".parse().unwrap(), 4.0, 5.0);
        t.push(1, "1F1".parse().unwrap(), 5.0, 6.0);
        t.push_transfer(transfer(0, 1.0, 4.0, 0));
        t.push_transfer(transfer(0, 2.0, 5.0, 1));
        assert_eq!(comm_lanes(&t), vec![0, 1]);
        let v: Value = serde_json::from_str(&chrome_trace(&[&t])).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        let flows_f: Vec<_> = ev.iter().filter(|e| e["ph"] == "f").collect();
        assert_eq!(flows_f.len(), 2);
        assert_eq!(flows_f[1]["ts"], 5e6);
        assert_eq!(flows_f[1]["pid"], 1);
        let x: Vec<_> = ev
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == "transfer")
            .collect();
        assert_eq!(
            (x[0]["tid"].clone(), x[1]["tid"].clone()),
            (json!(1), json!(2))
        );
        assert_eq!(x[0]["dur"], 3e6);
    }
}
