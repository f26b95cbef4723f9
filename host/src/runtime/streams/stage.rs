//! [`StreamStage`] and [`StreamLoss`]: a stage and a loss whose work a [`Device`] runs on its
//! streams. Every call receives the stream it runs on ([`Device::Stream`]), explicitly: there is no
//! "bound stream" a stage would look up in shared state.
//!
//! Any host [`Stage`] (and any [`Loss`]) over a device's payload is one, ignoring the stream: what a
//! device that runs work at once needs (the `Inline` device of `examples/custom_device.rs`, whose
//! payload is a host [`Tensor`](crate::runtime::Tensor)), boxed mixed stages
//! ([`BoxedStage`](crate::runtime::BoxedStage)) included. A device whose work runs later wraps its
//! stages ([`OnStreams`](super::OnStreams) on [`CpuStreams`](super::CpuStreams), the CUDA stage on
//! CUDA streams) and enqueues each call on the stream it is given.

use super::Device;
use crate::runtime::{Loss, Payload, RuntimeError, Stage, StageError};

/// The payload of device `D`.
type PayloadOf<D> = <D as Device>::Payload;
/// A loss value as device `D` holds it.
type LossOf<D> = <PayloadOf<D> as Payload>::Loss;

/// What [`StreamStage::with_gradients`] calls with a stage's gradient buffers (on the host).
pub type GradientsFn<'a> = dyn FnMut(Vec<&mut [f32]>) -> Result<(), StageError> + 'a;

/// One pipeline stage on a [`Device`] whose streams are `St` and payloads `P`: [`Stage`]'s
/// methods, each given the stream it runs on (keyed by the stream type rather than the device, so a
/// device that wraps another runs the other's stages).
///
/// The runtime calls `forward`, `backward_input`, `backward_weight` and `backward` on the stream
/// the [`StreamProgram`](super::StreamProgram) puts the action on; `zero_grad` (before a step's
/// first action) and `optimizer_step` (when the trainer asks, after a step) on the main stream of
/// the stage's rank. A call enqueues its work on `on` and returns at once; the payloads it returns
/// are ready once that work has run.
pub trait StreamStage<St, P: Payload>: Send {
    /// What the forward pass keeps for the backward passes of one microbatch.
    type Stash: Send;

    /// `F` on `on` ([`Stage::forward`]).
    fn forward(&mut self, on: &St, input: P) -> Result<(P, Self::Stash), StageError>;

    /// `I` on `on` ([`Stage::backward_input`]).
    fn backward_input(
        &mut self,
        on: &St,
        stash: &mut Self::Stash,
        grad_output: P,
    ) -> Result<P, StageError>;

    /// `W` on `on` ([`Stage::backward_weight`]).
    fn backward_weight(&mut self, on: &St, stash: Self::Stash) -> Result<(), StageError>;

    /// `B` on `on`: `I` then `W` by default ([`Stage::backward`]).
    fn backward(
        &mut self,
        on: &St,
        mut stash: Self::Stash,
        grad_output: P,
    ) -> Result<P, StageError> {
        let grad_input = self.backward_input(on, &mut stash, grad_output)?;
        self.backward_weight(on, stash)?;
        Ok(grad_input)
    }

    /// Bytes of activation memory `stash` holds ([`Stage::held_bytes`]).
    fn held_bytes(&self, stash: &Self::Stash) -> usize;

    /// Selective recomputation after `F`, on `on` ([`Stage::shrink`]; nothing by default).
    fn shrink(&mut self, on: &St, stash: &mut Self::Stash) -> Result<bool, StageError> {
        let _ = (on, stash);
        Ok(false)
    }

    /// The rebuild before `I` or `B`, on `on` ([`Stage::rebuild`]; nothing by default).
    fn rebuild(&mut self, on: &St, stash: &mut Self::Stash) -> Result<(), StageError> {
        let _ = (on, stash);
        Ok(())
    }

    /// Zeroes the accumulated gradients, before a step's first action ([`Stage::zero_grad`]).
    fn zero_grad(&mut self, on: &St);

    /// Applies the accumulated gradients on `on` ([`Stage::optimizer_step`]).
    fn optimizer_step(&mut self, on: &St) -> Result<(), StageError>;

    /// The accumulated gradients as host buffers, if the stage can lend them
    /// ([`Stage::gradients`]; none by default).
    fn gradients(&mut self) -> Vec<&mut [f32]> {
        Vec::new()
    }

    /// Calls `f` with the stage's accumulated gradients as host buffers (in
    /// [`Stage::gradients`]' order), keeping what `f` leaves in them: how the data-parallel
    /// [`Reducer`](crate::runtime::Reducer) reads and writes them on the stream path, after the
    /// step's work ran. By default `f(self.gradients())`; a stage whose gradients live on a device
    /// copies them to the host and back on `on` (its rank's main stream).
    fn with_gradients(&mut self, on: &St, f: &mut GradientsFn<'_>) -> Result<(), StageError> {
        let _ = on;
        f(self.gradients())
    }
}

/// The loss after the last stage, computed on the stream it is given ([`Loss`]).
pub trait StreamLoss<St, P: Payload>: Sync {
    /// The loss of `output` against `target` and its gradient, enqueued on `on`.
    fn loss(&self, on: &St, output: &P, target: &P) -> Result<(P::Loss, P), StageError>;
}

/// A host stage whose payload is the device's runs inline, wherever it is enqueued.
impl<St, P: Payload, S: Stage<P>> StreamStage<St, P> for S {
    type Stash = S::Stash;

