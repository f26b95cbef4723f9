//! Profiling: measure each layer's `F`, `I` and `W` time and its memory through the [`Stage`] trait.
//!
//! Any [`Stage`] can be profiled: the built-in layers and a custom trainer's alike.
//! [`profile_layers`] runs rounds of two passes over the whole model, as training steps do: `F`
//! through every layer in order (each layer's output is the next layer's input), then the backward
//! from the last layer back to the first (each layer's input gradient is the previous layer's
//! upstream gradient): the fused `B` per layer in the first pass; every `I`, then every `W`, in the
//! second.
//!
//! 1. `warmup` untimed rounds (caches, allocator, lazy initialisation);
//! 2. `repeats` timed rounds; each call is timed alone with a monotonic clock
//!    ([`std::time::Instant`], or the thread's CPU clock: [`TimeSource`]) and each layer keeps the **median** over the rounds (robust to the
//!    odd preempted run). A layer is timed among the others, not in a loop of its own, so it does not
//!    find its weights and inputs in cache every time (it would measure too fast), and `W` runs
//!    after the other layers' `I`, as zero-bubble schedules defer it;
//! 3. memory from the stash: `activation_bytes` is what the stash holds after `F`,
//!    `released_at_input` what `I` freed of it; `output_bytes` is the output tensor's size;
//!    `parameter_bytes` comes from the caller, who knows its weights (the trait does not expose them).
//!
//! Weight gradients accumulate during profiling and are zeroed at the end; weights never change (no
//! optimizer step). `B` is measured on its own ([`Stage::backward`]; a fused backward may be faster
//! than `I + W`, and `W` right after `I` finds its inputs in cache). The last layer's upstream gradient is a tensor of
//! ones of its output's shape: time does not depend on the values for dense layers.
//!
//! To scale times to other microbatch sizes, profile the layers twice, at the microbatch size `rows`
//! and at a smaller `small_rows`, and let [`fit_fixed`] fit per layer and op the affine model
//! `time(r) = fixed + per_row * r` through the two medians (the cost file's `"fixed"`, see
//! [`crate::cost::scaling`]).
//!
//! Each op is timed alone, so the profile cannot tell how the backend runs an overlapped F/B pair
//! (DualPipeV's `(F;B)`): the backend states it ([`PairExecution`]), and the cost file records it once
//! as its `overlap_share`, which the simulator, `plan` and `train` read.
//!
//! On a GPU, a backend with asynchronous kernels must make each op finish before it returns (or time
//! with device events) for these host-clock timings to mean anything; the built-in CPU layers are
//! synchronous.

use std::time::Instant;

use thiserror::Error;

use crate::cost::{FixedCost, LayerCost};
use crate::runtime::{Stage, StageError, Tensor};

/// Why profiling failed.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
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
    /// The two profiles given to [`fit_fixed`] cannot be combined.
    #[error("cannot fit the fixed part: {0}")]
    Fit(String),
}

/// How many runs to make, and with which clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileOptions {
    /// Untimed rounds first.
    pub warmup: usize,
    /// Timed rounds; the median is kept.
    pub repeats: usize,
    /// What a call's time is read from.
    pub clock: TimeSource,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            warmup: 2,
            repeats: 7,
            clock: TimeSource::Wall,
        }
    }
}

/// The clock a profiled call is timed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeSource {
    /// Wall time ([`Instant`]): what the call took, including any time the thread was not running.
    #[default]
    Wall,
    /// The calling thread's CPU time ([`crate::cpu_time::thread_cpu_seconds`]): what the call took
    /// while it had a core. On a machine shared with other work this leaves out the time the thread
    /// was descheduled, so two profiles of the same layers agree where wall times would not; on a
    /// quiet machine the two agree. Only for backends whose calls run on the calling thread (the
    /// built-in CPU layers; not an asynchronous GPU). Where the clock cannot be read, wall time.
    ThreadCpu,
}

/// A started timing of one call.
#[derive(Debug, Clone, Copy)]
struct Stopwatch {
    wall: Instant,
    cpu: Option<f64>,
}

