//! What each action needs, what it hands on, and what it holds: the one definition.
//!
//! Every consumer of a schedule reads these rules from here: the [validator](super::validate), the
//! [lowering pass](super::lower) that adds the transfers, the simulator and every runtime backend.
//!
//! ## Dependencies
//!
//! - `F(s,k)` needs the activation from `F(s-1,k)` (nothing for `s = 0`);
//! - `I(s,k)` / `B(s,k)` need `F(s,k)` (its stash) and the gradient from `I(s+1,k)` / `B(s+1,k)`; the
//!   last stage's backward needs only its own forward, which computed the loss;
//! - `W(s,k)` needs `I(s,k)` (its stash).
//!
//! A need on the same stage is a [`Need::Stash`]: it never crosses ranks. A need on a neighbour stage
//! is a [`Need::Data`] over an [`Edge`]; the edge crosses ranks when the two stages sit on different
//! ranks, and only then does a lowered schedule carry a send and a receive for it.
//!
//! The edge facts are defined here once, for every runner and checker: the edge an action reads
//! ([`Edge::input_of`] for `F`, [`Edge::gradient_of`] for `I`/`B`), the edge it writes ([`output`]),
//! and an edge's two ends ([`Edge::producer`], [`Edge::consumer`]).
//!
//! ## Activation memory
//!
//! `F(s,k)` allocates its stage's activations when it starts; `I(s,k)` releases the part the weight
//! gradient does not need when it ends; `W(s,k)` releases the rest, `B(s,k)` everything, when they end.
//! [`InFlight`] counts it per rank for any [`Footprint`]: [`Footprint::UNIT`] counts microbatch-stages
//! (the validator's report), cost-model bytes give the simulator's peak.
//!
//! ```
//! use pipefill_host::schedule::deps::{needs, output, Edge, Flow, Need};
//! use pipefill_host::schedule::{Action, Op};
//! let b = Action::new(Op::B, 1, 3);
//! let n: Vec<Need> = needs(b, 4).collect();
//! assert_eq!(n, vec![
//!     Need::Stash(Action::new(Op::F, 1, 3)),
//!     Need::Data(Edge { flow: Flow::Gradient, from: 2, microbatch: 3 }),
//! ]);
//! assert_eq!(output(b, 4), Some(Edge { flow: Flow::Gradient, from: 1, microbatch: 3 }));
//! assert_eq!(output(Action::new(Op::F, 3, 0), 4), None); // the last forward feeds the loss
//! ```

use super::{Action, Comm, CommOp, Op};

/// What flows over an [`Edge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flow {
    /// The output of `F(from, k)`, the input of `F(from + 1, k)`.
    Activation,
    /// The input gradient from `I(from, k)` / `B(from, k)`, the output gradient of stage `from - 1`.
    Gradient,
}

/// Data handed from one stage to its neighbour for one microbatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Edge {
    /// Activation (forward) or gradient (backward).
    pub flow: Flow,
    /// The producing stage.
    pub from: usize,
    /// The microbatch.
    pub microbatch: usize,
}

impl Edge {
    /// The consuming stage (`from + 1` for an activation, `from - 1` for a gradient).
    pub fn to(&self) -> usize {
        match self.flow {
            Flow::Activation => self.from + 1,
            Flow::Gradient => self.from - 1,
        }
    }

    /// The boundary the edge crosses, named by the lower of its two stages (the index of the
    /// cost model's `output_bytes` and link time for it).
    pub fn boundary(&self) -> usize {
        self.from.min(self.to())
    }

    /// The edge that delivers `F(s, k)`'s input, from `F(s-1, k)`; `None` for stage 0 (its input is
    /// the microbatch's).
    ///
    /// ```
    /// use pipefill_host::schedule::deps::{Edge, Flow};
    /// use pipefill_host::schedule::{Action, Op};
    /// let e = Edge::input_of(Action::new(Op::F, 2, 5)).unwrap();
    /// assert_eq!((e.flow, e.from, e.microbatch), (Flow::Activation, 1, 5));
    /// assert_eq!(e.consumer(), Action::new(Op::F, 2, 5));
    /// assert_eq!(Edge::input_of(Action::new(Op::F, 0, 5)), None);
    /// ```
    pub fn input_of(a: Action) -> Option<Edge> {
        Some(Edge {
            flow: Flow::Activation,
            from: a.stage.checked_sub(1)?,
            microbatch: a.microbatch,
        })
    }

