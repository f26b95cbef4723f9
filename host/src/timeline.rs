//! Timelines: when every action ran (or is predicted to run) on every rank.
//!
//! The simulator returns a predicted [`Timeline`]; the runtime returns a measured one in the same type,
//! so the same trace, SVG and table code shows both. Times are in seconds (or in the cost model's unit).

use crate::schedule::{Action, Item};

/// Where a timeline came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// From the simulator.
    Predicted,
    /// From the runtime's clocks.
    Measured,
}

/// One item executed on one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    /// The rank that ran it.
    pub rank: usize,
    /// Position of the item in the rank's list.
    pub index: usize,
    /// What ran.
    pub item: Item,
    /// Start time.
    pub start: f64,
    /// End time.
    pub end: f64,
}

/// A transfer of an activation or gradient between two ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transfer {
    /// Sending rank.
    pub from_rank: usize,
    /// Receiving rank.
    pub to_rank: usize,
    /// The action whose output is sent.
    pub producer: Action,
    /// The action that waits for it.
    pub consumer: Action,
    /// When the send starts (the producer's end).
    pub start: f64,
    /// When the data has arrived.
    pub end: f64,
    /// Bytes moved.
    pub bytes: f64,
}

/// Start and end of every item on every rank, plus transfers.
#[derive(Debug, Clone, PartialEq)]
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
