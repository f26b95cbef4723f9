//! Ops and actions: `(op, stage, microbatch)`, written `{stage}{op}{microbatch}`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::ScheduleError;

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
            text: crate::input::excerpt(s),
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
        let op = Op::from_letter(letter).ok_or_else(|| {
            bad(
                "op letter must be one of F, B, I, W (or a word: SEND_F, RECV_F, SEND_B, RECV_B, \
                 WAIT_SEND_F, WAIT_SEND_B, UNSHARD, RESHARD, REDUCE_GRAD, WAIT_REDUCE_GRAD)",
            )
        })?;
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