impl Stopwatch {
    fn start(source: TimeSource) -> Self {
        let cpu = match source {
            TimeSource::Wall => None,
            TimeSource::ThreadCpu => crate::cpu_time::thread_cpu_seconds(),
        };
        Stopwatch {
            wall: Instant::now(),
            cpu,
        }
    }

    /// Seconds since [`Stopwatch::start`] on its clock.
    fn seconds(&self) -> f64 {
        match (self.cpu, crate::cpu_time::thread_cpu_seconds()) {
            (Some(start), Some(now)) => (now - start).max(0.0),
            _ => self.wall.elapsed().as_secs_f64(),
        }
    }
}

/// How a backend runs the two halves of an overlapped F/B pair, which the profile's timings cannot
/// show (each op is timed alone). It decides the cost file's `overlap_share`: the simulator prices a
/// pair whose halves take `f` and `b` alone at `max(f, b) + overlap_share * min(f, b)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PairExecution {
    /// One half after the other (the CPU runtime, one thread per rank): nothing is hidden, a pair
    /// costs `f + b`, `overlap_share` 1.
    Sequential,
    /// Both halves at once (separate streams on a GPU): `overlap_share` of the shorter half is not
    /// hidden (0: perfect overlap).
    Concurrent {
        /// The share of the shorter half that is not hidden, in `0..=1`.
        overlap_share: f64,
    },
}

impl PairExecution {
    /// The cost file's `overlap_share` for this backend.
    ///
    /// ```
    /// use pipefill_host::profile::PairExecution;
    /// assert_eq!(PairExecution::Sequential.overlap_share(), 1.0);
    /// ```
    pub fn overlap_share(self) -> f64 {
        match self {
            PairExecution::Sequential => 1.0,
            PairExecution::Concurrent { overlap_share } => overlap_share,
        }
    }

    /// `sequential` or `concurrent` (the cost file's `meta.pair_execution`).
    pub fn name(self) -> &'static str {
        match self {
            PairExecution::Sequential => "sequential",
            PairExecution::Concurrent { .. } => "concurrent",
        }
    }
}

