//! [`StreamExecutor::evaluate`]: the schedule's forwards only, enqueued on the training step's
//! streams, as the threaded [`Executor::evaluate`](crate::runtime::Executor::evaluate) runs them.

use std::time::Instant;

use super::{device_error, Kind, StreamExecutor};
use crate::runtime::streams::step::Step;
use crate::runtime::streams::{check, Device, StreamLoss, StreamOp, StreamProgram, StreamStage};
use crate::runtime::{Evaluation, RuntimeError};
use crate::schedule::forward_only::forward_only;
use crate::schedule::Schedule;

/// The evaluation program of `schedule`: the [`StreamProgram`] of its
/// [forward order](forward_only), [`check`](fn@check)ed, with its streams renumbered to those of `training`
/// (the schedule's own program), so that it runs on the streams the device made for training.
/// Every forward runs on its rank's main lane, which every training program has.
pub(super) fn program(
    schedule: &Schedule,
    training: &StreamProgram,
) -> Result<StreamProgram, RuntimeError> {
    let forward = forward_only(schedule);
    let own = StreamProgram::build(&forward).map_err(RuntimeError::Streams)?;
    check(&own, &forward).map_err(RuntimeError::Streams)?;
    let mut to_training = Vec::with_capacity(own.streams.len());
    for id in &own.streams {
        let index = training.stream(*id).ok_or_else(|| RuntimeError::Internal {
            rank: id.rank,
            message: format!(
                "the evaluation runs on rank {} lane {}, which the training program lacks",
                id.rank, id.lane
            ),
        })?;
        to_training.push(index);
    }
    let ops = own
        .ops
        .iter()
        .map(|op| match *op {
            StreamOp::Run { stream, action } => StreamOp::Run {
                stream: to_training[stream],
                action,
            },
            StreamOp::Record { stream, event } => StreamOp::Record {
                stream: to_training[stream],
                event,
            },
            StreamOp::Wait { stream, event } => StreamOp::Wait {
                stream: to_training[stream],
                event,
            },
        })
        .collect();
    Ok(StreamProgram {
        streams: training.streams.clone(),
        events: own.events,
        ops,
    })
}

impl<D: Device, S: StreamStage<D::Stream, D::Payload>> StreamExecutor<D, S> {
    /// Runs one evaluation step: the schedule's forwards only, in the order its ranks run them
    /// ([`forward_only`]), enqueued on the training step's streams with the activations'
    /// transfers, then one synchronisation. No gradient is computed, no stage's `zero_grad` or
    /// `optimizer_step` is called (gradients a step left stay ready for
    /// [`optimizer_step`](StreamExecutor::optimizer_step)), and each forward's stash is dropped as
    /// soon as the forward returns. `inputs` and `targets` are as for
    /// [`step`](StreamExecutor::step); the [`Evaluation`] has each microbatch's loss and the last
    /// stage's output (a device payload), the measured timeline and each rank's peak. The forwards
    /// are the training step's: on the same weights, the losses are the same as the threaded
    /// [`Executor::evaluate`](crate::runtime::Executor::evaluate)'s, bit for bit. Recomputation
    /// does not apply (nothing is kept to rebuild).
    ///
    /// ```
    /// use pipefill_host::runtime::streams::{CpuStreams, Pending, StreamExecutor};
    /// use pipefill_host::runtime::{Stage, StageError, Tensor};
    /// use pipefill_host::schedule::{families, Params};
    /// # struct Twice;
    /// # impl Stage for Twice {
    /// #     type Stash = ();
    /// #     fn forward(&mut self, mut x: Tensor) -> Result<(Tensor, ()), StageError> { x.scale(2.0); Ok((x, ())) }
    /// #     fn backward_input(&mut self, _: &mut (), mut g: Tensor) -> Result<Tensor, StageError> { g.scale(2.0); Ok(g) }
    /// #     fn backward_weight(&mut self, _: ()) -> Result<(), StageError> { Ok(()) }
    /// #     fn held_bytes(&self, _: &()) -> usize { 0 }
    /// #     fn zero_grad(&mut self) {}
    /// #     fn optimizer_step(&mut self) -> Result<(), StageError> { Ok(()) }
    /// # }
    /// let schedule = families::generate("zbv", &Params::new(2, 4).with_chunks(2)).unwrap();
    /// let device = CpuStreams::new();
    /// let stages = (0..4).map(|_| device.stage(Twice)).collect();
    /// let mut ex = StreamExecutor::new(schedule, stages, device).unwrap();
    /// let loss = ex.device().loss(|y: &Tensor, _: &Tensor| Ok((y.data()[0], y.clone())));
    /// let x = |v: f32| Pending::ready(Tensor::new(vec![1, 1], vec![v]).unwrap());
    /// let eval = ex.evaluate((0..4).map(|k| x(k as f32)).collect(), &[x(0.0), x(0.0), x(0.0), x(0.0)], &loss).unwrap();
    /// assert_eq!(eval.losses, vec![0.0, 16.0, 32.0, 48.0]); // k * 2^4
    /// assert_eq!(eval.outputs.len(), 4);
    /// ```
    pub fn evaluate<L: StreamLoss<D::Stream, D::Payload>>(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: &[D::Payload],
        loss: &L,
    ) -> Result<Evaluation<D::Payload>, RuntimeError> {
        self.check_batch(inputs.len(), targets.len())?;
        let wall = Instant::now();
        let mut step = Step::all_ranks(&self.schedule, inputs, &[]).evaluating();
        let origin = self.device.origin().map_err(device_error)?;
        self.enqueue_program(Kind::Evaluate, &mut step, targets, loss, true)?;
        self.device.synchronize().map_err(device_error)?;
        let last = self.schedule.rank_of(self.schedule.stages() - 1);
        let mut kept = step
            .machine(last)
            .map(|m| m.take_outputs())
            .unwrap_or_default();
        let (report, _) = self.report(Kind::Evaluate, step, &origin)?;
        kept.sort_by_key(|(k, _)| *k);
        let m = self.schedule.microbatches;
        if kept.len() != m || kept.iter().enumerate().any(|(i, (k, _))| i != *k) {
            return Err(RuntimeError::Internal {
                rank: last,
                message: format!(
                    "the evaluation kept {} outputs for {m} microbatches",
                    kept.len()
                ),
            });
        }
        Ok(Evaluation {
            loss: report.loss,
            losses: report.losses,
            outputs: kept.into_iter().map(|(_, y)| y).collect(),
            timeline: report.timeline,
            peak_held_bytes: report.peak_held_bytes,
            seconds: wall.elapsed().as_secs_f64(),
        })
    }

    /// The program of `kind`.
    pub(super) fn program_of(&self, kind: Kind) -> &StreamProgram {
        match kind {
            Kind::Train => &self.program,
            Kind::Evaluate => &self.evaluation,
        }
    }
}