    fn forward(&mut self, _: &St, input: P) -> Result<(P, S::Stash), StageError> {
        Stage::forward(self, input)
    }

    fn backward_input(
        &mut self,
        _: &St,
        stash: &mut S::Stash,
        grad_output: P,
    ) -> Result<P, StageError> {
        Stage::backward_input(self, stash, grad_output)
    }

    fn backward_weight(&mut self, _: &St, stash: S::Stash) -> Result<(), StageError> {
        Stage::backward_weight(self, stash)
    }

    fn backward(&mut self, _: &St, stash: S::Stash, grad_output: P) -> Result<P, StageError> {
        Stage::backward(self, stash, grad_output)
    }

    fn held_bytes(&self, stash: &S::Stash) -> usize {
        Stage::held_bytes(self, stash)
    }

    fn shrink(&mut self, _: &St, stash: &mut S::Stash) -> Result<bool, StageError> {
        Stage::shrink(self, stash)
    }

    fn rebuild(&mut self, _: &St, stash: &mut S::Stash) -> Result<(), StageError> {
        Stage::rebuild(self, stash)
    }

    fn zero_grad(&mut self, _: &St) {
        Stage::zero_grad(self);
    }

    fn optimizer_step(&mut self, _: &St) -> Result<(), StageError> {
        Stage::optimizer_step(self)
    }

    fn gradients(&mut self) -> Vec<&mut [f32]> {
        Stage::gradients(self)
    }
}

/// A host loss over the device's payload runs inline.
impl<St, P: Payload, L: Loss<P>> StreamLoss<St, P> for L {
    fn loss(&self, _: &St, output: &P, target: &P) -> Result<(P::Loss, P), StageError> {
        Loss::loss(self, output, target)
    }
}

/// A stream stage with the stream of one call: a [`Stage`] the rank's
/// [`Machine`](crate::runtime::machine) runs like any other.
pub(super) struct Bound<'a, D: Device, S> {
    pub(super) stage: &'a mut S,
    pub(super) on: &'a D::Stream,
}

impl<D: Device, S: StreamStage<D::Stream, D::Payload>> Stage<D::Payload> for Bound<'_, D, S> {
    type Stash = S::Stash;

    #[inline(always)]
    fn forward(&mut self, input: PayloadOf<D>) -> Result<(PayloadOf<D>, S::Stash), StageError> {
        self.stage.forward(self.on, input)
    }

    #[inline(always)]
    fn backward_input(
        &mut self,
        stash: &mut S::Stash,
        grad: PayloadOf<D>,
    ) -> Result<PayloadOf<D>, StageError> {
        self.stage.backward_input(self.on, stash, grad)
    }

    #[inline(always)]
    fn backward_weight(&mut self, stash: S::Stash) -> Result<(), StageError> {
        self.stage.backward_weight(self.on, stash)
    }

    #[inline(always)]
    fn backward(
        &mut self,
        stash: S::Stash,
        grad: PayloadOf<D>,
    ) -> Result<PayloadOf<D>, StageError> {
        self.stage.backward(self.on, stash, grad)
    }

    #[inline(always)]
    fn held_bytes(&self, stash: &S::Stash) -> usize {
        self.stage.held_bytes(stash)
    }

    fn shrink(&mut self, stash: &mut S::Stash) -> Result<bool, StageError> {
        self.stage.shrink(self.on, stash)
    }

    fn rebuild(&mut self, stash: &mut S::Stash) -> Result<(), StageError> {
        self.stage.rebuild(self.on, stash)
    }

    fn zero_grad(&mut self) {
        self.stage.zero_grad(self.on);
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        self.stage.optimizer_step(self.on)
    }

    fn gradients(&mut self) -> Vec<&mut [f32]> {
        self.stage.gradients()
    }
}

/// A stream loss with the stream of one call: a [`Loss`] for the rank's machine.
pub(super) struct BoundLoss<'a, D: Device, L> {
    pub(super) loss: &'a L,
    pub(super) on: &'a D::Stream,
}

impl<D: Device, L: StreamLoss<D::Stream, D::Payload>> Loss<D::Payload> for BoundLoss<'_, D, L> {
    #[inline(always)]
    fn loss(
        &self,
        output: &PayloadOf<D>,
        target: &PayloadOf<D>,
    ) -> Result<(LossOf<D>, PayloadOf<D>), StageError> {
        self.loss.loss(self.on, output, target)
    }
}

/// A stage bound to a stream, with its global index.
pub(super) type BoundAt<'a, D, S> = (usize, Bound<'a, D, S>);

/// `stages` (`(global stage, stage)`), each bound to stream `home(stage)` of `device`: what the
/// host calls of a step (`zero_grad`, `optimizer_step`) are given.
pub(super) fn bound_home<'a, D: Device, S: 'a>(
    device: &'a D,
    stages: impl IntoIterator<Item = (usize, &'a mut S)>,
    home: impl Fn(usize) -> Option<usize>,
) -> Result<Vec<BoundAt<'a, D, S>>, RuntimeError> {
    stages
        .into_iter()
        .map(|(s, stage)| {
            let on = home(s).and_then(|i| device.stream(i));
            let on = on.ok_or_else(|| RuntimeError::Device {
                message: format!("the device has no stream for stage {s}'s rank"),
            })?;
            Ok((s, Bound { stage, on }))
        })
        .collect()
}
