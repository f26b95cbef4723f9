//! An embedder's own device and stage type, trained with a zero-bubble schedule (ZB-V) through
//! `pipefill-host`'s public API, and checked against `sequential_step` every step.
//!
//! [`Inline`] is the smallest useful [`Device`]: one host thread, where "enqueuing" work on a stream
//! runs it at once. Streams are still real to the runtime: it creates one per rank (two where a
//! schedule overlaps), records an event after each producer and waits on it before each consumer,
//! and reads timing marks around every action into the step's timeline. Running inline is correct
//! because the [`StreamExecutor`] enqueues in an order that respects every dependency; `wait`
//! checks that promise instead of trusting it. A real device (CUDA, a remote accelerator) does the
//! same calls, with work that runs later on the stream each stage call is given
//! ([`Device::Stream`]: here `()`, as nothing is queued).
//!
//! [`Tanh`] is the embedder's stage type: `y = tanh(w x)` with one scalar weight and plain SGD. A
//! host [`Stage`] runs on any device whose payload is a host [`Tensor`], ignoring the stream; a
//! stage of a device that queues work implements `StreamStage<ItsDevice>`, whose methods take the
//! stream. The optimizer is the trainer's call after each step ([`StreamExecutor::optimizer_step`]).
//!
//! ```sh
//! cargo run --release --example custom_device       # zbv, 2 ranks, 4 stages, 8 microbatches
//! ```

use std::time::Instant;

use pipefill_host::runtime::streams::{Device, DeviceError, StreamExecutor, StreamId};
use pipefill_host::runtime::{sequential_step, Stage, StageError, Tensor};
use pipefill_host::schedule::{families, Params};

/// A device that runs everything inline on the calling thread.
#[derive(Default)]
pub struct Inline {
    /// Per stream: how many events it has recorded (an event is `(stream, count)`).
    recorded: Vec<usize>,
}

impl Device for Inline {
    type Payload = Tensor;
    type Stream = ();
    type Event = (usize, usize);
    type Mark = Instant;

    fn make_streams(&mut self, streams: &[StreamId]) -> Result<(), DeviceError> {
        self.recorded = vec![0; streams.len()];
        Ok(())
    }
    fn stream(&self, index: usize) -> Option<&()> {
        (index < self.recorded.len()).then_some(&()) // work runs at once: nothing to queue on
    }
    fn record(&mut self, stream: usize) -> Result<(usize, usize), DeviceError> {
        let n = self
            .recorded
            .get_mut(stream)
            .ok_or_else(|| no_stream(stream))?;
        *n += 1;
        Ok((stream, *n))
    }
    fn wait(&mut self, stream: usize, &(on, n): &(usize, usize)) -> Result<(), DeviceError> {
        match self.recorded.get(on) {
            Some(&done) if done >= n && stream < self.recorded.len() => Ok(()),
            _ => Err(DeviceError::new(format!(
                "stream {stream} waits on event {n} of stream {on}, not recorded yet"
            ))),
        }
    }
    fn mark(&mut self, _stream: usize) -> Result<Instant, DeviceError> {
        Ok(Instant::now())
    }
    fn synchronize(&mut self) -> Result<(), DeviceError> {
        Ok(()) // nothing is ever pending
    }
    fn seconds(&self, origin: &Instant, mark: &Instant) -> Result<f64, DeviceError> {
        Ok(mark.saturating_duration_since(*origin).as_secs_f64())
    }
}

fn no_stream(stream: usize) -> DeviceError {
    DeviceError::new(format!("stream {stream} was never made"))
}

/// `y = tanh(w x)`, elementwise, with one scalar weight.
#[derive(Clone)]
pub struct Tanh {
    /// The weight.
    pub w: f32,
    grad: f32,
}

/// What `Tanh` keeps from F for I and W: its input and output.
pub struct Kept {
    x: Tensor,
    y: Vec<f32>,
    /// `dL/d(w x)`, set by I for W.
    dz: Vec<f32>,
}