    /// The edge that delivers the output gradient of `I(s, k)` / `B(s, k)`: from stage `s+1`, or,
    /// on the last stage, from the loss (named as a gradient from one stage past the last; it
    /// never crosses ranks).
    ///
    /// ```
    /// use pipefill_host::schedule::deps::{Edge, Flow};
    /// use pipefill_host::schedule::{Action, Op};
    /// let e = Edge::gradient_of(Action::new(Op::B, 2, 5));
    /// assert_eq!((e.flow, e.from, e.to()), (Flow::Gradient, 3, 2));
    /// assert_eq!(e.consumer(), Action::new(Op::I, 2, 5)); // `I` stands for "`I` or `B`"
    /// ```
    pub fn gradient_of(a: Action) -> Edge {
        Edge {
            flow: Flow::Gradient,
            from: a.stage + 1,
            microbatch: a.microbatch,
        }
    }

    /// The action that consumes the data: `F` of the next stage for an activation, `I` of the
    /// previous stage for a gradient (`I` stands for "`I` or `B`", as in [`Edge::producer`]).
    pub fn consumer(&self) -> Action {
        let op = match self.flow {
            Flow::Activation => Op::F,
            Flow::Gradient => Op::I,
        };
        Action::new(op, self.to(), self.microbatch)
    }

    /// The action that produces the data (`I` stands for "`I` or `B`" for a gradient).
    pub fn producer(&self) -> Action {
        let op = match self.flow {
            Flow::Activation => Op::F,
            Flow::Gradient => Op::I,
        };
        Action::new(op, self.from, self.microbatch)
    }

    /// The sending end in a lowered schedule (`{from}SEND_F{k}` / `{from}SEND_B{k}`).
    pub fn send(&self) -> Comm {
        let op = match self.flow {
            Flow::Activation => CommOp::SendF,
            Flow::Gradient => CommOp::SendB,
        };
        Comm {
            op,
            stage: self.from,
            microbatch: self.microbatch,
        }
    }

    /// The wait that retires the send in a lowered schedule (`{from}WAIT_SEND_F{k}` /
    /// `{from}WAIT_SEND_B{k}`).
    pub fn wait(&self) -> Comm {
        let op = match self.flow {
            Flow::Activation => CommOp::WaitSendF,
            Flow::Gradient => CommOp::WaitSendB,
        };
        Comm {
            op,
            stage: self.from,
            microbatch: self.microbatch,
        }
    }

    /// The receiving end in a lowered schedule (`{to}RECV_F{k}` / `{to}RECV_B{k}`).
    pub fn recv(&self) -> Comm {
        let op = match self.flow {
            Flow::Activation => CommOp::RecvF,
            Flow::Gradient => CommOp::RecvB,
        };
        Comm {
            op,
            stage: self.to(),
            microbatch: self.microbatch,
        }
    }

    /// The edge a send, its wait or a receive belongs to; `None` when it names no boundary (a
    /// `RECV_F` on stage 0, a `SEND_B` from stage 0, a `SEND_F` or `RECV_B` on the last of `stages`
    /// stages).
    pub fn of(c: Comm, stages: usize) -> Option<Edge> {
        let (flow, from) = match c.op {
            CommOp::SendF | CommOp::WaitSendF => (Flow::Activation, Some(c.stage)),
            CommOp::RecvF => (Flow::Activation, c.stage.checked_sub(1)),
            CommOp::SendB | CommOp::WaitSendB => (Flow::Gradient, Some(c.stage)),
            CommOp::RecvB => (Flow::Gradient, c.stage.checked_add(1)),
        };
        let e = Edge {
            flow,
            from: from?,
            microbatch: c.microbatch,
        };
        let inside = |s: usize| s < stages;
        let to = match flow {
            Flow::Activation => e.from.checked_add(1),
            Flow::Gradient => e.from.checked_sub(1),
        };
        (inside(e.from) && to.is_some_and(inside)).then_some(e)
    }
}

