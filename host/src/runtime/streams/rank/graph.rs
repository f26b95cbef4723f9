//! Whole-step capture for one rank in its own process ([`RankStreams::capture`],
//! [`RankStreams::replay`]): the rank's part of a step, its sends and receives included, is
//! enqueued once while the device records it (a CUDA graph holding the rank's kernels and its
//! NCCL calls; the kept job lists of [`CpuStreams`](super::super::CpuStreams) and
//! [`CpuPeer`](super::super::CpuPeer) on the CPU twin), and each later step refreshes the fixed
//! inputs and targets and replays it.
//!
//! What is captured, in order: the fork (every other stream of the rank, and the link's stream,
//! wait on an event of stream 0), the stages' `zero_grad`, a copy of each fixed input (stream 0),
//! every op of the rank's plan untimed (runs, lane events, sends and receives posted on the link),
//! and the join (an event of every other stream, and one of the link's, waited on by stream 0).
//! What is not: everything on the host between steps, which stays outside the replayed work as in
//! a plain step: the link's completion and the ranks' agreement on the step's end (an all-reduce
//! on NCCL, a barrier over MPI), the data-parallel gradient reduction, reading the losses, and
//! the optimizer steps.
//!
//! Every rank of the job captures the same step and replays it as often: the captured sends and
//! receives pair up across ranks as the plain ones do, in the same order.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{device_error, panicked, RankBatch, RankStreams, Step, Walk};
use crate::runtime::streams::device::{copies, fork, join};
use crate::runtime::streams::{Device, StreamLoss, StreamStage};
use crate::runtime::{Payload, RankOutcome, RankStop, RuntimeError, Transport, TransportError};
use crate::schedule::deps::Edge;

/// What a rank's captured step keeps: the fixed buffers it reads, the losses it writes (by
/// microbatch) and its peak held bytes.
pub(super) struct RankCaptured<D: Device> {
    inputs: Vec<D::Payload>,
    targets: Vec<D::Payload>,
    losses: Vec<(usize, <D::Payload as Payload>::Loss)>,
    peak: usize,
}

/// The captured step's state and what its walk left (kept until the capture ends).
type Captured<D, T> = (Step<D, T>, Walk<D>, Vec<<D as Device>::Event>);

impl<D: Device, S: StreamStage<D::Stream, D::Payload>> RankStreams<D, S> {
    /// Captures the rank's part of one training step over `inputs` (stage 0's microbatches, on
    /// its rank) and `targets` (read on the last stage's rank), which the runner keeps as the
    /// fixed buffers later steps [`replay`](RankStreams::replay) over; then runs it once, over
    /// `peer`, and reports it as [`step`](RankStreams::step) does, without per-action times (an
    /// empty timeline: nothing is marked inside a captured step). `shape` is the shape of each
    /// edge crossing into the rank, as in [`RankBatch`].
    ///
    /// Capture after at least one plain step (a device may set things up lazily on first use).
    /// Every rank of the job captures the same step. Refused: a second capture, a device or a
    /// link that cannot capture (their defaults), a batch of the wrong size.
    pub fn capture<L: StreamLoss<D::Stream, D::Payload>, P: Transport<D::Payload, D::Event>>(
        &mut self,
        (inputs, targets): (Vec<D::Payload>, Vec<D::Payload>),
        loss: &L,
        shape: &dyn Fn(Edge) -> Vec<usize>,
        peer: &mut P,
    ) -> RankOutcome {
        let rank = self.rank;
        let captured = catch_unwind(AssertUnwindSafe(|| {
            self.capture_step(inputs, targets, loss, shape, peer)
        }))
        .unwrap_or_else(|p| Err(panicked(rank, &*p)));
        // The step's buffers are released once the launched step completed.
        let launched = captured.and_then(|step| self.launch(peer).map(|()| step));
        self.settle(launched, peer, |me, _step, out| me.replayed(out))
    }

    /// Runs the captured step again on new `inputs` and `targets` (copied into the fixed
    /// buffers), over `peer`; reports it as [`capture`](RankStreams::capture) does. Its gradients
    /// are ready for [`optimizer_step`](RankStreams::optimizer_step).
    pub fn replay<P: Transport<D::Payload, D::Event>>(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: Vec<D::Payload>,
        peer: &mut P,
    ) -> RankOutcome {
        let launched = self
            .refresh(inputs, targets)
            .and_then(|()| self.launch(peer));
        self.settle(launched, peer, |me, (), out| me.replayed(out))
    }

    /// Whether a step has been captured (and [`replay`](RankStreams::replay) can run).
    pub fn is_captured(&self) -> bool {
        self.graph.is_some()
    }

