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

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

mod error;
pub use error::{ScheduleError, Wait};

pub mod deps;
pub mod families;
pub mod format;
pub mod lower;
pub mod validate;

mod dualpipev;
mod gpipe;
mod interleaved_1f1b;
mod interleaved_zb;
mod looped_bfs;
mod one_f_one_b;
mod zb_h1;
mod zb_h2;
mod zbv;

/// The kind of computation an action performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Op {
    /// Forward pass of one stage for one microbatch.
    F,
    /// Full backward pass (input and weight gradients together): `B == I then W`.
    B,
    /// Backward pass for the input gradient only (the part the previous stage waits for).
    I,
    /// Backward pass for the weight gradient only (can be deferred to fill bubbles).
    W,
}

impl Op {
    /// The letter used in the text form.
    pub fn letter(self) -> char {
        match self {
            Op::F => 'F',
            Op::B => 'B',
            Op::I => 'I',
            Op::W => 'W',
        }
    }

    /// Parses the letter of the text form.
    pub fn from_letter(c: char) -> Option<Op> {
        match c {
            'F' => Some(Op::F),
            'B' => Some(Op::B),
            'I' => Some(Op::I),
            'W' => Some(Op::W),
            _ => None,
        }
    }

    /// `true` for the ops that run backward (`B`, `I`, `W`).
    pub fn is_backward(self) -> bool {
        !matches!(self, Op::F)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.letter())
    }
}

/// One unit of work: `op` on global stage `stage` for microbatch `microbatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Action {
    /// What to compute.
    pub op: Op,
    /// Global stage index `s` in `0..S`, `S = ranks * chunks`.
    pub stage: usize,
    /// Microbatch index `k` in `0..M`.
    pub microbatch: usize,
}

impl Action {
    /// Builds an action.
    pub const fn new(op: Op, stage: usize, microbatch: usize) -> Self {
        Action {
            op,
            stage,
            microbatch,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.stage, self.op, self.microbatch)
    }
}

impl FromStr for Action {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| ScheduleError::ParseAction {
            text: s.to_string(),
            reason: why.to_string(),
        };
        let t = s.trim();
        let pos = t
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| bad("expected {stage}{op}{microbatch}, e.g. 2F0; no op letter found"))?;
        if pos == 0 {
            return Err(bad("missing stage number before the op letter, e.g. 2F0"));
        }
        let mut rest = t[pos..].chars();
        let letter = rest.next().ok_or_else(|| bad("missing op letter"))?;
        let op =
            Op::from_letter(letter).ok_or_else(|| bad("op letter must be one of F, B, I, W"))?;
        let mb_text = rest.as_str();
        if mb_text.is_empty() || !mb_text.chars().all(|c| c.is_ascii_digit()) {
            return Err(bad(
                "expected a microbatch number after the op letter, e.g. 2F0",
            ));
        }
        let stage = t[..pos]
            .parse()
            .map_err(|_| bad("stage number is too large"))?;
        let microbatch = mb_text
            .parse()
            .map_err(|_| bad("microbatch number is too large"))?;
        Ok(Action::new(op, stage, microbatch))
    }
}

/// Serializes as the text form, e.g. `"2F0"`.
impl Serialize for Action {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Action {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Serializes as the text form, e.g. `"2F0"`, `"(1F4;2B0)OVERLAP_F_B"`, `"3RECV_F0"`.
impl Serialize for Item {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One entry in a rank's list.
///
/// A compute-only schedule (what the generators write) holds [`Item::One`] and [`Item::Overlap`], and
/// may hold [`Item::Param`] entries (PyTorch writes `REDUCE_GRAD` into its compute-only files). A
/// *lowered* schedule (see [`lower`](mod@lower)) also holds the [`Item::Comm`] entries that move data
/// between ranks; PyTorch pipelining's compute+comms CSV is such a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Item {
    /// A single action.
    One(Action),
    /// A forward (`forward.op == Op::F`) overlapped with a backward (`B`, or `I`), text form
    /// `({forward};{backward})OVERLAP_F_B`.
    Overlap {
        /// The forward half.
        forward: Action,
        /// The backward half.
        backward: Action,
    },
    /// A send or a receive of an activation or a gradient between ranks (`2SEND_F0`, `3RECV_F0`,
    /// `3SEND_B0`, `2RECV_B0`).
    Comm(Comm),
    /// An operation on a stage's parameters or gradients: FSDP's `UNSHARD` / `RESHARD`, or the
    /// data-parallel gradient reduction `REDUCE_GRAD` (`0UNSHARD`, `1REDUCE_GRAD`).
    Param(ParamAction),
}

impl Item {
    /// The compute actions this item performs, forward first for a pair; none for a
    /// [`Comm`](Item::Comm) or [`Param`](Item::Param) entry.
    pub fn actions(&self) -> impl Iterator<Item = Action> {
        let (a, b) = match *self {
            Item::One(a) => (Some(a), None),
            Item::Overlap { forward, backward } => (Some(forward), Some(backward)),
            Item::Comm(_) | Item::Param(_) => (None, None),
        };
        a.into_iter().chain(b)
    }