/// One thing an action waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Need {
    /// Earlier work of the same stage and microbatch, held in its stash: `F(s,k)` for `I`/`B`,
    /// `I(s,k)` for `W`. Always on the same rank.
    Stash(Action),
    /// Data from a neighbour stage.
    Data(Edge),
}

/// What `a` needs, in a fixed order (stash first), when there are `stages` stages.
pub fn needs(a: Action, stages: usize) -> impl Iterator<Item = Need> {
    let (s, k) = (a.stage, a.microbatch);
    let (first, second) = match a.op {
        Op::F => (Edge::input_of(a).map(Need::Data), None),
        Op::B | Op::I => (
            Some(Need::Stash(Action::new(Op::F, s, k))),
            (s + 1 < stages).then(|| Need::Data(Edge::gradient_of(a))),
        ),
        Op::W => (Some(Need::Stash(Action::new(Op::I, s, k))), None),
    };
    first.into_iter().chain(second)
}

/// The data `a` hands to a neighbour stage, if any: `F(s,k)` its activation (unless `s` is last),
/// `I(s,k)` / `B(s,k)` the input gradient (unless `s = 0`); `W` hands on nothing.
pub fn output(a: Action, stages: usize) -> Option<Edge> {
    let flow = match a.op {
        Op::F if a.stage + 1 < stages => Flow::Activation,
        Op::B | Op::I if a.stage > 0 => Flow::Gradient,
        _ => return None,
    };
    Some(Edge {
        flow,
        from: a.stage,
        microbatch: a.microbatch,
    })
}

/// `true` when `done` satisfies a need for `wanted`: the same action, or a `B` where an `I` is
/// wanted (a full backward includes the input backward).
pub fn satisfies(done: Action, wanted: Action) -> bool {
    (done.stage, done.microbatch) == (wanted.stage, wanted.microbatch)
        && (done.op == wanted.op || (wanted.op == Op::I && done.op == Op::B))
}

/// A stage's activation memory for one microbatch: allocated by `F`, partly released by `I`, the rest
/// by `W` (all of it by `B`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Footprint {
    /// What one microbatch holds at most (`F` allocates it, less `rebuilt`).
    pub bytes: f64,
    /// What `I` releases (the rest waits for `W`).
    pub released_at_input: f64,
    /// The part of `bytes` not held between `F` and the backward (recomputation): `F` allocates
    /// `bytes - rebuilt`, and `I` or `B` allocates `rebuilt` at its start.
    pub rebuilt: f64,
}

impl Footprint {
    /// One unit per microbatch-stage, nothing released at `I`: the validator's count.
    pub const UNIT: Footprint = Footprint {
        bytes: 1.0,
        released_at_input: 0.0,
        rebuilt: 0.0,
    };

    /// What `op` allocates when it starts.
    pub fn allocated_by(&self, op: Op) -> f64 {
        let rebuilt = self.rebuilt.min(self.bytes);
        match op {
            Op::F => self.bytes - rebuilt,
            Op::I | Op::B => rebuilt,
            Op::W => 0.0,
        }
    }

    /// What `op` releases when it ends.
    pub fn released_by(&self, op: Op) -> f64 {
        match op {
            Op::F => 0.0,
            Op::I => self.released_at_input.min(self.bytes),
            Op::W => (self.bytes - self.released_at_input).max(0.0),
            Op::B => self.bytes,
        }
    }
}

/// Activation memory held per rank, and its peak, as actions start and end. The key is a rank for the
/// validator and the simulator; the partitioner keys it by stage (`stage_in_flight`).
///
/// ```
/// use pipefill_host::schedule::deps::{Footprint, InFlight};
/// use pipefill_host::schedule::{Action, Op};
/// let mut m = InFlight::new(1);
/// let f = Footprint { bytes: 10.0, released_at_input: 4.0, rebuilt: 0.0 };
/// for (op, k) in [(Op::F, 0), (Op::F, 1), (Op::I, 0), (Op::W, 0)] {
///     let a = Action::new(op, 0, k);
///     m.start(0, a, &f);
///     m.end(0, a, &f);
/// }
/// assert_eq!((m.now()[0], m.peak()[0]), (10.0, 20.0));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct InFlight {
    now: Vec<f64>,
    peak: Vec<f64>,
}

