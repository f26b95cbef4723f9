//! Schedules as data.
//!
//! A [`Schedule`] is, for each rank, the ordered list of the [`Item`]s it executes. An item is one
//! [`Action`] (`(op, stage, microbatch)`) or an overlapped forward/backward pair (as in DualPipe).
//! Schedules are produced by generators (one file per family, listed in [`families`]), checked by
//! [`validate`](validate::validate), written and read in the formats of [`format`](mod@format), simulated by
//! [`crate::sim`] and executed by [`crate::runtime`]. Nothing here knows about devices.
//!
//! The text form of an action is PyTorch pipelining's: `{stage}{op}{microbatch}`, e.g. `2F0`, `0I3`,
//! `1W3`; an overlapped pair is `({forward};{backward})OVERLAP_F_B`.
//!
//! ```
//! use pipefill_host::schedule::{Action, Item, Op};
//! let a: Action = "2F0".parse().unwrap();
//! assert_eq!(a, Action::new(Op::F, 2, 0));
//! assert_eq!(a.to_string(), "2F0");
//! let pair: Item = "(1F4;2B0)OVERLAP_F_B".parse().unwrap();
//! assert_eq!(pair.to_string(), "(1F4;2B0)OVERLAP_F_B");
//! ```

use std::ops::RangeInclusive;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

mod action;
mod error;
mod item;
pub use action::{Action, Op};
pub use error::{ScheduleError, Wait};
pub use item::{Comm, CommOp, Item, ParamAction, ParamOp};

pub mod deps;
pub mod families;
pub mod format;
pub mod forward_only;
pub mod lower;
pub mod validate;
pub mod walk;

mod dualpipev;
mod dualpipev_slack;
mod gpipe;
mod interleaved_1f1b;
mod interleaved_zb;
mod looped_bfs;
mod one_f_one_b;
mod v_grid;
mod v_half;
mod v_min;
mod zb_h1;
mod zb_h2;
mod zbv;

/// Which rank holds each stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// `rank = stage % P` (GPipe, 1F1B, interleaved 1F1B, looped BFS, interleaved zero-bubble).
    Looped,
    /// `rank = stage` for `stage < P`, else `2P - 1 - stage` (ZB-V, DualPipeV; `V = 2`).
    Vshape,
}

impl Placement {
    /// The rank that holds `stage` when there are `ranks` ranks.
    pub fn rank_of(self, stage: usize, ranks: usize) -> usize {
        match self {
            Placement::Looped => stage % ranks,
            Placement::Vshape => {
                if stage < ranks {
                    stage
                } else {
                    (2 * ranks).saturating_sub(1 + stage)
                }
            }
        }
    }
}

crate::named_enum!(Placement {
    Looped => "looped",
    Vshape => "vshape",
});

impl FromStr for Placement {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Placement::from_name(s).ok_or_else(|| ScheduleError::ParsePlacement(s.to_string()))
    }
}

/// A pipeline schedule: for each rank, the ordered list of its items.
///
/// `ranks` is `P`, `chunks` is `V` (stages per rank), so there are `S = P * V` stages;
/// `microbatches` is `M`. `actions[r]` is what rank `r` runs, in order.
///
/// With serde it reads and writes the canonical JSON form of [`format`](mod@format) (items as their
/// text form, unknown fields refused):
///
/// ```
/// use pipefill_host::schedule::{families, Params, Schedule};
/// let s = families::generate("1f1b", &Params::new(2, 2)).unwrap();
/// let json = serde_json::to_string(&s).unwrap();
/// assert!(json.contains(r#"["0F0","0F1","0B0","0B1"]"#));
/// assert_eq!(serde_json::from_str::<Schedule>(&json).unwrap(), s);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// Family name (`1f1b`, `zbv`, ...) or a user's name for a hand-written schedule.
    pub name: String,
    /// `P`: number of ranks.
    pub ranks: usize,
    /// `V`: stages per rank.
    pub chunks: usize,
    /// `M`: microbatches per training step.
    pub microbatches: usize,
    /// Stage -> rank map.
    pub placement: Placement,
    /// Per rank, the ordered items.
    pub actions: Vec<Vec<Item>>,
}

impl Schedule {
    /// `S = P * V`: the number of stages.
    pub fn stages(&self) -> usize {
        self.ranks * self.chunks
    }

    /// The rank that holds `stage`.
    pub fn rank_of(&self, stage: usize) -> usize {
        self.placement.rank_of(stage, self.ranks)
    }

    /// A schedule with looped placement (`rank = stage % P`).
    pub fn looped(
        name: &str,
        ranks: usize,
        chunks: usize,
        microbatches: usize,
        actions: Vec<Vec<Item>>,
    ) -> Self {
        Schedule {
            name: name.to_string(),
            ranks,
            chunks,
            microbatches,
            placement: Placement::Looped,
            actions,
        }
    }

