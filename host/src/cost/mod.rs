//! Cost models: what each stage's F, I and W cost, what it holds in memory, and what a transfer costs.
//!
//! There are three ways in, all checked field by field (errors name the field and the fix, see
//! [`CostError`]):
//!
//! - the **cost file** ([`CostFile`], module [`file`](mod@file)): per-layer costs, the one schema for measured
//!   (`pipefill profile`) and hand-written costs, turned into per-stage costs with a partition
//!   ([`CostModel::from_layers`]);
//! - the **per-stage file** (same fields under `"stages"` instead of `"layers"`), read by
//!   [`CostInput::parse`];
//! - the **`--cost` flag** (`F=1,I=1,W=1`, module [`flag`]): one rank's work, split evenly over its
//!   chunks.
//!
//! A [`CostModel`] is what the simulator consumes: one [`StageCost`] per stage, one [`LinkCost`] for
//! every pair of distinct ranks, and the share of an overlapped F/B pair that does not overlap.
//!
//! ## Backward times
//!
//! Every entry gives `forward` and enough of `backward_input` (I), `backward_weight` (W) and `backward`
//! (B, the fused full backward) to know all three ([`resolve_backward`]):
//!
//! | given | result |
//! | --- | --- |
//! | I, W | `B = I + W` |
//! | I, W, B | as given (a fused backward may be faster than `I + W`) |
//! | B, I | `W = B - I` |
//! | B, W | `I = B - W` |
//! | B only | `I = W = B / 2` (the zero-bubble papers' assumption; measure I and W for better predictions) |
//!
//! ## Memory
//!
//! `activation_bytes` are held per microbatch from the start of F until the end of the backward that
//! frees them: a `B` frees all of them; with split backward, `I` frees `released_at_input` of them
//! and `W` the rest (as in the zero-bubble papers, where W keeps only the inputs of the weight GEMMs).

use serde::{Deserialize, Serialize};

mod check;
pub mod dtype;
mod error;
pub mod file;
pub mod flag;
mod measured;
mod model;
pub mod recompute;
pub mod scaling;

pub use dtype::ActivationDtype;
pub use error::CostError;
pub use file::{CostFile, CostInput};
pub use flag::parse_cost_flag;
pub use model::{split_even, CostSpec};
pub use recompute::{Recompute, RecomputeChoice};
pub use scaling::{FixedCost, SizeSample};

use crate::schedule::deps::Footprint;
use crate::schedule::Op;

/// Measured or hand-written cost of one layer, as in the cost file. Times in seconds, sizes in bytes.
///
/// Build one with [`LayerCost::new`] (then set the byte fields), or read a cost file with
/// [`CostFile::parse`]; [`LayerCost::check`] tells whether every field is usable.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerCost {
    /// Layer name.
    pub name: String,
    /// Forward time (`F`).
    pub forward: f64,
    /// Backward-for-inputs time (`I`).
    pub backward_input: f64,
    /// Backward-for-weights time (`W`).
    pub backward_weight: f64,
    /// Full backward time (`B`); `backward_input + backward_weight` unless measured separately.
    pub backward: f64,
    /// Activation bytes held per microbatch from F until the end of W/B.
    pub activation_bytes: f64,
    /// Part of `activation_bytes` freed when I finishes (the rest is held until W). 0 when unknown.
    pub released_at_input: f64,
    /// Parameter bytes.
    pub parameter_bytes: f64,
    /// Bytes of the layer's output per microbatch (what crosses a stage boundary after it).
    pub output_bytes: f64,
    /// Bytes of the layer's stash that selective recomputation drops after `F` and rebuilds before
    /// `I`/`B` from the stash of the layer before it (cost file `"selective_bytes"`, default 0:
    /// nothing selective). Counted only where that layer is in the same stage (module [`recompute`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub selective_bytes: f64,
    /// Time the rebuild of [`selective_bytes`](LayerCost::selective_bytes) takes (cost file
    /// `"selective_time"`, default 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub selective_time: f64,
    /// The part of F, I, W that does not grow with the microbatch size (cost file `"fixed"`);
    /// `None`: unknown, times scale linearly (see [`scaling`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fixed: Option<FixedCost>,
    /// The layer's times measured at other microbatch sizes (cost file `"samples"`); when given,
    /// times at other sizes are interpolated between them instead of following `fixed` (see
    /// [`scaling`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<SizeSample>,
}