    /// `true` for the items that compute ([`One`](Item::One), [`Overlap`](Item::Overlap)).
    pub fn is_compute(&self) -> bool {
        matches!(self, Item::One(_) | Item::Overlap { .. })
    }

    /// The stage this item names (its forward's for a pair).
    pub fn stage(&self) -> usize {
        match *self {
            Item::One(a) => a.stage,
            Item::Overlap { forward, .. } => forward.stage,
            Item::Comm(c) => c.stage,
            Item::Param(p) => p.stage,
        }
    }

    /// Every stage this item names (both halves of a pair).
    pub fn stages(&self) -> impl Iterator<Item = usize> {
        let second = match *self {
            Item::Overlap { backward, .. } => Some(backward.stage),
            _ => None,
        };
        std::iter::once(self.stage()).chain(second)
    }

    /// Every microbatch this item names (none for a [`Param`](Item::Param) entry).
    pub fn microbatches(&self) -> impl Iterator<Item = usize> {
        let (a, b) = match *self {
            Item::One(a) => (Some(a.microbatch), None),
            Item::Overlap { forward, backward } => {
                (Some(forward.microbatch), Some(backward.microbatch))
            }
            Item::Comm(c) => (Some(c.microbatch), None),
            Item::Param(_) => (None, None),
        };
        a.into_iter().chain(b)
    }
}

impl From<Action> for Item {
    fn from(a: Action) -> Self {
        Item::One(a)
    }
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::One(a) => write!(f, "{a}"),
            Item::Overlap { forward, backward } => write!(f, "({forward};{backward})OVERLAP_F_B"),
            Item::Comm(c) => write!(f, "{c}"),
            Item::Param(p) => write!(f, "{p}"),
        }
    }
}

impl FromStr for Item {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if let Some(inner) = t.strip_prefix('(') {
            return parse_overlap(s, inner);
        }
        let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let word: String = t[digits..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || *c == '_')
            .collect();
        if word.len() > 1 {
            if let Some(op) = CommOp::from_word(&word) {
                return Ok(Item::Comm(Comm::parse(t, op)?));
            }
            if let Some(op) = ParamOp::from_word(&word) {
                return Ok(Item::Param(ParamAction::parse(t, op)?));
            }
            return Err(ScheduleError::ParseAction {
                text: s.to_string(),
                reason: format!(
                    "unknown action `{word}`; use F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, \
                     UNSHARD, RESHARD, REDUCE_GRAD or ({{forward}};{{backward}})OVERLAP_F_B"
                ),
            });
        }
        Ok(Item::One(t.parse()?))
    }
}

/// Parses the inside of `({forward};{backward})OVERLAP_F_B` (after the opening parenthesis).
fn parse_overlap(s: &str, inner: &str) -> Result<Item, ScheduleError> {
    let bad = |why: &str| ScheduleError::ParseAction {
        text: s.to_string(),
        reason: why.to_string(),
    };
    let inner = inner
        .strip_suffix(")OVERLAP_F_B")
        .ok_or_else(|| bad("an overlapped pair is written ({forward};{backward})OVERLAP_F_B"))?;
    let (a, b) = inner
        .split_once(';')
        .ok_or_else(|| bad("an overlapped pair needs two actions separated by ';'"))?;
    let forward: Action = a.parse()?;
    let backward: Action = b.parse()?;
    if forward.op != Op::F {
        return Err(bad(
            "the first action of an overlapped pair must be a forward (F)",
        ));
    }
    if !matches!(backward.op, Op::B | Op::I) {
        return Err(bad(
            "the second action of an overlapped pair must be a backward (B or I)",
        ));
    }
    Ok(Item::Overlap { forward, backward })
}

/// Splits `{stage}{WORD}{rest}` into the stage number and the rest after `word`.
fn split_word<'t>(text: &'t str, word: &str) -> Result<(usize, &'t str), ScheduleError> {
    let bad = |why: String| ScheduleError::ParseAction {
        text: text.to_string(),
        reason: why,
    };
    let pos = text.find(word).unwrap_or(0);
    if pos == 0 {
        return Err(bad(format!(
            "missing stage number before {word}, e.g. 2{word}"
        )));
    }
    let stage = text[..pos]
        .parse()
        .map_err(|_| bad("stage number is too large".into()))?;
    Ok((stage, &text[pos + word.len()..]))
}

