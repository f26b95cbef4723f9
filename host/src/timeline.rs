//! Timelines: when every action ran (or is predicted to run) on every rank.
//!
//! The simulator returns a predicted [`Timeline`]; the runtime returns a measured one in the same type,
//! so the same trace, SVG and table code shows both. Times are in seconds (or in the cost model's unit).
//!
//! A timeline is `serde` data: actions and items are written in their text form (`"2F0"`,
//! `"(1F4;2B0)OVERLAP_F_B"`), the source as `"predicted"` or `"measured"`.
//!
//! ```
//! use pipefill_host::schedule::Action;
//! use pipefill_host::timeline::{Source, Timeline};
//! let mut t = Timeline::new("demo", Source::Measured, 1);
//! t.push(0, "0F0".parse::<Action>().unwrap().into(), 0.0, 1.5);
//! let json = serde_json::to_string(&t).unwrap();
//! assert!(json.contains(r#""item":"0F0""#) && json.contains(r#""source":"measured""#));
//! assert_eq!(serde_json::from_str::<Timeline>(&json).unwrap(), t);
//! ```

use serde::{Deserialize, Serialize};

use std::fmt;

use crate::schedule::{Action, Item};
use packed::{narrow, PackedAction, PackedItem};

mod lost;
mod packed;

/// Where a timeline came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// From the simulator.
    Predicted,
    /// From the runtime's clocks.
    Measured,
}

/// One item executed on one rank: `spans[rank][index]` of a [`Timeline`] (the rank and the position
/// are where it sits). Compact (48 bytes): the item is stored packed, read it with [`Span::item`].
/// With serde it reads and writes `{"item": "2F0", "start": .., "end": ..}`, plus `"descheduled"`
/// and `"woken_late"` where they are not 0 (see [`Span::with_lost`]).
#[derive(Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(into = "SpanData", try_from = "SpanData")]
pub struct Span {
    /// Start time.
    pub start: f64,
    /// End time.
    pub end: f64,
    item: PackedItem,
    /// Seconds inside the span the rank's thread was not running (see [`Span::descheduled`]).
    descheduled: f32,
    /// Seconds before the span the rank was ready but not running (see [`Span::woken_late`]).
    woken_late: f32,
}

impl Span {
    /// `item` ran from `start` to `end`.
    ///
    /// Panics if a stage or microbatch of `item` is 2^32 or more (no schedule that validates has
    /// one: a programming error, not input).
    #[inline]
    pub fn new(item: Item, start: f64, end: f64) -> Self {
        Span {
            start,
            end,
            item: PackedItem::new(item),
            descheduled: 0.0,
            woken_late: 0.0,
        }
    }

    /// The span with the time its rank was ready but not running, as the runtime measures it
    /// from the thread's CPU clock: `descheduled` seconds inside the span (its layer calls' wall
    /// time minus the thread's CPU time in them) and `woken_late` seconds just before it (its
    /// input from another rank had been sent while the rank waited for it, but the rank was not
    /// running yet). Both are kept as `f32` (microsecond precision up to minutes).
    #[inline]
    pub fn with_lost(mut self, descheduled: f64, woken_late: f64) -> Self {
        self.descheduled = descheduled as f32;
        self.woken_late = woken_late as f32;
        self
    }

    /// Seconds inside the span the rank's thread was descheduled: part of the span's wall time,
    /// none of its CPU time; 0 where not measured (predicted timelines, GPU streams).
    #[inline]
    pub fn descheduled(&self) -> f64 {
        f64::from(self.descheduled)
    }

    /// Seconds just before the span the rank was ready (its input had been sent) but not yet
    /// running: idle time lost to time-sharing, not to the schedule; 0 where not measured.
    #[inline]
    pub fn woken_late(&self) -> f64 {
        f64::from(self.woken_late)
    }

    /// What ran.
    #[inline]
    pub fn item(&self) -> Item {
        self.item.get()
    }
}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Span")
            .field("item", &self.item())
            .field("start", &self.start)
            .field("end", &self.end)
            .field("descheduled", &self.descheduled)
            .field("woken_late", &self.woken_late)
            .finish()
    }
}

/// A transfer of an activation or gradient between two ranks. Compact (56 bytes): ranks and actions
/// are stored packed, read them with the methods. With serde it reads and writes
/// `{"from_rank", "to_rank", "producer": "0F0", "consumer": "1F0", "start", "end", "bytes"}`.
#[derive(Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(into = "TransferData", try_from = "TransferData")]
pub struct Transfer {
    /// When the send starts (the producer's end).
    pub start: f64,
    /// When the data has arrived.
    pub end: f64,
    /// Bytes moved.
    pub bytes: f64,
    ranks: [u32; 2],
    producer: PackedAction,
    consumer: PackedAction,
}