impl LayerCost {
    /// A layer with the given F, I, W times, `B = I + W`, and all byte sizes 0.
    pub fn new(
        name: impl Into<String>,
        forward: f64,
        backward_input: f64,
        backward_weight: f64,
    ) -> Self {
        LayerCost {
            name: name.into(),
            forward,
            backward_input,
            backward_weight,
            backward: backward_input + backward_weight,
            activation_bytes: 0.0,
            released_at_input: 0.0,
            parameter_bytes: 0.0,
            output_bytes: 0.0,
            selective_bytes: 0.0,
            selective_time: 0.0,
            fixed: None,
            samples: Vec::new(),
        }
    }

    /// `F + I + W`: the layer's share of a stage's work per microbatch with split backward.
    pub fn total(&self) -> f64 {
        self.forward + self.backward_input + self.backward_weight
    }

    /// The layer's times and sizes as a [`StageCost`] (a one-layer stage), without name or fixed part.
    pub fn numbers(&self) -> StageCost {
        StageCost {
            forward: self.forward,
            backward_input: self.backward_input,
            backward_weight: self.backward_weight,
            backward: self.backward,
            activation_bytes: self.activation_bytes,
            released_at_input: self.released_at_input,
            parameter_bytes: self.parameter_bytes,
            output_bytes: self.output_bytes,
            input_bytes: 0.0,
            selective_bytes: self.selective_bytes,
            selective_time: self.selective_time,
            recompute: Recompute::None,
        }
    }

    /// Checks every field (finite, non-negative, `released_at_input <= activation_bytes`, the fixed
    /// part within the times, samples at distinct positive scales other than 1), naming
    /// fields under `path` (e.g. `layers[3]`).
    pub fn check(&self, path: &str) -> Result<(), CostError> {
        self.numbers().check(path)?;
        if let Some(f) = &self.fixed {
            f.check(path, self)?;
        }
        scaling::check_samples(path, &self.samples)
    }
}

/// A link between ranks: `time = latency + bytes / bandwidth`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkCost {
    /// Seconds per transfer.
    pub latency: f64,
    /// Bytes per second (`f64::INFINITY` for free transfers; written as `null` in the cost file and
    /// in serialised cost models, and read back as infinity).
    #[serde(deserialize_with = "bandwidth_or_null")]
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
    #[inline]
    pub fn time(&self, bytes: f64) -> f64 {
        self.latency
            + if bytes > 0.0 {
                bytes / self.bandwidth
            } else {
                0.0
            }
    }

    /// Checks latency (`>= 0`) and bandwidth (`> 0`, infinity allowed), naming fields under `path`.
    pub fn check(&self, path: &str) -> Result<(), CostError> {
        // The field's name is written only for the error (as in [`StageCost::check`]).
        let (latency, bandwidth) = (check::Quantity::Seconds, check::Quantity::BytesPerSecond);
        if latency.problem(self.latency).is_some() {
            latency.check(&format!("{path}.latency"), self.latency)?;
        }
        if self.bandwidth != f64::INFINITY && bandwidth.problem(self.bandwidth).is_some() {
            bandwidth.check(&format!("{path}.bandwidth"), self.bandwidth)?;
        }
        Ok(())
    }
}