/// Which way a [`Comm`] moves data, and whether it is the sending or the receiving end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CommOp {
    /// `SEND_F`: stage `s` sends the output of `F(s,k)` to stage `s+1` on another rank.
    SendF,
    /// `RECV_F`: stage `s` receives the input of `F(s,k)` from stage `s-1` on another rank.
    RecvF,
    /// `SEND_B`: stage `s` sends the input gradient from `I(s,k)` / `B(s,k)` to stage `s-1`.
    SendB,
    /// `RECV_B`: stage `s` receives the output gradient for `I(s,k)` / `B(s,k)` from stage `s+1`.
    RecvB,
}

impl CommOp {
    /// The word of the text form (PyTorch's): `SEND_F`, `RECV_F`, `SEND_B`, `RECV_B`.
    pub fn word(self) -> &'static str {
        match self {
            CommOp::SendF => "SEND_F",
            CommOp::RecvF => "RECV_F",
            CommOp::SendB => "SEND_B",
            CommOp::RecvB => "RECV_B",
        }
    }

    fn from_word(w: &str) -> Option<Self> {
        [CommOp::SendF, CommOp::RecvF, CommOp::SendB, CommOp::RecvB]
            .into_iter()
            .find(|op| op.word() == w)
    }

    /// `true` for the sending end.
    pub fn is_send(self) -> bool {
        matches!(self, CommOp::SendF | CommOp::SendB)
    }
}

/// One end of a transfer between ranks: `{stage}{SEND_F|RECV_F|SEND_B|RECV_B}{microbatch}`.
///
/// ```
/// use pipefill_host::schedule::{Comm, CommOp, Item};
/// let it: Item = "2SEND_F0".parse().unwrap();
/// assert_eq!(it, Item::Comm(Comm { op: CommOp::SendF, stage: 2, microbatch: 0 }));
/// assert_eq!(it.to_string(), "2SEND_F0");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Comm {
    /// Send or receive, activation or gradient.
    pub op: CommOp,
    /// The stage on this end (the producer's for a send, the consumer's for a receive).
    pub stage: usize,
    /// The microbatch.
    pub microbatch: usize,
}

impl Comm {
    fn parse(text: &str, op: CommOp) -> Result<Self, ScheduleError> {
        let (stage, rest) = split_word(text, op.word())?;
        let microbatch = rest.parse().map_err(|_| ScheduleError::ParseAction {
            text: text.to_string(),
            reason: format!(
                "expected a microbatch number after {}, e.g. 2{}0",
                op.word(),
                op.word()
            ),
        })?;
        Ok(Comm {
            op,
            stage,
            microbatch,
        })
    }
}

impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.stage, self.op.word(), self.microbatch)
    }
}

/// An operation on one stage's parameters or gradients, once per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParamOp {
    /// FSDP: gather the stage's sharded parameters before it computes.
    Unshard,
    /// FSDP: free the gathered parameters again.
    Reshard,
    /// The data-parallel reduction of the stage's weight gradients, after its last `W`/`B` of the
    /// step.
    ReduceGrad,
}

impl ParamOp {
    /// The word of the text form: `UNSHARD`, `RESHARD`, `REDUCE_GRAD`.
    pub fn word(self) -> &'static str {
        match self {
            ParamOp::Unshard => "UNSHARD",
            ParamOp::Reshard => "RESHARD",
            ParamOp::ReduceGrad => "REDUCE_GRAD",
        }
    }

    fn from_word(w: &str) -> Option<Self> {
        [ParamOp::Unshard, ParamOp::Reshard, ParamOp::ReduceGrad]
            .into_iter()
            .find(|op| op.word() == w)
    }
}

/// `{stage}{UNSHARD|RESHARD|REDUCE_GRAD}`: a [`ParamOp`] on one stage.
///
/// ```
/// use pipefill_host::schedule::{Item, ParamAction, ParamOp};
/// let it: Item = "1REDUCE_GRAD".parse().unwrap();
/// assert_eq!(it, Item::Param(ParamAction { op: ParamOp::ReduceGrad, stage: 1 }));
/// assert_eq!(it.to_string(), "1REDUCE_GRAD");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamAction {
    /// What to do.
    pub op: ParamOp,
    /// The stage.
    pub stage: usize,
}

impl ParamAction {
    fn parse(text: &str, op: ParamOp) -> Result<Self, ScheduleError> {
        let (stage, rest) = split_word(text, op.word())?;
        if !rest.is_empty() {
            return Err(ScheduleError::ParseAction {
                text: text.to_string(),
                reason: format!(
                    "{} takes no microbatch; write e.g. 0{}",
                    op.word(),
                    op.word()
                ),
            });
        }
        Ok(ParamAction { op, stage })
    }
}

impl fmt::Display for ParamAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.stage, self.op.word())
    }
}

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

    /// The name used in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Looped => "looped",
            Placement::Vshape => "vshape",
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Placement {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "looped" => Ok(Placement::Looped),
            "vshape" => Ok(Placement::Vshape),
            other => Err(ScheduleError::ParsePlacement(other.to_string())),
        }
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
