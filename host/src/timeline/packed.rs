//! Compact forms of [`Item`] and [`Action`] for timelines: 32-bit stages and microbatches and a
//! byte of tags, so a span takes 40 bytes and a transfer 56 (a timeline holds millions of them).
//!
//! Every schedule that validates fits: the validator bounds `P * V * M` below 2^32, so every stage
//! and microbatch does too. Packing anything larger is a programming error and panics.

use crate::schedule::{Action, Comm, CommOp, Item, Op, ParamAction, ParamOp};

const OPS: [Op; 4] = [Op::F, Op::B, Op::I, Op::W];

const ONE: u8 = 0;
const OVERLAP: u8 = 1;
const COMM: u8 = 2;
const PARAM: u8 = 3;

fn op_code(op: Op) -> u8 {
    match op {
        Op::F => 0,
        Op::B => 1,
        Op::I => 2,
        Op::W => 3,
    }
}

fn comm_code(op: CommOp) -> u8 {
    op.code() as u8
}

fn param_code(op: ParamOp) -> u8 {
    op.code() as u8
}

/// `x` as 32 bits; panics above (see the module docs).
#[inline]
pub(super) fn narrow(x: usize) -> u32 {
    match u32::try_from(x) {
        Ok(v) => v,
        Err(_) => panic!("timeline: stage, microbatch or rank {x} is 2^32 or more"),
    }
}

/// An [`Item`] in 17 bytes: `words` holds stage and microbatch (then the backward half's for a
/// pair); `code` the variant (bits 0-1), the first op (bits 2-3) and a pair's backward op (bits 4-5);
/// a transfer's or parameter operation's op takes bits 2-4.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PackedItem {
    words: [u32; 4],
    code: u8,
}

impl PackedItem {
    /// Packs `item`.
    #[inline]
    pub fn new(item: Item) -> Self {
        let (kind, op, op2, words) = match item {
            Item::One(a) => (ONE, op_code(a.op), 0, [a.stage, a.microbatch, 0, 0]),
            Item::Overlap { forward, backward } => (
                OVERLAP,
                op_code(forward.op),
                op_code(backward.op),
                [
                    forward.stage,
                    forward.microbatch,
                    backward.stage,
                    backward.microbatch,
                ],
            ),
            Item::Comm(c) => (COMM, comm_code(c.op), 0, [c.stage, c.microbatch, 0, 0]),
            Item::Param(p) => (PARAM, param_code(p.op), 0, [p.stage, 0, 0, 0]),
        };
        PackedItem {
            words: words.map(narrow),
            code: kind | op << 2 | op2 << 4,
        }
    }

    /// The item back.
    #[inline]
    pub fn get(self) -> Item {
        let [s, k, s2, k2] = self.words.map(|w| w as usize);
        let op = usize::from((self.code >> 2) & 3);
        let wide_op = usize::from((self.code >> 2) & 7);
        match self.code & 3 {
            ONE => Item::One(Action::new(OPS[op], s, k)),
            OVERLAP => Item::Overlap {
                forward: Action::new(OPS[op], s, k),
                backward: Action::new(OPS[usize::from((self.code >> 4) & 3)], s2, k2),
            },
            COMM => Item::Comm(Comm {
                op: CommOp::ALL[wide_op.min(CommOp::ALL.len() - 1)],
                stage: s,
                microbatch: k,
            }),
            _ => Item::Param(ParamAction {
                op: ParamOp::ALL[wide_op.min(ParamOp::ALL.len() - 1)],
                stage: s,
            }),
        }
    }
}

/// An [`Action`] in 12 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PackedAction {
    stage: u32,
    microbatch: u32,
    op: u8,
}

impl PackedAction {
    /// Packs `a`.
    #[inline]
    pub fn new(a: Action) -> Self {
        PackedAction {
            stage: narrow(a.stage),
            microbatch: narrow(a.microbatch),
            op: op_code(a.op),
        }
    }

    /// The action back.
    #[inline]
    pub fn get(self) -> Action {
        Action::new(
            OPS[usize::from(self.op & 3)],
            self.stage as usize,
            self.microbatch as usize,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_item_round_trips() {
        for text in [
            "0F0",
            "3B7",
            "2I1",
            "1W4",
            "(1F2;3I0)OVERLAP_F_B",
            "(0F5;2B1)OVERLAP_F_B",
            "2SEND_F0",
            "3RECV_F0",
            "3SEND_B9",
            "2RECV_B1",
            "0UNSHARD",
            "1RESHARD",
            "4REDUCE_GRAD",
            "2WAIT_SEND_F3",
            "5WAIT_SEND_B0",
            "4WAIT_REDUCE_GRAD",
        ] {
            let item: Item = text.parse().unwrap();
            assert_eq!(PackedItem::new(item).get(), item, "{text}");
        }
        let big = Item::One(Action::new(Op::W, u32::MAX as usize, 123_456_789));
        assert_eq!(PackedItem::new(big).get(), big);
        for op in OPS {
            let a = Action::new(op, 70_000, 4_000_000_000);
            assert_eq!(PackedAction::new(a).get(), a);
        }
    }

    #[test]
    #[should_panic(expected = "2^32 or more")]
    fn too_large_panics() {
        PackedItem::new(Item::One(Action::new(Op::F, 1 << 32, 0)));
    }

    #[test]
    fn sizes() {
        assert_eq!(std::mem::size_of::<PackedItem>(), 20);
        assert_eq!(std::mem::size_of::<PackedAction>(), 12);
    }
}