/// One layer's cost from its timing samples `[F, I, W, B]` (seconds; each the median) and its
/// memory `(held after F, held after I, output)` in bytes: what every profiler (the CPU one here,
/// the CUDA one in the `pipefill` crate) writes into the cost file.
pub fn measured_layer(
    name: &str,
    [f, i, w, b]: [&mut [f64]; 4],
    (after_f, after_i, output): (usize, usize, usize),
    parameter_bytes: f64,
) -> LayerCost {
    let mut cost = LayerCost::new(name, median(f), median(i), median(w));
    cost.backward = median(b);
    cost.activation_bytes = after_f as f64;
    cost.released_at_input = after_f.saturating_sub(after_i) as f64;
    cost.parameter_bytes = parameter_bytes;
    cost.output_bytes = output as f64;
    cost
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
///
/// Each round is two passes over the whole model, as training steps run it (see the module docs):
/// `F` through every layer, then the fused backward `B` layer by layer from the last; and `F` again,
/// then every layer's `I` from the last, then every layer's `W`, deferred after all of them (as
/// zero-bubble schedules defer it, so that `W` finds its inputs less fresh in cache than right after
/// `I`). Each call is timed alone, and each layer keeps the median over the rounds: `F` over both
/// passes, `B` from the first, `I` and `W` from the second.
pub fn profile_layers<S: Stage>(
    mut layers: Vec<ProfiledLayer<'_, S>>,
    input: Tensor,
    options: ProfileOptions,
) -> Result<Vec<LayerCost>, ProfileError> {
    if options.repeats == 0 {
        return Err(ProfileError::NoRepeats);
    }
    let n = layers.len();
    // Per layer: samples of F, I, W, B.
    let mut samples: Vec<[Vec<f64>; 4]> = (0..n).map(|_| Default::default()).collect();
    let mut memory = vec![(0usize, 0usize, 0usize); n];
    for round in 0..options.warmup + options.repeats {
        let timed = round >= options.warmup;
        let error = |layers: &[ProfiledLayer<'_, S>], (index, source): (usize, StageError)| {
            ProfileError::Layer {
                index,
                name: layers[index].name.clone(),
                source,
            }
        };
        let fused =
            fused_pass(&mut layers, &input, options.clock).map_err(|e| error(&layers, e))?;
        let split =
            split_pass(&mut layers, &input, options.clock).map_err(|e| error(&layers, e))?;
        for (l, (b, r)) in fused.into_iter().zip(split).enumerate() {
            if timed {
                let [f, i, w] = r.times;
                samples[l][0].extend([b.0, f]);
                samples[l][1].push(i);
                samples[l][2].push(w);
                samples[l][3].push(b.1);
            }
            memory[l] = (r.held_after_f, r.held_after_i, r.output.bytes());
        }
    }
    let mut out = Vec::with_capacity(n);
    for ((l, [mut f, mut i, mut w, mut b]), (after_f, after_i, output)) in
        layers.iter_mut().zip(samples).zip(memory)
    {
        l.stage.zero_grad();
        out.push(measured_layer(
            &l.name,
            [&mut f, &mut i, &mut w, &mut b],
            (after_f, after_i, output),
            l.parameter_bytes,
        ));
    }
    Ok(out)
}

/// The layers' forward in order: per layer, its time, held bytes, stash and output.
type Forward<T> = Vec<(f64, usize, T, Tensor)>;

fn forward_pass<S: Stage>(
    layers: &mut [ProfiledLayer<'_, S>],
    input: &Tensor,
    clock: TimeSource,
) -> Result<Forward<S::Stash>, (usize, StageError)> {
    let mut x = input.clone();
    let mut forward = Vec::with_capacity(layers.len());
    for (index, l) in layers.iter_mut().enumerate() {
        let t0 = Stopwatch::start(clock);
        let (y, stash) = l.stage.forward(x).map_err(|e| (index, e))?;
        let f = t0.seconds();
        let held = l.stage.held_bytes(&stash);
        forward.push((f, held, stash, y.clone()));
        x = y;
    }
    Ok(forward)
}

/// The upstream gradient for a layer with output `output`: the next layer's input gradient, or
/// ones for the last layer (and wherever a layer returned none of the right shape); time does not
/// depend on the values.
fn upstream(grad: Option<Tensor>, output: &Tensor) -> Result<Tensor, StageError> {
    match grad {
        Some(g) if g.shape() == output.shape() => Ok(g),
        _ => Ok(Tensor::new(
            output.shape().to_vec(),
            vec![1.0; output.len()],
        )?),
    }
}

/// `F` through every layer, then `B` from the last layer back: per layer, `(F, B)` seconds.
fn fused_pass<S: Stage>(
    layers: &mut [ProfiledLayer<'_, S>],
    input: &Tensor,
    clock: TimeSource,
) -> Result<Vec<(f64, f64)>, (usize, StageError)> {
    let mut forward = forward_pass(layers, input, clock)?;
    let mut times = vec![(0.0, 0.0); layers.len()];
    let mut grad = None;
    for (index, l) in layers.iter_mut().enumerate().rev() {
        let (f, _, stash, output) = forward
            .pop()
            .ok_or((index, StageError::new("profiling lost a stash")))?;
        let dy = upstream(grad.take(), &output).map_err(|e| (index, e))?;
        let t = Stopwatch::start(clock);
        let dx = l.stage.backward(stash, dy).map_err(|e| (index, e))?;
        times[index] = (f, t.seconds());
        grad = Some(dx);
    }
    Ok(times)
}

/// `F` through every layer, `I` from the last layer back, then every `W` (last layer first).
fn split_pass<S: Stage>(
    layers: &mut [ProfiledLayer<'_, S>],
    input: &Tensor,
    clock: TimeSource,
) -> Result<Vec<Round>, (usize, StageError)> {
    let mut forward = forward_pass(layers, input, clock)?;
    let mut pending = Vec::with_capacity(layers.len());
    let mut grad = None;
    for (index, l) in layers.iter_mut().enumerate().rev() {
        let (f, held_after_f, mut stash, output) = forward
            .pop()
            .ok_or((index, StageError::new("profiling lost a stash")))?;
        let dy = upstream(grad.take(), &output).map_err(|e| (index, e))?;
        let t = Stopwatch::start(clock);
        let dx = l
            .stage
            .backward_input(&mut stash, dy)
            .map_err(|e| (index, e))?;
        let i = t.seconds();
        let held_after_i = l.stage.held_bytes(&stash);
        grad = Some(dx);
        pending.push((index, f, i, held_after_f, held_after_i, stash, output));
    }
    let mut rounds: Vec<Option<Round>> = (0..layers.len()).map(|_| None).collect();
    for (index, f, i, held_after_f, held_after_i, stash, output) in pending {
        let t = Stopwatch::start(clock);
        layers[index]
            .stage
            .backward_weight(stash)
            .map_err(|e| (index, e))?;
        let w = t.seconds();
        rounds[index] = Some(Round {
            times: [f, i, w],
            held_after_f,
            held_after_i,
            output,
        });
    }
    Ok(rounds.into_iter().flatten().collect())
}

/// The fixed part of the line through `(small_rows, small)` and `(rows, t)`, clamped to `0..=t`: a
/// negative intercept (superlinear growth, or noise) is taken as linear, and a time that shrank with
/// more rows (noise) as all fixed.
fn intercept(t: f64, rows: f64, small: f64, small_rows: f64) -> f64 {
    let per_row = (t - small) / (rows - small_rows);
    (t - per_row * rows).clamp(0.0, t)
}

/// Sets each layer's fixed part ([`LayerCost::fixed`]) from the same layers profiled at `small_rows`
/// (`small`, in the same order) and at `rows` (`costs`, whose times stay the measured ones).
///
/// ```
/// use pipefill_host::cost::LayerCost;
/// use pipefill_host::profile::fit_fixed;
/// let mut at32 = vec![LayerCost::new("a", 0.0042, 0.004, 0.0034)];
/// let at4 = vec![LayerCost::new("a", 0.0014, 0.001, 0.0006)];
/// fit_fixed(&mut at32, 32, &at4, 4).unwrap();
/// let f = at32[0].fixed.unwrap();
/// assert!((f.forward - 0.001).abs() < 1e-12); // per_row 0.0001
/// ```
pub fn fit_fixed(
    costs: &mut [LayerCost],
    rows: usize,
    small: &[LayerCost],
    small_rows: usize,
) -> Result<(), ProfileError> {
    if small_rows == 0 || small_rows >= rows {
        return Err(ProfileError::Fit(format!(
            "the second microbatch size ({small_rows} rows) must be at least 1 and below {rows}"
        )));
    }
    if small.len() != costs.len() {
        return Err(ProfileError::Fit(format!(
            "{} layers profiled at {small_rows} rows, {} at {rows}",
            small.len(),
            costs.len()
        )));
    }
    let (r, s) = (rows as f64, small_rows as f64);
    for (c, lo) in costs.iter_mut().zip(small) {
        c.fixed = Some(FixedCost {
            forward: intercept(c.forward, r, lo.forward, s),
            backward_input: intercept(c.backward_input, r, lo.backward_input, s),
            backward_weight: intercept(c.backward_weight, r, lo.backward_weight, s),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_an_affine_cost_and_clamps_noise() {
        // time(r) = 0.5 + 0.25 r for F; W grows superlinearly; I shrinks with rows (noise).
        let mut at = vec![LayerCost::new("a", 0.5 + 0.25 * 16.0, 1.0, 16.0)];
        let small = vec![LayerCost::new("a", 0.5 + 0.25 * 4.0, 2.0, 1.0)];
        fit_fixed(&mut at, 16, &small, 4).unwrap();
        let f = at[0].fixed.unwrap();
        assert!((f.forward - 0.5).abs() < 1e-12, "{f:?}");
        assert_eq!(f.backward_input, 1.0);
        assert_eq!(f.backward_weight, 0.0);
        // The fitted layer passes the cost file's checks and reproduces both measurements.
        at[0].check("layers[0]").unwrap();
        assert!((at[0].scaled(0.25).forward - small[0].forward).abs() < 1e-12);
        assert!(fit_fixed(&mut at, 4, &small, 4).is_err());
        assert!(fit_fixed(&mut at, 16, &[], 4).is_err());
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
