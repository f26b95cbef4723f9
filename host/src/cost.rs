//! Cost models: what each stage's F, I and W cost, what it holds in memory, and what a transfer costs.
//!
//! The cost file (one schema for measured and hand-written costs, see the README) lists per-layer costs;
//! a [`CostModel`] holds per-stage costs, built from layers and a partition, from flags
//! (`--cost F=1,I=1,W=1`), or from a file. (Parsing and checks: to be written by the simulator issue.)

use serde::{Deserialize, Serialize};

/// Measured or hand-written cost of one layer, as in the cost file. Times in seconds, sizes in bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerCost {
    /// Layer name.
    pub name: String,
    /// Forward time.
    pub forward: f64,
    /// Backward-for-inputs time (`I`).
    pub backward_input: f64,
    /// Backward-for-weights time (`W`).
    pub backward_weight: f64,
    /// Activation bytes held per microbatch from F until the end of W/B.
    pub activation_bytes: f64,
    /// Parameter bytes.
    pub parameter_bytes: f64,
    /// Bytes of the layer's output per microbatch (what crosses a stage boundary after it).
    #[serde(default)]
    pub output_bytes: f64,
}

/// A link between ranks: `time = latency + bytes / bandwidth`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkCost {
    /// Seconds per transfer.
    pub latency: f64,
    /// Bytes per second (`f64::INFINITY` for free transfers).
    pub bandwidth: f64,
}

impl Default for LinkCost {
    fn default() -> Self {
        LinkCost {
            latency: 0.0,
            bandwidth: f64::INFINITY,
        }
    }
}

impl LinkCost {
    /// Time to move `bytes` over this link.
    pub fn time(&self, bytes: f64) -> f64 {
        self.latency
            + if bytes > 0.0 {
                bytes / self.bandwidth
            } else {
                0.0
            }
    }
}

/// Cost of one stage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StageCost {
    /// Forward time.
    pub forward: f64,
    /// Backward-for-inputs time.
    pub backward_input: f64,
    /// Backward-for-weights time.
    pub backward_weight: f64,
    /// Full backward time (`B`); usually `backward_input + backward_weight`.
    pub backward: f64,
    /// Activation bytes held per microbatch from F until the end of W/B.
    pub activation_bytes: f64,
    /// Part of `activation_bytes` released when I finishes (the rest is held until W).
    pub released_at_input: f64,
    /// Parameter bytes.
    pub parameter_bytes: f64,
    /// Bytes sent to the next stage after F (and, as a gradient, back after I/B).
    pub output_bytes: f64,
}

impl StageCost {
    /// A stage with the given F, I, W times, `B = I + W`, and no memory or transfer sizes.
    pub fn uniform(forward: f64, backward_input: f64, backward_weight: f64) -> Self {
        StageCost {
            forward,
            backward_input,
            backward_weight,
            backward: backward_input + backward_weight,
            activation_bytes: 0.0,
            released_at_input: 0.0,
            parameter_bytes: 0.0,
            output_bytes: 0.0,
        }
    }
}

/// Everything the simulator needs to turn a schedule into predicted time.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// One entry per stage, `S` in all.
    pub stages: Vec<StageCost>,
    /// The link between any two distinct ranks.
    pub link: LinkCost,
    /// Overlapped F/B pair: time is `max(f, b) + overlap_share * min(f, b)`.
    pub overlap_share: f64,
}