impl Transfer {
    /// The output of `producer` on `from_rank` moves to `consumer` on `to_rank`, from `start` to `end`.
    ///
    /// Panics if a rank, stage or microbatch is 2^32 or more (a programming error, as for
    /// [`Span::new`]).
    #[inline]
    pub fn new(
        from_rank: usize,
        to_rank: usize,
        producer: Action,
        consumer: Action,
        start: f64,
        end: f64,
        bytes: f64,
    ) -> Self {
        Transfer {
            start,
            end,
            bytes,
            ranks: [narrow(from_rank), narrow(to_rank)],
            producer: PackedAction::new(producer),
            consumer: PackedAction::new(consumer),
        }
    }

    /// Sending rank.
    #[inline]
    pub fn from_rank(&self) -> usize {
        self.ranks[0] as usize
    }

    /// Receiving rank.
    #[inline]
    pub fn to_rank(&self) -> usize {
        self.ranks[1] as usize
    }

    /// The action whose output is sent.
    #[inline]
    pub fn producer(&self) -> Action {
        self.producer.get()
    }

    /// The action that waits for it.
    #[inline]
    pub fn consumer(&self) -> Action {
        self.consumer.get()
    }
}

impl fmt::Debug for Transfer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transfer")
            .field("from_rank", &self.from_rank())
            .field("to_rank", &self.to_rank())
            .field("producer", &self.producer())
            .field("consumer", &self.consumer())
            .field("start", &self.start)
            .field("end", &self.end)
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// Start and end of every item on every rank, plus transfers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Schedule name.
    pub name: String,
    /// Predicted or measured.
    pub source: Source,
    /// `spans[r]`: rank `r`'s items in execution order.
    pub spans: Vec<Vec<Span>>,
    /// Transfers between ranks.
    pub transfers: Vec<Transfer>,
}

impl Timeline {
    /// An empty timeline with `ranks` lanes; fill it with [`Timeline::push`] and
    /// [`Timeline::push_transfer`] (the runtime does this from its clocks, the simulator from its model).
    pub fn new(name: impl Into<String>, source: Source, ranks: usize) -> Self {
        Timeline {
            name: name.into(),
            source,
            spans: vec![Vec::new(); ranks],
            transfers: Vec::new(),
        }
    }

    /// Appends an item run on `rank` from `start` to `end` (its index is its position in the lane).
    /// Panics if `rank >= self.ranks()` or as [`Span::new`] does (programming errors, not input).
    pub fn push(&mut self, rank: usize, item: Item, start: f64, end: f64) {
        self.spans[rank].push(Span::new(item, start, end));
    }

    /// Appends a transfer.
    pub fn push_transfer(&mut self, transfer: Transfer) {
        self.transfers.push(transfer);
    }

    /// Shifts every time so that the earliest start is 0 (measured clocks start anywhere).
    pub fn shift_to_zero(&mut self) {
        let t0 = self
            .spans
            .iter()
            .flatten()
            .map(|s| s.start)
            .chain(self.transfers.iter().map(|t| t.start))
            .fold(f64::INFINITY, f64::min);
        if !t0.is_finite() || t0 == 0.0 {
            return;
        }
        for s in self.spans.iter_mut().flatten() {
            s.start -= t0;
            s.end -= t0;
        }
        for t in &mut self.transfers {
            t.start -= t0;
            t.end -= t0;
        }
    }

    /// Number of spans (items) over all ranks.
    pub fn span_count(&self) -> usize {
        self.spans.iter().map(Vec::len).sum()
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.spans.len()
    }

    /// End of the last item on any rank (the step time); timelines count from 0 (a measured one from
    /// the step's start, so its first item starts a little after 0).
    pub fn makespan(&self) -> f64 {
        self.spans
            .iter()
            .flat_map(|r| r.iter())
            .map(|s| s.end)
            .fold(0.0, f64::max)
    }

    /// Time rank `r` spent computing.
    pub fn busy(&self, r: usize) -> f64 {
        self.spans[r].iter().map(|s| s.end - s.start).sum()
    }

    /// Time rank `r` spent idle within the makespan.
    pub fn idle(&self, r: usize) -> f64 {
        self.makespan() - self.busy(r)
    }

    /// `1 - sum(busy) / (P * makespan)`; 0 for an empty timeline.
    pub fn bubble_fraction(&self) -> f64 {
        let m = self.makespan();
        let p = self.ranks();
        if m <= 0.0 || p == 0 {
            return 0.0;
        }
        let busy: f64 = (0..p).map(|r| self.busy(r)).sum();
        1.0 - busy / (p as f64 * m)
    }

