//! `pipefill profile --backend cuda`: every layer's `F`, `I`, `W` (and fused `B`) timed on the device
//! with CUDA events, in the same passes as the host profiler ([`pipefill_host::profile`]): `F`
//! through the whole model then `B` layer by layer from the last; `F` again, every `I` from the
//! last, then every `W`. Each layer keeps the median over the timed rounds; memory comes from the
//! device stash as on the CPU. The result is the same [`LayerCost`] list the CPU profile gives, so
//! the cost file is written by the same code.

use std::sync::Arc;

use pipefill_host::cost::LayerCost;
use pipefill_host::profile::{measured_layer, ProfileOptions};
use pipefill_host::runtime::Tensor;

use super::device::Gpu;
use super::error::CudaError;
use super::launch::Launcher;
use super::stage::{CudaStage, CudaStash};
use super::tensor::DeviceTensor;
use super::timing::Span;
use pipefill_model::layers::LinearStage;

/// A layer to profile on the device: its name, the layer (as a one-layer stage) and its
/// parameter bytes.
pub struct DeviceLayer {
    /// Name written to the cost file.
    pub name: String,
    /// The layer on the device.
    pub stage: CudaStage,
    /// Bytes of its weights.
    pub parameter_bytes: f64,
}

/// One round's spans and memory of one layer.
#[derive(Default)]
struct Samples {
    f: Vec<f64>,
    i: Vec<f64>,
    w: Vec<f64>,
    b: Vec<f64>,
    memory: (usize, usize, usize),
}

/// The one-layer host stages copied to `gpu` computing in `precision`, all on one new stream
/// (profiling runs them in order).
pub fn device_layers(
    gpu: &Arc<Gpu>,
    layers: Vec<(String, LinearStage, f64)>,
    precision: super::Precision,
) -> Result<Vec<DeviceLayer>, CudaError> {
    let launcher = Launcher::new(gpu.clone(), gpu.new_stream()?);
    layers
        .into_iter()
        .map(|(name, stage, parameter_bytes)| {
            Ok(DeviceLayer {
                name,
                stage: CudaStage::on_stream_in(launcher.clone(), &stage, precision)?,
                parameter_bytes,
            })
        })
        .collect()
}

/// Profiles `layers` in model order on `input` (see the module docs).
pub fn profile_device_layers(
    layers: &mut [DeviceLayer],
    input: &Tensor,
    options: ProfileOptions,
) -> Result<Vec<LayerCost>, CudaError> {
    let Some(first) = layers.first() else {
        return Ok(Vec::new());
    };
    let launcher = first.stage.launcher().clone();
    let mut samples: Vec<Samples> = layers.iter().map(|_| Samples::default()).collect();
    for round in 0..options.warmup + options.repeats.max(1) {
        let fused = fused_round(layers, &launcher, input)?;
        let split = split_round(layers, &launcher, input)?;
        if round < options.warmup {
            continue;
        }
        for (s, ((f1, b), (f2, i, w, mem))) in samples.iter_mut().zip(fused.into_iter().zip(split))
        {
            s.f.extend([f1.seconds()?, f2.seconds()?]);
            s.b.push(b.seconds()?);
            s.i.push(i.seconds()?);
            s.w.push(w.seconds()?);
            s.memory = mem;
        }
    }
    let mut out = Vec::with_capacity(layers.len());
    for (l, mut s) in layers.iter_mut().zip(samples) {
        l.stage.zero_grad_device();
        out.push(measured_layer(
            &l.name,
            [&mut s.f, &mut s.i, &mut s.w, &mut s.b],
            s.memory,
            l.parameter_bytes,
        ));
    }
    Ok(out)
}

/// `F` through every layer: per layer its span, its stash and its output's shape.
fn forward_all(
    layers: &mut [DeviceLayer],
    launcher: &Launcher,
    input: &Tensor,
) -> Result<Vec<(Span, CudaStash, Vec<usize>)>, CudaError> {
    let stream = launcher.stream();
    let mut x = DeviceTensor::from_host(stream, input)?;
    let mut out = Vec::with_capacity(layers.len());
    for l in layers.iter_mut() {
        let ((y, stash), span) = Span::around(stream, || l.stage.forward_device(x))?;
        let shape = y.shape().to_vec();
        // The next layer's input; the last output is dropped (its values are not needed).
        x = y;
        out.push((span, stash, shape));
    }
    Ok(out)
}

/// The upstream gradient for a layer whose output has `shape`: the next layer's input gradient, or
/// ones (time does not depend on the values).
fn upstream(
    launcher: &Launcher,
    grad: Option<DeviceTensor>,
    shape: &[usize],
) -> Result<DeviceTensor, CudaError> {
    match grad {
        Some(g) if g.shape() == shape => Ok(g),
        _ => {
            let n = shape.iter().product();
            DeviceTensor::from_values(launcher.stream(), shape.to_vec(), &vec![1.0; n])
        }
    }
}

/// `F` through every layer, then the fused `B` (I then W) from the last: per layer `(F, B)` spans.
fn fused_round(
    layers: &mut [DeviceLayer],
    launcher: &Launcher,
    input: &Tensor,
) -> Result<Vec<(Span, Span)>, CudaError> {
    let stream = launcher.stream();
    let mut forward = forward_all(layers, launcher, input)?;
    let mut spans = Vec::with_capacity(layers.len());
    let mut grad = None;
    for l in layers.iter_mut().rev() {
        let Some((f, mut stash, shape)) = forward.pop() else {
            break;
        };
        let dy = upstream(launcher, grad.take(), &shape)?;
        let (dx, b) = Span::around(stream, || {
            let dx = l.stage.backward_input_device(&mut stash, dy)?;
            l.stage.backward_weight_device(stash)?;
            Ok(dx)
        })?;
        grad = Some(dx);
        spans.push((f, b));
    }
    spans.reverse();
    Ok(spans)
}

/// One layer's spans of the split round and its memory (after F, after I, output bytes).
type SplitSpans = (Span, Span, Span, (usize, usize, usize));

/// `F` through every layer, every `I` from the last, then every `W` (last layer first).
fn split_round(
    layers: &mut [DeviceLayer],
    launcher: &Launcher,
    input: &Tensor,
) -> Result<Vec<SplitSpans>, CudaError> {
    let stream = launcher.stream();
    let mut forward = forward_all(layers, launcher, input)?;
    let mut pending = Vec::with_capacity(layers.len());
    let mut grad = None;
    for (index, l) in layers.iter_mut().enumerate().rev() {
        let Some((f, mut stash, shape)) = forward.pop() else {
            break;
        };
        let after_f = stash.bytes();
        // In the stored type, as the host tensor the stage hands on (BF16 under --activations bf16).
        let output = shape.iter().product::<usize>() * l.stage.activations.bytes() as usize;
        let dy = upstream(launcher, grad.take(), &shape)?;
        let (dx, i) = Span::around(stream, || l.stage.backward_input_device(&mut stash, dy))?;
        let after_i = stash.bytes();
        grad = Some(dx);
        pending.push((index, f, i, stash, (after_f, after_i, output)));
    }
    let mut out: Vec<Option<SplitSpans>> = layers.iter().map(|_| None).collect();
    for (index, f, i, stash, mem) in pending {
        let stage = &mut layers[index].stage;
        let ((), w) = Span::around(stream, || stage.backward_weight_device(stash))?;
        out[index] = Some((f, i, w, mem));
    }
    Ok(out.into_iter().flatten().collect())
}
