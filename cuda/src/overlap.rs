//! Kernel-level overlap on one GPU, measured: one stage's `F` kernels on one stream and another
//! stage's `B` kernels (`I` then `W`) on a second stream, alone and together
//! (`pipefill bench overlap`).
//!
//! The simulator prices an overlapped pair whose halves take `f` and `b` alone at
//! `max(f, b) + overlap_share * min(f, b)`; a measured pair time gives
//! `overlap_share = (pair - max(f, b)) / min(f, b)` ([`OverlapResult::share`]), 0 for perfect
//! overlap and 1 for none.

use std::sync::Arc;

use pipefill_host::profile::median;
use pipefill_host::runtime::Tensor;
use pipefill_kernels::Activation;

use super::device::Gpu;
use super::error::CudaError;
use super::launch::Launcher;
use super::stage::{CudaStage, CudaStash};
use super::tensor::DeviceTensor;
use super::timing::{mark, Span};
use pipefill_model::layers::gemm::GemmBackend;
use pipefill_model::layers::{Linear, LinearStage, Optimizer};

/// The shape of the two stages measured: `layers` square layers of width `hidden` each, on
/// microbatches of `rows` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverlapSize {
    /// Layer width.
    pub hidden: usize,
    /// Rows per microbatch.
    pub rows: usize,
    /// Layers per stage.
    pub layers: usize,
    /// The layers' arithmetic.
    pub precision: super::Precision,
}

/// Median device times (seconds) of the F half alone, the B half alone and the two together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverlapResult {
    /// What was measured.
    pub size: OverlapSize,
    /// One stage's `F` alone.
    pub forward: f64,
    /// The other stage's `B` (`I` then `W`) alone.
    pub backward: f64,
    /// Both at once on two streams, from the common start to the later end.
    pub pair: f64,
}

impl OverlapResult {
    /// The measured `overlap_share`: `(pair - max) / min`, clamped to `0..=1` (noise can put it
    /// slightly outside).
    pub fn share(&self) -> f64 {
        let (hi, lo) = (
            self.forward.max(self.backward),
            self.forward.min(self.backward),
        );
        if lo <= 0.0 {
            return 1.0;
        }
        ((self.pair - hi) / lo).clamp(0.0, 1.0)
    }
}

/// A stage of `size.layers` GELU layers with fixed pseudo-random weights, on its own stream.
fn stage(gpu: &Arc<Gpu>, size: OverlapSize, salt: usize) -> Result<CudaStage, CudaError> {
    let h = size.hidden;
    let scale = (3.0 / h as f32).sqrt();
    let layers = (0..size.layers)
        .map(|l| {
            let w = (0..h * h)
                .map(|i| {
                    let k = (i * 7919 + l * 104_729 + salt * 31) % 2003;
                    (k as f32 / 1001.5 - 1.0) * scale
                })
                .collect();
            Linear::new(h, h, Activation::Gelu, w, vec![0.0; h])
        })
        .collect();
    let host = LinearStage::new(layers, Optimizer::sgd(0.0), GemmBackend::default(), false);
    CudaStage::on_stream_in(
        Launcher::new(gpu.clone(), gpu.new_stream()?),
        &host,
        size.precision,
    )
}

fn input(stage: &CudaStage, size: OverlapSize) -> Result<DeviceTensor, CudaError> {
    let n = size.rows * size.hidden;
    let values: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 / 48.5) - 1.0).collect();
    let t = Tensor::matrix(size.rows, size.hidden, values).map_err(|e| CudaError::Shape {
        what: format!("overlap input ({e})"),
        expected: n,
        got: n,
    })?;
    DeviceTensor::from_host(stage.stream(), &t)
}

/// Runs `F` on `b_stage` (untimed) and waits: the stash its timed `B` needs.
fn prepare(
    b_stage: &mut CudaStage,
    size: OverlapSize,
) -> Result<(CudaStash, DeviceTensor), CudaError> {
    let x = input(b_stage, size)?;
    let (y, stash) = b_stage.forward_device(x)?;
    let dy = DeviceTensor::from_values(b_stage.stream(), y.shape().to_vec(), &vec![1.0; y.len()])?;
    b_stage.synchronize()?;
    Ok((stash, dy))
}

fn backward(stage: &mut CudaStage, stash: CudaStash, dy: DeviceTensor) -> Result<(), CudaError> {
    let mut stash = stash;
    stage.backward_input_device(&mut stash, dy)?;
    stage.backward_weight_device(stash)
}

/// Measures `size`: `repeats` rounds (after one warm-up) of F alone, B alone and both together;
/// the medians.
pub fn measure_overlap(
    gpu: &Arc<Gpu>,
    size: OverlapSize,
    repeats: usize,
) -> Result<OverlapResult, CudaError> {
    let mut fs = stage(gpu, size, 1)?;
    let mut bs = stage(gpu, size, 2)?;
    let (f_stream, b_stream) = (fs.stream().clone(), bs.stream().clone());
    let (mut f_t, mut b_t, mut p_t) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..repeats.max(1) + 1 {
        // F alone.
        let x = input(&fs, size)?;
        fs.synchronize()?;
        let (_, f_span) = Span::around(&f_stream, || fs.forward_device(x))?;
        let f = f_span.seconds()?;
        // B alone.
        let (stash, dy) = prepare(&mut bs, size)?;
        let ((), b_span) = Span::around(&b_stream, || backward(&mut bs, stash, dy))?;
        let b = b_span.seconds()?;
        // Both: B's stream starts when F's does; F's stream ends after B's.
        let x = input(&fs, size)?;
        fs.synchronize()?;
        let (stash, dy) = prepare(&mut bs, size)?;
        let start = mark(fs.stream())?;
        bs.stream()
            .wait(&start)
            .map_err(CudaError::driver("cuStreamWaitEvent"))?;
        let _out = fs.forward_device(x)?;
        backward(&mut bs, stash, dy)?;
        let b_done = mark(bs.stream())?;
        fs.stream()
            .wait(&b_done)
            .map_err(CudaError::driver("cuStreamWaitEvent"))?;
        let end = mark(fs.stream())?;
        let pair = Span::between(start, end).seconds()?;
        if round > 0 {
            f_t.push(f);
            b_t.push(b);
            p_t.push(pair);
        }
    }
    Ok(OverlapResult {
        size,
        forward: median(&mut f_t),
        backward: median(&mut b_t),
        pair: median(&mut p_t),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(f: f64, b: f64, pair: f64) -> OverlapResult {
        OverlapResult {
            size: OverlapSize {
                hidden: 1,
                rows: 1,
                layers: 1,
                precision: super::super::Precision::Tf32,
            },
            forward: f,
            backward: b,
            pair,
        }
    }

    #[test]
    fn share_is_the_unhidden_part_of_the_shorter_half() {
        assert_eq!(result(2.0, 1.0, 3.0).share(), 1.0);
        assert_eq!(result(2.0, 1.0, 2.0).share(), 0.0);
        assert!((result(2.0, 1.0, 2.25).share() - 0.25).abs() < 1e-12);
        assert_eq!(result(2.0, 1.0, 1.5).share(), 0.0, "clamped below");
        assert_eq!(result(2.0, 0.0, 2.0).share(), 1.0, "nothing to hide");
    }
}