/// Reads a bandwidth written by [`LinkCost`]'s `Serialize`: a number, or `null` for unlimited.
fn bandwidth_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// Cost of one stage: the sum of its layers' times and memory, and the size of what it sends on.
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
    /// Bytes of the stage's input per microbatch (the previous stage's output): what full
    /// recomputation keeps between `F` and the backward.
    #[serde(default)]
    pub input_bytes: f64,
    /// Bytes of the stash selective recomputation drops after `F` and rebuilds before `I`/`B`
    /// (0: the stage declares nothing selective, and cannot run [`Recompute::Selective`]).
    #[serde(default)]
    pub selective_bytes: f64,
    /// Time the selective rebuild adds to `I`/`B`.
    #[serde(default)]
    pub selective_time: f64,
    /// How the stage keeps what its backward needs (module [`recompute`]).
    #[serde(default)]
    pub recompute: Recompute,
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
            input_bytes: 0.0,
            selective_bytes: 0.0,
            selective_time: 0.0,
            recompute: Recompute::None,
        }
    }

    /// Whether the stage declares part of its stash rebuildable cheaply (`selective_bytes > 0`),
    /// so that it can run [`Recompute::Selective`].
    #[inline]
    pub fn selective(&self) -> bool {
        self.selective_bytes > 0.0
    }

    /// The same stage run with recomputation `mode`; [`Recompute::Selective`] on a stage that
    /// declares nothing selective is [`Recompute::None`] (what its runtime does: it drops nothing).
    pub fn with_recompute(mut self, mode: Recompute) -> Self {
        self.recompute = match mode {
            Recompute::Selective if !self.selective() => Recompute::None,
            mode => mode,
        };
        self
    }

    /// Time the forward takes again before `I` or `B` (0 without recomputation).
    #[inline]
    pub fn rebuild_time(&self) -> f64 {
        match self.recompute {
            Recompute::None => 0.0,
            Recompute::Full => self.forward,
            Recompute::Selective => self.selective_time,
        }
    }

    /// Bytes of the stash not held between `F` and the backward, rebuilt at the start of `I` or `B`.
    #[inline]
    pub fn rebuilt_bytes(&self) -> f64 {
        match self.recompute {
            Recompute::None => 0.0,
            Recompute::Full => (self.activation_bytes - self.input_bytes).max(0.0),
            Recompute::Selective => self.selective_bytes.min(self.activation_bytes),
        }
    }

    /// What one microbatch of this stage holds, in bytes: allocated by `F`, partly released by `I`.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            bytes: self.activation_bytes,
            released_at_input: self.released_at_input,
            rebuilt: self.rebuilt_bytes(),
        }
    }

    /// The time of one op on this stage.
    #[inline]
    pub fn time(&self, op: Op) -> f64 {
        match op {
            Op::F => self.forward,
            Op::B => self.backward + self.rebuild_time(),
            Op::I => self.backward_input + self.rebuild_time(),
            Op::W => self.backward_weight,
        }
    }

    /// Bytes freed when `op` ends (0 for F, which allocates instead).
    #[inline]
    pub fn freed_by(&self, op: Op) -> f64 {
        match op {
            Op::F => 0.0,
            Op::B => self.activation_bytes,
            Op::I => self.released_at_input,
            Op::W => self.activation_bytes - self.released_at_input,
        }
    }

    /// Every field divided by `parts` except `output_bytes` (what crosses a boundary keeps its size):
    /// one of `parts` equal slices of this stage's layers.
    pub fn split(&self, parts: usize) -> StageCost {
        let d = parts.max(1) as f64;
        StageCost {
            forward: self.forward / d,
            backward_input: self.backward_input / d,
            backward_weight: self.backward_weight / d,
            backward: self.backward / d,
            activation_bytes: self.activation_bytes / d,
            released_at_input: self.released_at_input / d,
            parameter_bytes: self.parameter_bytes / d,
            output_bytes: self.output_bytes,
            input_bytes: self.input_bytes,
            selective_bytes: self.selective_bytes / d,
            selective_time: self.selective_time / d,
            recompute: self.recompute,
        }
    }

    /// Checks every field (finite, non-negative, `released_at_input <= activation_bytes`), naming them
    /// under `path` (e.g. `stages[2]`).
    pub fn check(&self, path: &str) -> Result<(), CostError> {
        let values = [
            ("forward", self.forward, check::Quantity::Seconds),
            (
                "backward_input",
                self.backward_input,
                check::Quantity::Seconds,
            ),
            (
                "backward_weight",
                self.backward_weight,
                check::Quantity::Seconds,
            ),
            ("backward", self.backward, check::Quantity::Seconds),
            (
                "activation_bytes",
                self.activation_bytes,
                check::Quantity::Bytes,
            ),
            (
                "released_at_input",
                self.released_at_input,
                check::Quantity::Bytes,
            ),
            (
                "parameter_bytes",
                self.parameter_bytes,
                check::Quantity::Bytes,
            ),
            ("output_bytes", self.output_bytes, check::Quantity::Bytes),
            ("input_bytes", self.input_bytes, check::Quantity::Bytes),
            (
                "selective_bytes",
                self.selective_bytes,
                check::Quantity::Bytes,
            ),
            (
                "selective_time",
                self.selective_time,
                check::Quantity::Seconds,
            ),
        ];
        for (name, v, q) in values {
            // The field's name is written only for the error: the simulator checks its cost model
            // on every run, and `auto` runs it thousands of times per request.
            if q.problem(v).is_some() {
                q.check(&format!("{path}.{name}"), v)?;
            }
        }
        if self.released_at_input > self.activation_bytes {
            return Err(CostError::field(
                format!("{path}.released_at_input"),
                format!(
                    "is larger than activation_bytes ({} > {})",
                    self.released_at_input, self.activation_bytes
                ),
                "released_at_input is the part of activation_bytes freed at I: at most activation_bytes",
            ));
        }
        if self.selective_bytes > self.activation_bytes {
            return Err(CostError::field(
                format!("{path}.selective_bytes"),
                format!(
                    "is larger than activation_bytes ({} > {})",
                    self.selective_bytes, self.activation_bytes
                ),
                "selective_bytes is the part of activation_bytes selective recomputation rebuilds: at most activation_bytes",
            ));
        }
        if self.recompute == Recompute::Selective && !self.selective() {
            return Err(CostError::field(
                format!("{path}.recompute"),
                "is \"selective\" but the stage declares nothing selective (selective_bytes is 0)",
                "give the stage's selective_bytes and selective_time, or write \"full\" or \"none\"",
            ));
        }
        Ok(())
    }
}

