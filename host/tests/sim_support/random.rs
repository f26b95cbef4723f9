//! Random simulator cases for the property tests: heterogeneous per-stage costs (F, I, W, B,
//! boundary bytes), latency, bandwidth and overlap share, for random P, M and V.

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::{Params, Schedule};
use proptest::prelude::*;

/// One random stage cost: F, I, W in `[0, 3)`, an optional fused B in `[0, 6)`, boundary bytes.
pub fn stage() -> impl Strategy<Value = StageCost> {
    (
        0.0f64..3.0,
        0.0f64..3.0,
        0.0f64..3.0,
        prop::option::of(0.0f64..6.0),
        0.0f64..1e6,
    )
        .prop_map(|(f, i, w, b, bytes)| {
            let mut s = StageCost::uniform(f, i, w);
            if let Some(b) = b {
                s.backward = b;
            }
            s.output_bytes = bytes;
            s
        })
}

/// One random case: P, M, V, per-stage costs for up to 15 stages (cycled over the stages),
/// latency, bandwidth and overlap share.
#[derive(Debug, Clone)]
pub struct Case {
    /// Ranks.
    pub p: usize,
    /// Microbatches.
    pub m: usize,
    /// Chunks per rank.
    pub v: usize,
    /// Per-stage costs, cycled over the schedule's stages.
    pub stages: Vec<StageCost>,
    /// Per-hop latency.
    pub latency: f64,
    /// Link bandwidth; `None` is infinite.
    pub bandwidth: Option<f64>,
    /// Overlap share of paired F/B items.
    pub share: f64,
}

impl Case {
    /// The case's P, M and V as schedule parameters.
    pub fn params(&self) -> Params {
        Params {
            ranks: self.p,
            microbatches: self.m,
            chunks: Some(self.v),
            group_size: None,
        }
    }

    /// The case's cost model for the stages of `s`.
    pub fn costs_for(&self, s: &Schedule) -> CostModel {
        CostModel {
            stages: self
                .stages
                .iter()
                .cycle()
                .take(s.stages())
                .copied()
                .collect(),
            link: LinkCost {
                latency: self.latency,
                bandwidth: self.bandwidth.unwrap_or(f64::INFINITY),
            },
            overlap_share: self.share,
        }
    }
}

/// Random cases: P in 1..=5, M in 1..=10, V in 1..=3.
pub fn case() -> impl Strategy<Value = Case> {
    (
        1usize..=5,
        1usize..=10,
        1usize..=3,
        prop::collection::vec(stage(), 15),
        0.0f64..0.5,
        prop::option::of(1e5f64..1e7),
        0.0f64..=1.0,
    )
        .prop_map(|(p, m, v, stages, latency, bandwidth, share)| Case {
            p,
            m,
            v,
            stages,
            latency,
            bandwidth,
            share,
        })
}