    /// Per-rank bubble: `idle(r) / makespan`.
    pub fn rank_bubble_fraction(&self, r: usize) -> f64 {
        let m = self.makespan();
        if m <= 0.0 {
            0.0
        } else {
            self.idle(r) / m
        }
    }
}

/// A [`Span`] as serde writes it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpanData {
    item: Item,
    start: f64,
    end: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    descheduled: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    woken_late: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl From<Span> for SpanData {
    fn from(s: Span) -> Self {
        SpanData {
            item: s.item(),
            start: s.start,
            end: s.end,
            descheduled: s.descheduled(),
            woken_late: s.woken_late(),
        }
    }
}

impl TryFrom<SpanData> for Span {
    type Error = String;

    fn try_from(d: SpanData) -> Result<Self, String> {
        let too_big = d
            .item
            .stages()
            .chain(d.item.microbatches())
            .any(|n| n > u32::MAX as usize);
        if too_big {
            return Err(format!("span `{}`: stage or microbatch above 2^32", d.item));
        }
        Ok(Span::new(d.item, d.start, d.end).with_lost(d.descheduled, d.woken_late))
    }
}

/// A [`Transfer`] as serde writes it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferData {
    from_rank: usize,
    to_rank: usize,
    producer: Action,
    consumer: Action,
    start: f64,
    end: f64,
    bytes: f64,
}

impl From<Transfer> for TransferData {
    fn from(t: Transfer) -> Self {
        TransferData {
            from_rank: t.from_rank(),
            to_rank: t.to_rank(),
            producer: t.producer(),
            consumer: t.consumer(),
            start: t.start,
            end: t.end,
            bytes: t.bytes,
        }
    }
}

impl TryFrom<TransferData> for Transfer {
    type Error = String;

    fn try_from(d: TransferData) -> Result<Self, String> {
        let numbers = [
            d.from_rank,
            d.to_rank,
            d.producer.stage,
            d.producer.microbatch,
            d.consumer.stage,
            d.consumer.microbatch,
        ];
        if numbers.iter().any(|&n| n > u32::MAX as usize) {
            return Err(format!(
                "transfer `{}` -> `{}`: a rank, stage or microbatch above 2^32",
                d.producer, d.consumer
            ));
        }
        Ok(Transfer::new(
            d.from_rank,
            d.to_rank,
            d.producer,
            d.consumer,
            d.start,
            d.end,
            d.bytes,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Op;

    #[test]
    fn spans_and_transfers_are_compact_and_read_back() {
        assert_eq!(std::mem::size_of::<Span>(), 48);
        assert_eq!(std::mem::size_of::<Transfer>(), 56);
        let item: Item = "(1F4;2B0)OVERLAP_F_B".parse().unwrap();
        let s = Span::new(item, 1.0, 2.5);
        assert_eq!((s.item(), s.start, s.end), (item, 1.0, 2.5));
        let (p, c) = (Action::new(Op::I, 3, 7), Action::new(Op::I, 2, 7));
        let t = Transfer::new(1, 0, p, c, 2.0, 3.0, 64.0);
        assert_eq!(
            (t.from_rank(), t.to_rank(), t.producer(), t.consumer()),
            (1, 0, p, c)
        );
        assert_eq!((t.start, t.end, t.bytes), (2.0, 3.0, 64.0));
    }

    #[test]
    fn a_timeline_round_trips_through_json_with_actions_as_text() {
        let mut t = Timeline::new("zb", Source::Predicted, 2);
        t.push(0, Action::new(Op::F, 0, 0).into(), 0.0, 1.0);
        let pair = Item::Overlap {
            forward: Action::new(Op::F, 1, 4),
            backward: Action::new(Op::B, 2, 0),
        };
        t.push(1, pair, 1.25, 3.5);
        t.push_transfer(Transfer::new(
            0,
            1,
            Action::new(Op::F, 0, 0),
            Action::new(Op::F, 1, 0),
            1.0,
            1.25,
            4096.0,
        ));
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains(r#""item":"(1F4;2B0)OVERLAP_F_B""#), "{json}");
        assert!(json.contains(r#""producer":"0F0""#), "{json}");
        assert!(json.contains(r#""source":"predicted""#), "{json}");
        let back: Timeline = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
        assert!(
            !json.contains("descheduled"),
            "only measured time lost is written: {json}"
        );
    }

    #[test]
    fn a_bad_action_text_is_refused_with_the_parse_reason() {
        let json = r#"{"name":"x","source":"measured","spans":[[{"item":"0Q0",
            "start":0.0,"end":1.0}]],"transfers":[]}"#;
        let e = serde_json::from_str::<Timeline>(json)
            .unwrap_err()
            .to_string();
        assert!(e.contains("op letter must be one of F, B, I, W"), "{e}");
    }
}