impl Stage for Tanh {
    type Stash = Kept;

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Kept), StageError> {
        let y: Vec<f32> = x.data().iter().map(|v| (self.w * v).tanh()).collect();
        let out = Tensor::new(x.shape().to_vec(), y.clone())?;
        Ok((
            out,
            Kept {
                x,
                y,
                dz: Vec::new(),
            },
        ))
    }
    fn backward_input(&mut self, kept: &mut Kept, dy: Tensor) -> Result<Tensor, StageError> {
        kept.dz = kept
            .y
            .iter()
            .zip(dy.data())
            .map(|(y, d)| d * (1.0 - y * y))
            .collect();
        let dx = kept.dz.iter().map(|d| d * self.w).collect();
        Ok(Tensor::new(dy.shape().to_vec(), dx)?)
    }
    fn backward_weight(&mut self, kept: Kept) -> Result<(), StageError> {
        self.grad += kept
            .dz
            .iter()
            .zip(kept.x.data())
            .map(|(d, x)| d * x)
            .sum::<f32>();
        Ok(())
    }
    fn held_bytes(&self, kept: &Kept) -> usize {
        kept.x.bytes() + 4 * (kept.y.len() + kept.dz.len())
    }
    fn zero_grad(&mut self) {
        self.grad = 0.0;
    }
    fn optimizer_step(&mut self) -> Result<(), StageError> {
        self.w -= 0.5 * self.grad;
        Ok(())
    }
}

/// Mean squared error and its gradient.
pub fn mse(y: &Tensor, t: &Tensor) -> Result<(f32, Tensor), StageError> {
    let n = y.len().max(1) as f32;
    let d: Vec<f32> = y.data().iter().zip(t.data()).map(|(y, t)| y - t).collect();
    let loss = d.iter().map(|d| d * d).sum::<f32>() / n;
    let grad = d.iter().map(|d| 2.0 * d / n).collect();
    Ok((loss, Tensor::new(y.shape().to_vec(), grad)?))
}

/// Microbatch `k` of step `i`: a 2 x 3 input and the target `0.5 x`.
fn microbatch(i: usize, k: usize) -> Result<(Tensor, Tensor), StageError> {
    let x: Vec<f32> = (0..6)
        .map(|j| ((i * 7 + k * 3 + j) % 11) as f32 / 11.0 - 0.5)
        .collect();
    let t = x.iter().map(|v| 0.5 * v).collect();
    Ok((Tensor::new(vec![2, 3], x)?, Tensor::new(vec![2, 3], t)?))
}

/// Trains `steps` steps of ZB-V on `ranks` ranks on the [`Inline`] device, and the same model with
/// `sequential_step` beside it; returns each step's (pipelined, sequential) mean loss.
pub fn train(ranks: usize, steps: usize) -> Result<Vec<(f32, f32)>, Box<dyn std::error::Error>> {
    let m = 8;
    let schedule = families::generate("zbv", &Params::new(ranks, m))?;
    let stages: Vec<Tanh> = (0..schedule.stages())
        .map(|s| Tanh {
            w: 1.0 + 0.1 * s as f32,
            grad: 0.0,
        })
        .collect();
    let mut reference = stages.clone();
    let mut ex = StreamExecutor::new(schedule, stages, Inline::default())?;
    let mut losses = Vec::with_capacity(steps);
    for i in 0..steps {
        let (xs, ts): (Vec<Tensor>, Vec<Tensor>) = (0..m)
            .map(|k| microbatch(i, k))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        let seq = sequential_step(&mut reference, xs.clone(), &ts, &mse)?;
        let report = ex.step(xs, &ts, &mse)?;
        ex.optimizer_step()?;
        losses.push((report.loss, seq.loss));
    }
    Ok(losses)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let losses = train(2, 30)?;
    for (i, (pipelined, sequential)) in losses.iter().enumerate().step_by(5) {
        println!("step {i:>2}: loss {pipelined:.6} (sequential {sequential:.6})");
    }
    let worst = losses
        .iter()
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    println!(
        "zbv on the Inline device: 30 steps, largest loss difference from sequential {worst:e}"
    );
    Ok(())
}