impl InFlight {
    /// Nothing held on any of `ranks` ranks.
    pub fn new(ranks: usize) -> Self {
        InFlight {
            now: vec![0.0; ranks],
            peak: vec![0.0; ranks],
        }
    }

    /// `a` starts on `rank` (a forward allocates).
    #[inline]
    pub fn start(&mut self, rank: usize, a: Action, footprint: &Footprint) {
        let add = footprint.allocated_by(a.op);
        if add != 0.0 {
            self.now[rank] += add;
            self.peak[rank] = self.peak[rank].max(self.now[rank]);
        }
    }

    /// `a` ends on `rank` (a backward releases).
    #[inline]
    pub fn end(&mut self, rank: usize, a: Action, footprint: &Footprint) {
        self.now[rank] -= footprint.released_by(a.op);
    }

    /// Held now, per rank.
    pub fn now(&self) -> &[f64] {
        &self.now
    }

    /// The most held at once so far, per rank.
    pub fn peak(&self) -> &[f64] {
        &self.peak
    }

    /// The peaks, consumed.
    pub fn into_peak(self) -> Vec<f64> {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_and_their_ends() {
        let e = Edge {
            flow: Flow::Gradient,
            from: 3,
            microbatch: 1,
        };
        assert_eq!((e.to(), e.boundary()), (2, 2));
        assert_eq!(e.send().to_string(), "3SEND_B1");
        assert_eq!(e.recv().to_string(), "2RECV_B1");
        assert_eq!(e.wait().to_string(), "3WAIT_SEND_B1");
        assert_eq!(Edge::of(e.wait(), 4), Some(e));
        assert_eq!(Edge::of(e.send(), 4), Some(e));
        assert_eq!(Edge::of(e.recv(), 4), Some(e));
        let a = Edge {
            flow: Flow::Activation,
            from: 0,
            microbatch: 2,
        };
        assert_eq!(a.send().to_string(), "0SEND_F2");
        assert_eq!(a.recv().to_string(), "1RECV_F2");
        assert_eq!(Edge::of(a.recv(), 4), Some(a));
        // Ends that name no boundary.
        for bad in ["0RECV_F0", "0SEND_B0", "3SEND_F0", "3RECV_B0", "9SEND_F0"] {
            let c = match bad.parse() {
                Ok(super::super::Item::Comm(c)) => c,
                other => panic!("{bad}: {other:?}"),
            };
            assert_eq!(Edge::of(c, 4), None, "{bad}");
        }
    }

    #[test]
    fn needs_of_each_op() {
        let f0: Vec<_> = needs(Action::new(Op::F, 0, 0), 2).collect();
        assert!(f0.is_empty());
        let last_b: Vec<_> = needs(Action::new(Op::B, 1, 0), 2).collect();
        assert_eq!(last_b, vec![Need::Stash(Action::new(Op::F, 1, 0))]);
        let w: Vec<_> = needs(Action::new(Op::W, 0, 5), 2).collect();
        assert_eq!(w, vec![Need::Stash(Action::new(Op::I, 0, 5))]);
        assert_eq!(output(Action::new(Op::W, 1, 0), 2), None);
        assert_eq!(output(Action::new(Op::I, 0, 0), 2), None);
        assert!(satisfies(
            Action::new(Op::B, 1, 0),
            Action::new(Op::I, 1, 0)
        ));
        assert!(!satisfies(
            Action::new(Op::I, 1, 0),
            Action::new(Op::B, 1, 0)
        ));
    }

    #[test]
    fn footprint_releases_everything_once() {
        let f = Footprint {
            bytes: 10.0,
            released_at_input: 4.0,
            rebuilt: 0.0,
        };
        assert_eq!(
            f.released_by(Op::I) + f.released_by(Op::W),
            f.released_by(Op::B)
        );
        assert_eq!(Footprint::UNIT.released_by(Op::W), 1.0);
    }
}