    /// Begins the capture, enqueues the step, ends the capture (also after a failure, which is
    /// the error reported) and keeps what later replays need.
    fn capture_step<L: StreamLoss<D::Stream, D::Payload>, P: Transport<D::Payload, D::Event>>(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: Vec<D::Payload>,
        loss: &L,
        shape: &dyn Fn(Edge) -> Vec<usize>,
        peer: &mut P,
    ) -> Result<Step<D, S::Stash>, RuntimeError> {
        if self.graph.is_some() {
            return Err(RuntimeError::Device {
                message: "a step is already captured: replay it".into(),
            });
        }
        self.check_batch(inputs.len(), targets.len())?;
        self.device.begin_capture().map_err(device_error)?;
        let batch = RankBatch {
            inputs: Vec::new(),
            targets: &targets,
            loss,
            shape,
        };
        let (mut step, walk, events) = match self.capture_body(&inputs, &batch, peer) {
            Ok(done) => done,
            Err(e) => {
                // Leave the device out of capture mode; the step's own error is the one to report.
                let _ = self.device.end_capture();
                return Err(e);
            }
        };
        self.device.end_capture().map_err(device_error)?;
        drop((walk, events));
        let losses = (step.losses(&self.schedule).into_iter().enumerate())
            .filter_map(|(k, l)| Some((k, l?)))
            .collect();
        let peak = step.machine(self.rank).map_or(0, |m| m.peak());
        self.graph = Some(RankCaptured {
            inputs,
            targets,
            losses,
            peak,
        });
        Ok(step)
    }

    /// The captured work: fork, zero-grad, input copies, every op, join (see the module notes).
    fn capture_body<L: StreamLoss<D::Stream, D::Payload>, P: Transport<D::Payload, D::Event>>(
        &mut self,
        inputs: &[D::Payload],
        batch: &RankBatch<'_, D::Payload, L>,
        peer: &mut P,
    ) -> Result<Captured<D, S::Stash>, RuntimeError> {
        let link = |rank: usize| {
            move |error: TransportError| RuntimeError::Peer {
                rank,
                error: Box::new(error),
            }
        };
        let streams = self.plan.streams.len();
        let mut events = vec![fork(&mut self.device, streams).map_err(device_error)?];
        let link_fork = self.device.record(0).map_err(device_error)?;
        peer.begin_capture(link_fork).map_err(link(self.rank))?;
        self.zero_grads()?;
        let copies = copies(&self.device, inputs).map_err(device_error)?;
        let mut step = Step::one_rank(&self.schedule, self.rank, copies, &self.recompute);
        let walk = self.walk(&mut step, batch, peer, false)?;
        events.extend(join(&mut self.device, streams).map_err(device_error)?);
        let link_join = peer.end_capture().map_err(link(self.rank))?;
        self.device.wait(0, &link_join).map_err(device_error)?;
        events.push(link_join);
        Ok((step, walk, events))
    }

    /// Copies `inputs` and `targets` into the captured step's fixed buffers (as many as it was
    /// captured with).
    fn refresh(
        &mut self,
        inputs: Vec<D::Payload>,
        targets: Vec<D::Payload>,
    ) -> Result<(), RuntimeError> {
        self.check_batch(inputs.len(), targets.len())?;
        let graph = self.graph.as_mut().ok_or_else(|| RuntimeError::Device {
            message: "no step has been captured: call capture first".into(),
        })?;
        if (inputs.len(), targets.len()) != (graph.inputs.len(), graph.targets.len()) {
            return Err(RuntimeError::BatchCount {
                microbatches: self.schedule.microbatches,
                inputs: inputs.len(),
                targets: targets.len(),
            });
        }
        let fixed = graph.inputs.iter_mut().chain(graph.targets.iter_mut());
        for (dst, src) in fixed.zip(inputs.into_iter().chain(targets)) {
            self.device.refresh(dst, src).map_err(device_error)?;
        }
        Ok(())
    }

    /// Launches the captured step on the device, then the link's part where it is not in the
    /// device's graph.
    fn launch<P: Transport<D::Payload, D::Event>>(
        &mut self,
        peer: &mut P,
    ) -> Result<(), RuntimeError> {
        self.device.replay().map_err(device_error)?;
        peer.replay().map_err(|error| RuntimeError::Peer {
            rank: self.rank,
            error: Box::new(error),
        })
    }

    /// Fills `out` from a completed captured step: its losses, its peak, the reduction.
    fn replayed(&mut self, out: &mut RankOutcome) -> Result<(), RankStop> {
        let graph = self.graph.as_ref().ok_or_else(|| {
            RankStop::Failed(RuntimeError::Device {
                message: "no step has been captured".into(),
            })
        })?;
        for (k, l) in &graph.losses {
            let v = self.device.read_loss(l).map_err(device_error);
            out.losses.push((*k, v.map_err(RankStop::Failed)?));
        }
        out.peak_held = graph.peak;
        self.reduce()
    }
}