    /// Total number of compute actions (an overlapped pair counts two; transfers and parameter
    /// operations count none).
    pub fn action_count(&self) -> usize {
        self.actions
            .iter()
            .flat_map(|r| r.iter())
            .map(|it| it.actions().count())
            .sum()
    }
}

/// What a generator needs to build a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// `P`: ranks.
    pub ranks: usize,
    /// `M`: microbatches.
    pub microbatches: usize,
    /// `V`: stages per rank; `None` takes the family's default.
    pub chunks: Option<usize>,
    /// Interleaved schedules: microbatches per round (Megatron's group size); `None` means `P`.
    pub group_size: Option<usize>,
}

impl Params {
    /// Params with the family's default `V` and group size.
    pub fn new(ranks: usize, microbatches: usize) -> Self {
        Params {
            ranks,
            microbatches,
            chunks: None,
            group_size: None,
        }
    }

    /// Sets `V`.
    pub fn with_chunks(mut self, chunks: usize) -> Self {
        self.chunks = Some(chunks);
        self
    }

    /// Sets the group size of interleaved schedules.
    pub fn with_group_size(mut self, group_size: usize) -> Self {
        self.group_size = Some(group_size);
        self
    }

    /// The checks every generator starts with: `P >= 1`, `M >= 1`, `V` (given, or `default_chunks`)
    /// inside `allowed`, and at most [`MAX_PAIRS`] (stage, microbatch) pairs. Returns `V`.
    ///
    /// ```
    /// use pipefill_host::schedule::Params;
    /// assert_eq!(Params::new(4, 8).checked("x", 2, 2..=usize::MAX), Ok(2));
    /// assert!(Params::new(4, 8).with_chunks(1).checked("x", 2, 2..=usize::MAX).is_err());
    /// assert!(Params::new(0, 8).checked("x", 1, 1..=1).is_err());
    /// ```
    pub fn checked(
        &self,
        family: &str,
        default_chunks: usize,
        allowed: RangeInclusive<usize>,
    ) -> Result<usize, ScheduleError> {
        let refuse = |why: String| Err(ScheduleError::refused(family, why));
        if self.ranks == 0 {
            return refuse("ranks (P) must be at least 1".into());
        }
        if self.microbatches == 0 {
            return refuse("microbatches (M) must be at least 1".into());
        }
        let v = self.chunks.unwrap_or(default_chunks);
        if !allowed.contains(&v) {
            let need = match (*allowed.start(), *allowed.end()) {
                (a, b) if a == b => format!("V = {a}"),
                (a, usize::MAX) => format!("V >= {a}"),
                (a, b) => format!("V in {a}..={b}"),
            };
            return refuse(format!("chunks V = {v} is not supported; use {need}"));
        }
        let pairs = self
            .ranks
            .checked_mul(v)
            .and_then(|x| x.checked_mul(self.microbatches));
        if pairs.is_none_or(|n| n > MAX_PAIRS) {
            return refuse(format!(
                "P*V*M = {}*{}*{} exceeds the limit of {MAX_PAIRS} (stage, microbatch) pairs; \
                 use fewer ranks, chunks or microbatches",
                self.ranks, v, self.microbatches
            ));
        }
        Ok(v)
    }
}

/// The largest `P * V * M` a generator accepts (keeps a mistyped flag from exhausting memory).
pub const MAX_PAIRS: usize = 1 << 26;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_text_round_trip() {
        for t in ["0F0", "12B7", "3I0", "1W31"] {
            let a: Action = t.parse().unwrap();
            assert_eq!(a.to_string(), t);
        }
        for bad in ["", "F0", "0X1", "0F", "0F1x", "-1F0", "0f0"] {
            assert!(bad.parse::<Action>().is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn overlap_text_round_trip() {
        let it: Item = "(3F1;1B0)OVERLAP_F_B".parse().unwrap();
        assert_eq!(it.to_string(), "(3F1;1B0)OVERLAP_F_B");
        assert_eq!(it.actions().count(), 2);
        assert!("(3B1;1F0)OVERLAP_F_B".parse::<Item>().is_err());
        assert!("(3F1;1B0)".parse::<Item>().is_err());
    }

    #[test]
    fn placements() {
        assert_eq!(Placement::Looped.rank_of(5, 4), 1);
        let v: Vec<usize> = (0..8).map(|s| Placement::Vshape.rank_of(s, 4)).collect();
        assert_eq!(v, [0, 1, 2, 3, 3, 2, 1, 0]);
    }
}
