//! The entries of a rank's list: an action, an overlapped pair, a transfer, a parameter operation.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Action, Op, ScheduleError};

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
/// may hold [`Item::Param`] entries (PyTorch writes `REDUCE_GRAD` and `WAIT_REDUCE_GRAD` into its
/// compute-only files). A *lowered* schedule (see [`lower`](super::lower)) also holds the
/// [`Item::Comm`] entries that move data between ranks and retire the sends; PyTorch pipelining's
/// compute+comms CSV is such a schedule.
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
    /// `3SEND_B0`, `2RECV_B0`), or the wait that retires a send (`2WAIT_SEND_F0`, `3WAIT_SEND_B0`).
    Comm(Comm),
    /// An operation on a stage's parameters or gradients: FSDP's `UNSHARD` / `RESHARD`, or the
    /// data-parallel gradient reduction `REDUCE_GRAD` and its `WAIT_REDUCE_GRAD` (`0UNSHARD`,
    /// `1REDUCE_GRAD`, `1WAIT_REDUCE_GRAD`).
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
                     WAIT_SEND_F, WAIT_SEND_B, UNSHARD, RESHARD, REDUCE_GRAD, WAIT_REDUCE_GRAD or \
                     ({{forward}};{{backward}})OVERLAP_F_B"
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

/// Which way a [`Comm`] moves data, and whether it is the sending or the receiving end, or the
/// wait that retires a send.
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
    /// `WAIT_SEND_F`: the sender of `SEND_F(s,k)` waits until the peer has taken the activation (the
    /// send is retired; its buffer may be freed). Where the sender may block.
    WaitSendF,
    /// `WAIT_SEND_B`: the same for `SEND_B(s,k)`.
    WaitSendB,
}

impl CommOp {
    /// Every op, in the order of [`Self::code`].
    pub const ALL: [CommOp; 6] = [
        CommOp::SendF,
        CommOp::RecvF,
        CommOp::SendB,
        CommOp::RecvB,
        CommOp::WaitSendF,
        CommOp::WaitSendB,
    ];

    /// The word of the text form (PyTorch's): `SEND_F`, `RECV_F`, `SEND_B`, `RECV_B`,
    /// `WAIT_SEND_F`, `WAIT_SEND_B`.
    pub fn word(self) -> &'static str {
        match self {
            CommOp::SendF => "SEND_F",
            CommOp::RecvF => "RECV_F",
            CommOp::SendB => "SEND_B",
            CommOp::RecvB => "RECV_B",
            CommOp::WaitSendF => "WAIT_SEND_F",
            CommOp::WaitSendB => "WAIT_SEND_B",
        }
    }

    /// The index of the op in [`Self::ALL`].
    pub fn code(self) -> usize {
        self as usize
    }

    fn from_word(w: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|op| op.word() == w)
    }

    /// `true` for the sending end (`SEND_F`, `SEND_B`).
    pub fn is_send(self) -> bool {
        matches!(self, CommOp::SendF | CommOp::SendB)
    }

    /// `true` for the receiving end (`RECV_F`, `RECV_B`).
    pub fn is_recv(self) -> bool {
        matches!(self, CommOp::RecvF | CommOp::RecvB)
    }

    /// `true` for the wait that retires a send (`WAIT_SEND_F`, `WAIT_SEND_B`).
    pub fn is_wait(self) -> bool {
        matches!(self, CommOp::WaitSendF | CommOp::WaitSendB)
    }

    /// The wait that retires this send; the send this wait retires; `None` for a receive.
    pub fn partner(self) -> Option<CommOp> {
        match self {
            CommOp::SendF => Some(CommOp::WaitSendF),
            CommOp::SendB => Some(CommOp::WaitSendB),
            CommOp::WaitSendF => Some(CommOp::SendF),
            CommOp::WaitSendB => Some(CommOp::SendB),
            CommOp::RecvF | CommOp::RecvB => None,
        }
    }
}

/// One end of a transfer between ranks, or the wait that retires a send:
/// `{stage}{SEND_F|RECV_F|SEND_B|RECV_B|WAIT_SEND_F|WAIT_SEND_B}{microbatch}`.
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
    /// The stage on this end (the producer's for a send and its wait, the consumer's for a receive).
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
    /// step. Where a schedule has `WAIT_REDUCE_GRAD`s, it starts the reduction, which overlaps what
    /// follows until its wait; otherwise it is the whole reduction.
    ReduceGrad,
    /// Waits for the stage's pending `REDUCE_GRAD` (PyTorch: at most one pending per rank).
    WaitReduceGrad,
}

impl ParamOp {
    /// Every op, in the order of [`Self::code`].
    pub const ALL: [ParamOp; 4] = [
        ParamOp::Unshard,
        ParamOp::Reshard,
        ParamOp::ReduceGrad,
        ParamOp::WaitReduceGrad,
    ];

    /// The word of the text form: `UNSHARD`, `RESHARD`, `REDUCE_GRAD`, `WAIT_REDUCE_GRAD`.
    pub fn word(self) -> &'static str {
        match self {
            ParamOp::Unshard => "UNSHARD",
            ParamOp::Reshard => "RESHARD",
            ParamOp::ReduceGrad => "REDUCE_GRAD",
            ParamOp::WaitReduceGrad => "WAIT_REDUCE_GRAD",
        }
    }

    /// The index of the op in [`Self::ALL`].
    pub fn code(self) -> usize {
        self as usize
    }

    fn from_word(w: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|op| op.word() == w)
    }
}

/// `{stage}{UNSHARD|RESHARD|REDUCE_GRAD|WAIT_REDUCE_GRAD}`: a [`ParamOp`] on one stage.
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
