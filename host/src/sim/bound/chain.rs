//! Heads and tails of one microbatch's dependency chain, per stage: the quantities every term of the
//! lower bound is built from (see the [module docs](super) for the derivation).

use crate::cost::CostModel;
use crate::schedule::{Op, Placement};

/// Per stage, the shortest times the dependency chain allows (all microbatches alike). Where a stage
/// may run `B` or `I` then `W`, the cheaper choice is taken, so every quantity is a lower bound for
/// any schedule.
pub(super) struct Chain {
    /// `F` of each stage.
    pub forward: Vec<f64>,
    /// The part of the backward that the gradient chain waits for: `min(I, B)`.
    pub input: Vec<f64>,
    /// The rest of the backward: `min(B, I + W) - min(I, B)`.
    pub rest: Vec<f64>,
    /// Whether a stage-microbatch's memory slot ends with its `I` rather than its whole backward
    /// ([`Chain::release_at_input`]).
    pub slot_ends_at_input: bool,
    /// Earliest start of `F(s, ·)`: the forward chain below `s` with its transfers.
    pub head_f: Vec<f64>,
    /// From the end of `F(s, ·)` to the earliest start of `I/B(s, ·)`: the forwards above `s`, the
    /// backwards above `s`, the transfers (0 for the last stage).
    pub up: Vec<f64>,
    /// From the end of `I/B(s, ·)` to the end of the step along the gradient chain: the backwards of
    /// the stages below (stage 0's whole backward) and their transfers.
    pub down: Vec<f64>,
}

impl Chain {
    /// The chain of `costs`' stages placed on `ranks` ranks by `placement`.
    pub fn new(ranks: usize, placement: Placement, costs: &CostModel) -> Chain {
        let st = &costs.stages;
        let n = st.len();
        let comm = |j: usize| {
            let crosses =
                j + 1 < n && placement.rank_of(j, ranks) != placement.rank_of(j + 1, ranks);
            if crosses {
                costs.boundary_time(j)
            } else {
                0.0
            }
        };
        let forward: Vec<f64> = st.iter().map(|c| c.forward).collect();
        let input: Vec<f64> = st
            .iter()
            .map(|c| c.time(Op::I).min(c.time(Op::B)))
            .collect();
        let full: Vec<f64> = st
            .iter()
            .map(|c| c.time(Op::B).min(c.time(Op::I) + c.time(Op::W)))
            .collect();
        let rest: Vec<f64> = full
            .iter()
            .zip(&input)
            .map(|(f, i)| (f - i).max(0.0))
            .collect();
        let mut head_f = vec![0.0; n];
        let mut down = vec![0.0; n];
        for s in 1..n {
            head_f[s] = head_f[s - 1] + forward[s - 1] + comm(s - 1);
            let back = if s == 1 { full[0] } else { input[s - 1] };
            down[s] = down[s - 1] + back + comm(s - 1);
        }
        let mut up = vec![0.0; n];
        for s in (0..n.saturating_sub(1)).rev() {
            up[s] = comm(s) + forward[s + 1] + up[s + 1] + input[s + 1] + comm(s);
        }
        Chain {
            forward,
            input,
            slot_ends_at_input: false,
            rest,
            head_f,
            up,
            down,
        }
    }

    /// From the end of `F(x, ·)` to the earliest start of `F(y, ·)`, `x < y`: the forwards between
    /// and the transfers.
    pub fn forward_gap(&self, x: usize, y: usize) -> f64 {
        self.head_f[y] - self.head_f[x] - self.forward[x]
    }

    /// From the end of `I/B(y, ·)` to the earliest start of `I/B(x, ·)`, `1 <= x < y`: the input
    /// gradients between and the transfers (`down` counts stage 0's whole backward, so not `x = 0`).
    pub fn backward_gap(&self, y: usize, x: usize) -> f64 {
        self.down[y] - self.down[x] - self.input[x]
    }

    /// Earliest start of `I/B(s, ·)`.
    pub fn head_i(&self, s: usize) -> f64 {
        self.head_f[s] + self.forward[s] + self.up[s]
    }

    /// From the end of `F(s, ·)` to the end of the step: its own backward follows after `up`, then
    /// either the gradient chain or the rest of its own backward.
    pub fn tail_f(&self, s: usize) -> f64 {
        self.up[s] + self.input[s] + self.down[s].max(self.rest[s])
    }

    /// From the start of `F(s, k)` to the earliest end of the backward that frees its slot (`B`,
    /// or `W` after `I`; `I` after [`Chain::release_at_input`]).
    pub fn round_trip(&self, s: usize) -> f64 {
        let rest = if self.slot_ends_at_input {
            0.0
        } else {
            self.rest[s]
        };
        self.forward[s] + self.up[s] + self.input[s] + rest
    }

    /// Slots counted from a forward's start to the end of its `I` (or `B`): the round trip leaves
    /// out the rest of the backward, which still runs as work.
    pub fn release_at_input(&mut self) {
        self.slot_ends_at_input = true;
    }
}