/// `true` for 0 (a field written only when set).
fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// Everything the simulator needs to turn a schedule into predicted time.
///
/// ```
/// use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// let m = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
/// assert_eq!(m.stages.len(), 4);
/// assert_eq!(m.pair_time(1.0, 2.0), 2.0); // overlap_share 0: a pair takes the longer half
/// m.check().unwrap();
/// ```
///
/// It serialises with serde (unlimited bandwidth as `null`); a deserialised model is not checked:
/// call [`CostModel::check`] on one read from outside.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// One entry per stage, `S` in all.
    pub stages: Vec<StageCost>,
    /// The link between any two distinct ranks.
    pub link: LinkCost,
    /// Overlapped F/B pair: time is `max(f, b) + overlap_share * min(f, b)`; 0 is perfect overlap,
    /// 1 none.
    pub overlap_share: f64,
}

impl CostModel {
    /// `stages` copies of `stage`, perfect overlap of F/B pairs.
    pub fn uniform(stage: StageCost, stages: usize, link: LinkCost) -> Self {
        CostModel {
            stages: vec![stage; stages],
            link,
            overlap_share: 0.0,
        }
    }

    /// The time of an overlapped pair whose halves take `f` and `b` alone.
    #[inline]
    pub fn pair_time(&self, f: f64, b: f64) -> f64 {
        f.max(b) + self.overlap_share * f.min(b)
    }

    /// Time of the transfer that leaves stage `stage` after F (or enters it as a gradient after the
    /// next stage's I/B): `link.time(stages[stage].output_bytes)`.
    #[inline]
    pub fn boundary_time(&self, stage: usize) -> f64 {
        self.link.time(self.stages[stage].output_bytes)
    }

    /// Checks every stage, the link and the overlap share; errors name `stages[i].field`.
    pub fn check(&self) -> Result<(), CostError> {
        if self.stages.is_empty() {
            return Err(CostError::field(
                "stages",
                "is empty",
                "give one cost per stage",
            ));
        }
        for (i, s) in self.stages.iter().enumerate() {
            s.check(&format!("stages[{i}]"))?;
        }
        self.link.check("transfer")?;
        check::Quantity::Share.check("overlap_share", self.overlap_share)?;
        Ok(())
    }
}

