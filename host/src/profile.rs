//! Profiling: measure each layer's `F`, `I` and `W` time and its memory through the [`Stage`] trait.
//!
//! Any [`Stage`] can be profiled: the built-in layers and a custom trainer's alike. For each layer,
//! in model order (each layer's output is the next layer's input):
//!
//! 1. `warmup` untimed rounds of `F`, `I`, `W` (caches, allocator, lazy initialisation);
//! 2. `repeats` timed rounds; each op is timed alone with a monotonic clock ([`std::time::Instant`])
//!    and the **median** over the rounds is kept (robust to the odd preempted run);
//! 3. memory from the stash: `activation_bytes` is what the stash holds after `F`,
//!    `released_at_input` what `I` freed of it; `output_bytes` is the output tensor's size;
//!    `parameter_bytes` comes from the caller, who knows its weights (the trait does not expose them).
//!
//! Weight gradients accumulate during profiling and are zeroed at the end; weights never change (no
//! optimizer step). `B` is recorded as `I + W`. The upstream gradient used for `I` is a constant
//! tensor of the output's shape: time does not depend on its values for dense layers.
//!
//! On a GPU, a backend with asynchronous kernels must make each op finish before it returns (or time
//! with device events) for these host-clock timings to mean anything; the built-in CPU layers are
//! synchronous.

use std::time::Instant;

use thiserror::Error;

use crate::cost::LayerCost;
use crate::runtime::{Stage, StageError, Tensor};

/// Why profiling failed.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ProfileError {
    /// A layer failed while being profiled.
    #[error("profiling layer {index} (`{name}`): {source}")]
    Layer {
        /// Layer index.
        index: usize,
        /// Layer name.
        name: String,
        /// The layer's error.
        source: StageError,
    },
    /// Zero repeats asked for.
    #[error("repeats must be at least 1 (the median of zero runs is undefined)")]
    NoRepeats,
}

/// How many runs to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileOptions {
    /// Untimed rounds first.
    pub warmup: usize,
    /// Timed rounds; the median is kept.
    pub repeats: usize,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            warmup: 2,
            repeats: 7,
        }
    }
}

/// The median of `v` (mean of the middle two for even lengths); 0 for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// One round of F, I, W: times in seconds, held bytes after F and after I, and the output.
struct Round {
    times: [f64; 3],
    held_after_f: usize,
    held_after_i: usize,
    output: Tensor,
}

fn round<S: Stage>(stage: &mut S, input: &Tensor) -> Result<Round, StageError> {
    let t0 = Instant::now();
    let (output, mut stash) = stage.forward(input.clone())?;
    let f = t0.elapsed().as_secs_f64();
    let held_after_f = stage.held_bytes(&stash);
    let grad = Tensor::new(output.shape().to_vec(), vec![1.0; output.len()])?;
    let t1 = Instant::now();
    let _grad_input = stage.backward_input(&mut stash, grad)?;
    let i = t1.elapsed().as_secs_f64();
    let held_after_i = stage.held_bytes(&stash);
    let t2 = Instant::now();
    stage.backward_weight(stash)?;
    let w = t2.elapsed().as_secs_f64();
    Ok(Round {
        times: [f, i, w],
        held_after_f,
        held_after_i,
        output,
    })
}

/// Profiles one layer on `input`; returns its cost and its output (the next layer's input).
pub fn profile_stage<S: Stage>(
    name: &str,
    stage: &mut S,
    input: &Tensor,
    parameter_bytes: f64,
    options: ProfileOptions,
) -> Result<(LayerCost, Tensor), StageError> {
    for _ in 0..options.warmup {
        round(stage, input)?;
    }
    let mut samples: [Vec<f64>; 3] = Default::default();
    let mut last = None;
    for _ in 0..options.repeats.max(1) {
        let r = round(stage, input)?;
        for (k, t) in r.times.iter().enumerate() {
            samples[k].push(*t);
        }
        last = Some(r);
    }
    stage.zero_grad();
    let r = last.ok_or_else(|| StageError::new("no profiling round ran"))?;
    let [mut f, mut i, mut w] = samples;
    let mut cost = LayerCost::new(name, median(&mut f), median(&mut i), median(&mut w));
    cost.activation_bytes = r.held_after_f as f64;
    cost.released_at_input = r.held_after_f.saturating_sub(r.held_after_i) as f64;
    cost.parameter_bytes = parameter_bytes;
    cost.output_bytes = r.output.bytes() as f64;
    Ok((cost, r.output))
}

/// A layer to profile: its name, the layer, and its parameter bytes.
pub struct ProfiledLayer<'a, S: Stage> {
    /// Name written to the cost file.
    pub name: String,
    /// The layer.
    pub stage: &'a mut S,
    /// Bytes of its weights (and anything else it holds for the whole step).
    pub parameter_bytes: f64,
}

/// Profiles layers in model order, feeding each one's output to the next.
pub fn profile_layers<S: Stage>(
    layers: Vec<ProfiledLayer<'_, S>>,
    input: Tensor,
    options: ProfileOptions,
) -> Result<Vec<LayerCost>, ProfileError> {
    if options.repeats == 0 {
        return Err(ProfileError::NoRepeats);
    }
    let mut x = input;
    let mut out = Vec::with_capacity(layers.len());
    for (index, l) in layers.into_iter().enumerate() {
        let (cost, y) =
            profile_stage(&l.name, l.stage, &x, l.parameter_bytes, options).map_err(|source| {
                ProfileError::Layer {
                    index,
                    name: l.name.clone(),
                    source,
                }
            })?;
        out.push(cost);
        x = y;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
