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

use crate::schedule::{Action, Item};

/// Where a timeline came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// From the simulator.
    Predicted,
    /// From the runtime's clocks.
    Measured,
}

/// One item executed on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// The rank that ran it.
    pub rank: usize,
    /// Position of the item in the rank's list.
    pub index: usize,
    /// What ran.
    #[serde(with = "as_text")]
    pub item: Item,
    /// Start time.
    pub start: f64,
    /// End time.
    pub end: f64,
}

/// A transfer of an activation or gradient between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Transfer {
    /// Sending rank.
    pub from_rank: usize,
    /// Receiving rank.
    pub to_rank: usize,
    /// The action whose output is sent.
    #[serde(with = "as_text")]
    pub producer: Action,
    /// The action that waits for it.
    #[serde(with = "as_text")]
    pub consumer: Action,
    /// When the send starts (the producer's end).
    pub start: f64,
    /// When the data has arrived.
    pub end: f64,
    /// Bytes moved.
    pub bytes: f64,
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

    /// Appends an item run on `rank` from `start` to `end`; its `index` is its position in the lane.
    /// Panics if `rank >= self.ranks()` (a programming error, not input).
    pub fn push(&mut self, rank: usize, item: Item, start: f64, end: f64) {
        let lane = &mut self.spans[rank];
        let index = lane.len();
        lane.push(Span {
            rank,
            index,
            item,
            start,
            end,
        });
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

    /// End of the last item on any rank (the step time); timelines start at 0.
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

/// `serde` through a type's text form (`Display` out, `FromStr` in): how actions and items are
/// written in timelines and step reports, the form schedule files use.
pub(crate) mod as_text {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{de, Deserialize, Deserializer, Serializer};

    /// Writes `value` as its text form.
    pub fn serialize<T: Display, Ser: Serializer>(
        value: &T,
        s: Ser,
    ) -> Result<Ser::Ok, Ser::Error> {
        s.collect_str(value)
    }

    /// Reads a value from its text form.
    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let text = String::deserialize(d)?;
        text.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Op;

    #[test]
    fn a_timeline_round_trips_through_json_with_actions_as_text() {
        let mut t = Timeline::new("zb", Source::Predicted, 2);
        t.push(0, Action::new(Op::F, 0, 0).into(), 0.0, 1.0);
        let pair = Item::Overlap {
            forward: Action::new(Op::F, 1, 4),
            backward: Action::new(Op::B, 2, 0),
        };
        t.push(1, pair, 1.25, 3.5);
        t.push_transfer(Transfer {
            from_rank: 0,
            to_rank: 1,
            producer: Action::new(Op::F, 0, 0),
            consumer: Action::new(Op::F, 1, 0),
            start: 1.0,
            end: 1.25,
            bytes: 4096.0,
        });
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains(r#""item":"(1F4;2B0)OVERLAP_F_B""#), "{json}");
        assert!(json.contains(r#""producer":"0F0""#), "{json}");
        assert!(json.contains(r#""source":"predicted""#), "{json}");
        let back: Timeline = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn a_bad_action_text_is_refused_with_the_parse_reason() {
        let json = r#"{"name":"x","source":"measured","spans":[[{"rank":0,"index":0,
            "item":"0Q0","start":0.0,"end":1.0}]],"transfers":[]}"#;
        let e = serde_json::from_str::<Timeline>(json)
            .unwrap_err()
            .to_string();
        assert!(e.contains("op letter must be one of F, B, I, W"), "{e}");
    }
}
