//! Whole-step capture and replay ([`StreamExecutor::capture`], [`StreamExecutor::replay`]): the
//! step's device work is enqueued once while the [`Device`] records it (a CUDA graph; a recorded
//! job list on [`CpuStreams`](super::super::CpuStreams)), and each later step only refreshes the
//! fixed input and target buffers and replays it.
//!
//! What is captured: the fork of every other stream from stream 0 (first: a stream's work counts
//! only once it joined the capture), every stage's `zero_grad` (on its rank's main stream), a copy
//! of each fixed input into a step-owned payload (stream 0), every op of the
//! program (untimed: a timing mark inside a graph records nothing readable), the loss values and
//! gradients, and the join of every stream back into stream 0. What is not: the optimizer steps,
//! which the trainer applies after each replay as after a plain step
//! ([`StreamExecutor::optimizer_step`]; AdamW's bias corrections change every step, and a captured
//! kernel keeps the arguments it was captured with).

use std::time::Instant;

use super::{device_error, Step, StreamExecutor};
use crate::runtime::streams::device::{copies, fork, join};
use crate::runtime::streams::Device;
use crate::runtime::streams::{StreamLoss, StreamStage};
use crate::runtime::{Payload, RuntimeError, StepReport};
use crate::timeline::{Source, Timeline};

/// The captured step's state and its events (kept until the capture ends).
type CapturedWork<D, T> = (Step<D, T>, Vec<<D as Device>::Event>);

/// What a captured step keeps: the fixed buffers it reads and the losses it writes.
pub(super) struct Captured<D: Device> {
    inputs: Vec<D::Payload>,
    targets: Vec<D::Payload>,
    losses: Vec<<D::Payload as Payload>::Loss>,
    peak: Vec<usize>,
}

impl<D: Device, S: StreamStage<D::Stream, D::Payload>> StreamExecutor<D, S> {
    /// Captures one whole training step over `inputs` and `targets` (which the executor keeps as
    /// the fixed buffers later steps [`replay`](StreamExecutor::replay) over), then runs it once and
    /// reports it, as [`step`](StreamExecutor::step) would.
    ///
    /// Capture after at least one plain [`step`](StreamExecutor::step): a device may set things up
    /// lazily on first use (kernel lookup, cached buffers), which must not happen inside a capture.
    /// The report of a captured or replayed step has the losses and the step's wall time, but an
    /// empty timeline and no per-action times (nothing is marked inside the captured step).
    ///
    /// Errors: a batch of the wrong size, a step already captured, a device that cannot capture
    /// (the [`Device`] defaults), and any failure of the step itself.
    pub fn capture<L: StreamLoss<D::Stream, D::Payload>>(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: Vec<D::Payload>,
        loss: &L,
    ) -> Result<StepReport, RuntimeError> {
        self.ready.stepped(false);
        self.check_batch(inputs.len(), targets.len())?;
        if self.graph.is_some() {
            return Err(RuntimeError::Device {
                message: "a step is already captured: replay it".into(),
            });
        }
        let wall = Instant::now();
        self.device.begin_capture().map_err(device_error)?;
        let (step, events) = match self.capture_body(&inputs, &targets, loss) {
            Ok(done) => done,
            Err(e) => {
                // Leave the device out of capture mode; the step's own error is the one to report.
                let _ = self.device.end_capture();
                return Err(e);
            }
        };
        self.device.end_capture().map_err(device_error)?;
        drop(events);
        let mut step = step;
        let by_microbatch = step.losses(&self.schedule);
        let mut losses = Vec::with_capacity(by_microbatch.len());
        for (k, l) in by_microbatch.into_iter().enumerate() {
            losses.push(l.ok_or_else(|| RuntimeError::Internal {
                rank: self.schedule.rank_of(self.schedule.stages() - 1),
                message: format!("the captured step has no loss for microbatch {k}"),
            })?);
        }
        self.graph = Some(Captured {
            inputs,
            targets,
            losses,
            peak: step.peaks(),
        });
        self.launch(wall)
    }

    /// Runs the captured step again on new `inputs` and `targets` (copied into the fixed buffers);
    /// reports it as [`capture`](StreamExecutor::capture) does. Its gradients are ready for
    /// [`optimizer_step`](StreamExecutor::optimizer_step).
    pub fn replay(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: Vec<D::Payload>,
    ) -> Result<StepReport, RuntimeError> {
        self.ready.stepped(false);
        self.check_batch(inputs.len(), targets.len())?;
        let wall = Instant::now();
        let graph = self.graph.as_mut().ok_or_else(|| RuntimeError::Device {
            message: "no step has been captured: call capture first".into(),
        })?;
        let fixed = graph.inputs.iter_mut().chain(graph.targets.iter_mut());
        for (dst, src) in fixed.zip(inputs.into_iter().chain(targets)) {
            self.device.refresh(dst, src).map_err(device_error)?;
        }
        self.launch(wall)
    }

    /// Whether a step has been captured (and [`replay`](StreamExecutor::replay) can run).
    pub fn is_captured(&self) -> bool {
        self.graph.is_some()
    }

    /// The captured work: fork, zero-grad, input copies, every op, join (see the module notes).
    fn capture_body<L: StreamLoss<D::Stream, D::Payload>>(
        &mut self,
        inputs: &[D::Payload],
        targets: &[D::Payload],
        loss: &L,
    ) -> Result<CapturedWork<D, S::Stash>, RuntimeError> {
        // The fork comes first: work enqueued on a stream before it joins the capture would not
        // be captured (CUDA runs it once, now; the CPU twin refuses it).
        let streams = self.program.streams.len();
        let mut events = vec![fork(&mut self.device, streams).map_err(device_error)?];
        self.zero_grads()?;
        let copies = copies(&self.device, inputs).map_err(device_error)?;
        let mut step = self.new_step(copies);
        events.extend(self.enqueue_ops(&mut step, targets, loss, false)?);
        events.extend(join(&mut self.device, streams).map_err(device_error)?);
        Ok((step, events))
    }

    /// Replays the captured step, waits and reads the losses.
    fn launch(&mut self, wall: Instant) -> Result<StepReport, RuntimeError> {
        self.device.replay().map_err(device_error)?;
        self.enqueue_seconds = wall.elapsed().as_secs_f64();
        self.device.synchronize().map_err(device_error)?;
        let graph = self.graph.as_ref().ok_or_else(|| RuntimeError::Device {
            message: "no step has been captured".into(),
        })?;
        let losses = graph
            .losses
            .iter()
            .map(|l| self.device.read_loss(l))
            .collect::<Result<Vec<f32>, _>>()
            .map_err(device_error)?;
        let loss = losses.iter().sum::<f32>() / losses.len().max(1) as f32;
        let peak_held_bytes = graph.peak.clone();
        self.reduce()?;
        self.ready.stepped(true);
        Ok(StepReport {
            loss,
            losses,
            timeline: Timeline::new(
                self.schedule.name.clone(),
                Source::Measured,
                self.schedule.ranks,
            ),
            peak_held_bytes,
            seconds: wall.elapsed().as_secs_f64(),
            action_seconds: Vec::new(),
            rebuild_seconds: Vec::new(),
        })
    }
}