/// Completes the backward times from what was given (see the table in the [module docs](self)).
/// `path` names the entry in errors (e.g. `layers[3]`); returns `(I, W, B)`.
pub fn resolve_backward(
    path: &str,
    backward_input: Option<f64>,
    backward_weight: Option<f64>,
    backward: Option<f64>,
) -> Result<(f64, f64, f64), CostError> {
    let at = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    let give =
        "give backward_input and backward_weight (I and W), or backward (B), or B with one of I, W";
    match (backward_input, backward_weight, backward) {
        (Some(i), Some(w), None) => Ok((i, w, i + w)),
        (Some(i), Some(w), Some(b)) => Ok((i, w, b)),
        (Some(i), None, Some(b)) if i <= b => Ok((i, b - i, b)),
        (None, Some(w), Some(b)) if w <= b => Ok((b - w, w, b)),
        (Some(i), None, Some(b)) => Err(CostError::field(
            at("backward_input"),
            format!("is larger than backward ({i} > {b}), so backward_weight = backward - backward_input would be negative"),
            "backward is the full backward (I + W): make it at least backward_input",
        )),
        (None, Some(w), Some(b)) => Err(CostError::field(
            at("backward_weight"),
            format!("is larger than backward ({w} > {b})"),
            "backward is the full backward (I + W): make it at least backward_weight",
        )),
        (None, None, Some(b)) => Ok((b / 2.0, b / 2.0, b)),
        (Some(_), None, None) => Err(CostError::field(at("backward_weight"), "is missing", give)),
        (None, Some(_), None) => Err(CostError::field(at("backward_input"), "is missing", give)),
        (None, None, None) => Err(CostError::field(at("backward_input"), "is missing (no backward time given)", give)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_table() {
        assert_eq!(
            resolve_backward("x", Some(1.0), Some(2.0), None).unwrap(),
            (1.0, 2.0, 3.0)
        );
        assert_eq!(
            resolve_backward("x", Some(1.0), Some(2.0), Some(2.5)).unwrap(),
            (1.0, 2.0, 2.5)
        );
        assert_eq!(
            resolve_backward("x", Some(1.0), None, Some(3.0)).unwrap(),
            (1.0, 2.0, 3.0)
        );
        assert_eq!(
            resolve_backward("x", None, Some(1.0), Some(3.0)).unwrap(),
            (2.0, 1.0, 3.0)
        );
        assert_eq!(
            resolve_backward("x", None, None, Some(3.0)).unwrap(),
            (1.5, 1.5, 3.0)
        );
        let e = resolve_backward("layers[2]", Some(4.0), None, Some(3.0)).unwrap_err();
        assert!(e.to_string().contains("layers[2].backward_input"), "{e}");
        let e = resolve_backward("layers[0]", None, None, None).unwrap_err();
        assert!(e.to_string().contains("layers[0].backward_input"), "{e}");
        let e = resolve_backward("layers[0]", Some(1.0), None, None).unwrap_err();
        assert!(e.to_string().contains("layers[0].backward_weight"), "{e}");
    }

    #[test]
    fn model_checks_name_the_stage() {
        let mut m = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 3, LinkCost::default());
        m.stages[2].forward = f64::NAN;
        let e = m.check().unwrap_err().to_string();
        assert!(e.contains("stages[2].forward") && e.contains("NaN"), "{e}");
        m.stages[2].forward = 1.0;
        m.stages[1].released_at_input = 5.0;
        let e = m.check().unwrap_err().to_string();
        assert!(e.contains("stages[1].released_at_input"), "{e}");
    }

    #[test]
    fn split_keeps_boundary_bytes() {
        let mut s = StageCost::uniform(2.0, 4.0, 6.0);
        s.output_bytes = 10.0;
        s.activation_bytes = 8.0;
        let h = s.split(2);
        assert_eq!(
            (h.forward, h.backward, h.activation_bytes, h.output_bytes),
            (1.0, 5.0, 4.0, 10.0)
        );
    }
}
