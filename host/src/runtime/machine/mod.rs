//! The one place where a rank executes an action: [`Machine`], one rank's state during a step
//! (its microbatch inputs, its mailbox, its stashes, the bytes they hold and their peak, its losses)
//! and the logic of `F`, `I`, `W` and `B` over it, with the order checks. Every runner drives it:
//! the threaded per-rank worker ([`run_rank`](super::run_rank)), the one-thread
//! [`StreamExecutor`](super::streams::StreamExecutor) (one machine per rank) and the per-rank
//! [`RankStreams`](super::streams::RankStreams).
//!
//! A runner decides only what is its own: which stage an action runs on, how a layer call is made
//! ([`Calls`]: timed and guarded on threads, enqueued and checked for placement on a device), and
//! where a handed-on output goes (this rank's mailbox, or another rank's through a transport). The
//! end of a step (zero-grad, abort, the finish barrier) and the optimizer steps a runner applies
//! when the trainer asks are in [`end`].
//!
//! Recomputation ([`Recompute`], per stage, [`Machine::recomputing`]) is the machine's too, so every
//! runner has it ([`recompute`]): on a stage run with [`Recompute::Full`], `F` keeps a copy of the
//! stage's input ([`Calls::keep`]) instead of the stash, and the stage's `I` or `B` runs the forward
//! again on it first. On a stage run with [`Recompute::Selective`], `F` asks the stage to drop
//! what it can rebuild cheaply ([`Stage::shrink`]) and the backward has it rebuilt first
//! ([`Stage::rebuild`]). A run without recomputation never reaches that code: the kept inputs live
//! apart from the stashes, a backward looks for one only where it finds no stash, and a stash
//! records whether it was shrunk.

use super::key_map::KeyMap;
use super::{Loss, Payload, RuntimeError, Stage, StageError};
use crate::cost::Recompute;
use crate::schedule::deps::{output, Edge, Flow};
use crate::schedule::{Action, Op, Schedule};
use crate::timeline::Transfer;

mod end;
mod mailbox;
mod recompute;
#[cfg(test)]
mod tests;

pub(crate) use end::{end_of_step, zero_grads, Ready};
pub use end::{optimizer_steps, RankOutcome, RankStop};
pub(crate) use mailbox::Arrival;
use mailbox::Mailbox;

/// How a runner makes the layer calls of an action for the [`Machine`].
pub(crate) trait Calls<P> {
    /// What a failed action stops the runner with.
    type Stop: From<RuntimeError>;

    /// The rank the actions run on (named by a failure).
    fn rank(&self) -> usize;

    /// Makes one layer call of `action` (the stage's method, or the loss after the last stage);
    /// by default plainly, its error the action's failure.
    #[inline(always)]
    fn call<R>(
        &mut self,
        action: Action,
        f: impl FnOnce() -> Result<R, StageError>,
    ) -> Result<R, Self::Stop> {
        f().map_err(|e| action_failed(self.rank(), action, e).into())
    }

    /// A copy of `input`, the input of `action` (an `F` on a stage run with full recomputation),
    /// that the machine keeps for the stage's backward to run the forward on again, while the
    /// forward consumes `input` itself. It must hold `input`'s values as they are when the
    /// forward reads them: a clone on the host; on a device, a copy enqueued on the action's
    /// stream before the forward's work.
    fn keep(&mut self, action: Action, input: &P) -> Result<P, Self::Stop>;

    /// Makes the layer call of `action` (an `I` or `B`) that rebuilds its stage's stash before the
    /// backward, apart from the backward's own call so that a runner that times its calls can
    /// tell the rebuild's time (the threaded worker reports it as
    /// [`StepReport::rebuild_seconds`](crate::runtime::StepReport::rebuild_seconds)); by default
    /// [`Calls::call`].
    #[inline(always)]
    fn rebuild<R>(
        &mut self,
        action: Action,
        f: impl FnOnce() -> Result<R, StageError>,
    ) -> Result<R, Self::Stop> {
        self.call(action, f)
    }

    /// Refuses a payload `action` reads when it cannot be read where the action runs (a device
    /// checks the payload's device; the host accepts everything).
    #[inline(always)]
    fn placed(&self, _action: Action, _payload: &P) -> Result<(), Self::Stop> {
        Ok(())
    }
}

/// The failure of `action` on rank `rank`, saying `message` (a failed check, or the error of one
/// of its layer calls).
pub(crate) fn action_failed(rank: usize, action: Action, message: impl ToString) -> RuntimeError {
    RuntimeError::ActionFailed {
        rank,
        action,
        message: message.to_string(),
    }
}

/// A stash, whether `I` has already run on it, and whether selective recomputation dropped part
/// of it (rebuilt before `I` or `B`).
struct Stashed<T> {
    stash: T,
    input_done: bool,
    bytes: usize,
    shrunk: bool,
}

/// One rank's state during a step, and the one implementation of its actions.
pub(crate) struct Machine<P: Payload, T> {
    rank: usize,
    stages: usize,
    /// `1 / M`, the scale of the loss gradient.
    scale: f32,
    /// Stage 0's microbatch inputs (empty on a rank without stage 0).
    inputs: Vec<Option<P>>,
    mailbox: Mailbox<P>,
    stashes: KeyMap<(usize, usize), Stashed<T>>,
    /// Each stage's recomputation mode (by global stage; a stage past the end has none).
    recompute: Vec<Recompute>,
    /// With recomputation: the inputs kept from `F` until the stash is rebuilt at `I` or `B`.
    kept: KeyMap<(usize, usize), P>,
    held: usize,
    peak: usize,
    losses: Vec<(usize, P::Loss)>,
    /// An evaluation: no stash is kept past its forward, the loss has no gradient, and the last
    /// stage's outputs are kept ([`Machine::evaluating`]).
    evaluation: bool,
    outputs: Vec<(usize, P)>,
}

/// What a failed check says when an action's input is missing.
const NO_INPUT: &str = "its input was neither produced on this rank nor received before it (does \
                        the schedule validate?)";

impl<P: Payload, T> Machine<P, T> {
    /// The state of rank `rank` at the start of a step of `schedule`, with stage 0's microbatch
    /// inputs `inputs` (empty on a rank without stage 0).
    pub(crate) fn new(rank: usize, schedule: &Schedule, inputs: Vec<P>) -> Self {
        Machine {
            rank,
            stages: schedule.stages(),
            scale: 1.0 / schedule.microbatches as f32,
            inputs: inputs.into_iter().map(Some).collect(),
            mailbox: Mailbox::default(),
            stashes: KeyMap::default(),
            recompute: Vec::new(),
            kept: KeyMap::default(),
            held: 0,
            peak: 0,
            losses: Vec::new(),
            evaluation: false,
            outputs: Vec::new(),
        }
    }

    /// This machine, run as an evaluation when `evaluation` holds: each forward's stash is dropped
    /// as soon as the forward returns (the rank's held bytes peak at one stash), the loss's
    /// gradient is dropped, and the last stage's outputs are kept ([`Machine::take_outputs`]).
    /// Only forwards can run then: a backward finds no stash.
    pub(crate) fn evaluating(mut self, evaluation: bool) -> Self {
        self.evaluation = evaluation;
        if evaluation {
            self.recompute.clear();
        }
        self
    }

    /// This machine, running stage `s` with recomputation `modes[s]` (a stage past the end of
    /// `modes` with none). An evaluation ignores it: no stash outlives its forward there.
    pub(crate) fn recomputing(mut self, modes: &[Recompute]) -> Self {
        if !self.evaluation {
            self.recompute = modes.to_vec();
        }
        self
    }

    /// Runs `a` on `stage` (the action's stage): takes its input, calls the stage through
    /// `calls`, holds or releases the stash, and after the last stage's forward computes the loss
    /// (its gradient, scaled by `1 / M`, waits in the mailbox for the stage's backward). Returns
    /// the output to hand on to a neighbour stage, with its edge (`None` for `W`, the last
    /// forward and stage 0's input gradient).
    #[inline(always)]
    pub(crate) fn run<S, L, C>(
        &mut self,
        a: Action,
        stage: &mut S,
        targets: &[P],
        loss: &L,
        calls: &mut C,
    ) -> Result<Option<(Edge, P)>, C::Stop>
    where
        S: Stage<P, Stash = T>,
        L: Loss<P>,
        C: Calls<P>,
    {
        let (flow, data) = match a.op {
            Op::F => {
                let out = self.forward(a, stage, calls)?;
                if a.stage + 1 < self.stages {
                    (Flow::Activation, out)
                } else {
                    self.loss(a, out, targets, loss, calls)?;
                    return Ok(None);
                }
            }
            Op::I => (Flow::Gradient, self.backward_input(a, stage, calls)?),
            Op::B => (Flow::Gradient, self.backward(a, stage, calls)?),
            Op::W => return self.backward_weight(a, stage, calls).map(|()| None),
        };
        // The edge `deps::output` names (checked in debug builds); stage 0's input gradient goes
        // nowhere.
        if flow == Flow::Gradient && a.stage == 0 {
            return Ok(None);
        }
        let edge = Edge {
            flow,
            from: a.stage,
            microbatch: a.microbatch,
        };
        debug_assert_eq!(output(a, self.stages), Some(edge));
        Ok(Some((edge, data)))
    }

    /// `F`: the output; the stash is held until `W` (or `B`), or with full recomputation a copy of
    /// the input instead, or with selective recomputation a shrunk stash
    /// ([`Machine::forward_recomputing`]).
    #[inline(always)]
    fn forward<S: Stage<P, Stash = T>, C: Calls<P>>(
        &mut self,
        a: Action,
        stage: &mut S,
        calls: &mut C,
    ) -> Result<P, C::Stop> {
        let input = match Edge::input_of(a) {
            None => self
                .inputs
                .get_mut(a.microbatch)
                .and_then(Option::take)
                .ok_or_else(|| self.fail(a, "no input for this microbatch (run twice?)"))?,
            Some(edge) => self.take(edge, a)?,
        };
        calls.placed(a, &input)?;
        let key = (a.stage, a.microbatch);
        if self.stashes.contains_key(&key) {
            return Err(self.fail(a, "this forward already ran and its stash is still held"));
        }
        match self.recompute.get(a.stage) {
            Some(&mode) if mode != Recompute::None => {
                return self.forward_recomputing(mode, a, key, input, stage, calls);
            }
            _ => {}
        }
        let (out, stash, bytes) = calls.call(a, || {
            let (out, stash) = stage.forward(input)?;
            let bytes = stage.held_bytes(&stash);
            Ok((out, stash, bytes))
        })?;
        self.hold(bytes, 0);
        if self.evaluation {
            // Nothing will read the stash: it goes now, and its bytes with it.
            self.hold(0, bytes);
            drop(stash);
            return Ok(out);
        }
        self.stash(key, stash, bytes, false, false);
        Ok(out)
    }

    /// After the last stage's forward: the loss of its output `out`; the loss gradient, scaled by
    /// `1 / M`, waits in the mailbox for the stage's backward.
    #[inline(always)]
    fn loss<L: Loss<P>, C: Calls<P>>(
        &mut self,
        a: Action,
        out: P,
        targets: &[P],
        loss: &L,
        calls: &mut C,
    ) -> Result<(), C::Stop> {
        let target = targets
            .get(a.microbatch)
            .ok_or_else(|| self.fail(a, "no target for this microbatch"))?;
        calls.placed(a, target)?;
        let (value, mut grad) = calls.call(a, || loss.loss(&out, target))?;
        if self.evaluation {
            self.losses.push((a.microbatch, value));
            self.outputs.push((a.microbatch, out));
            return Ok(());
        }
        grad.scale_by(self.scale).map_err(|e| self.fail(a, e))?;
        self.losses.push((a.microbatch, value));
        self.mailbox.put(Edge::gradient_of(a), grad);
        Ok(())
    }

    /// `I`: the input gradient; the stash stays for `W`, holding what the stage says it holds now.
    #[inline(always)]
    fn backward_input<S, C>(
        &mut self,
        a: Action,
        stage: &mut S,
        calls: &mut C,
    ) -> Result<P, C::Stop>
    where
        S: Stage<P, Stash = T>,
        C: Calls<P>,
    {
        let grad = self.take(Edge::gradient_of(a), a)?;
        calls.placed(a, &grad)?;
        let Some(slot) = self.stashes.get_mut(&(a.stage, a.microbatch)) else {
            return self.backward_rebuilt(a, grad, stage, calls);
        };
        if slot.input_done {
            return Err(self.fail(a, "I already ran for this microbatch"));
        }
        if slot.shrunk {
            let slot = self.unstash(a)?;
            return self.backward_selective(a, slot, grad, stage, calls);
        }
        let (grad_input, bytes) = calls.call(a, || {
            let grad_input = stage.backward_input(&mut slot.stash, grad)?;
            Ok((grad_input, stage.held_bytes(&slot.stash)))
        })?;
        let before = slot.bytes;
        slot.bytes = bytes;
        slot.input_done = true;
        self.hold(bytes, before);
        Ok(grad_input)
    }

    /// `W`: consumes the stash `I` left.
    #[inline(always)]
    fn backward_weight<S, C>(
        &mut self,
        a: Action,
        stage: &mut S,
        calls: &mut C,
    ) -> Result<(), C::Stop>
    where
        S: Stage<P, Stash = T>,
        C: Calls<P>,
    {
        let slot = self.unstash(a)?;
        if !slot.input_done {
            return Err(self.fail(a, "W before I for this microbatch"));
        }
        self.hold(0, slot.bytes);
        calls.call(a, || stage.backward_weight(slot.stash))
    }

    /// `B`: the input gradient; consumes the stash of a forward no `I` ran on.
    #[inline(always)]
    fn backward<S, C>(&mut self, a: Action, stage: &mut S, calls: &mut C) -> Result<P, C::Stop>
    where
        S: Stage<P, Stash = T>,
        C: Calls<P>,
    {
        let grad = self.take(Edge::gradient_of(a), a)?;
        calls.placed(a, &grad)?;
        let Some(slot) = self.stashes.remove(&(a.stage, a.microbatch)) else {
            return self.backward_rebuilt(a, grad, stage, calls);
        };
        if slot.input_done {
            return Err(self.fail(a, "B after I for this microbatch"));
        }
        if slot.shrunk {
            return self.backward_selective(a, slot, grad, stage, calls);
        }
        self.hold(0, slot.bytes);
        calls.call(a, || stage.backward(slot.stash, grad))
    }

    /// Removes the stash of `a`'s stage and microbatch.
    #[inline(always)]
    fn unstash<E: From<RuntimeError>>(&mut self, a: Action) -> Result<Stashed<T>, E> {
        match self.stashes.remove(&(a.stage, a.microbatch)) {
            Some(slot) => Ok(slot),
            None => Err(self.no_stash(a)),
        }
    }

    /// Keeps `stash` (holding `bytes`, already accounted) under `key` until its backward: after
    /// its `I` when `input_done`, part of it dropped by [`Stage::shrink`] when `shrunk`.
    #[inline(always)]
    fn stash(
        &mut self,
        key: (usize, usize),
        stash: T,
        bytes: usize,
        input_done: bool,
        shrunk: bool,
    ) {
        let stashed = Stashed {
            stash,
            input_done,
            bytes,
            shrunk,
        };
        self.stashes.insert(key, stashed);
    }

    /// Accounts for a stash that now holds `add` bytes instead of `remove`.
    #[inline(always)]
    fn hold(&mut self, add: usize, remove: usize) {
        self.held = (self.held + add).saturating_sub(remove);
        self.peak = self.peak.max(self.held);
    }

    /// Takes the data of `edge` for `consumer`, recording its transfer if it crossed ranks.
    #[inline(always)]
    fn take<E: From<RuntimeError>>(&mut self, edge: Edge, consumer: Action) -> Result<P, E> {
        match self.mailbox.take(edge, self.rank, consumer) {
            Some(data) => Ok(data),
            None => Err(self.fail(consumer, NO_INPUT)),
        }
    }

    fn fail<E: From<RuntimeError>>(&self, action: Action, message: impl ToString) -> E {
        E::from(action_failed(self.rank, action, message))
    }

    fn no_stash<E: From<RuntimeError>>(&self, a: Action) -> E {
        if self.kept.contains_key(&(a.stage, a.microbatch)) {
            return self.fail(
                a,
                "W before I for this microbatch (its stash is not rebuilt)",
            );
        }
        self.fail(
            a,
            "no stash: the forward of this stage and microbatch has not run",
        )
    }

    /// Puts data produced on this rank (or made usable here) in the mailbox under `edge`.
    #[inline(always)]
    pub(crate) fn put(&mut self, edge: Edge, data: P) {
        self.mailbox.put(edge, data);
    }

    /// Puts data received from another rank in the mailbox under `edge`, with how it came (its
    /// transfer is recorded when an action takes it).
    pub(crate) fn arrived(&mut self, edge: Edge, data: P, arrival: Arrival) {
        self.mailbox.arrived(edge, data, arrival);
    }

    /// Whether the data of `edge` waits in the mailbox.
    pub(crate) fn has(&self, edge: Edge) -> bool {
        self.mailbox.has(edge)
    }

    /// Removes the data of `edge` from the mailbox (to send it on, or to make it usable here).
    pub(crate) fn remove(&mut self, edge: Edge) -> Option<P> {
        self.mailbox.remove(edge)
    }

    /// The most bytes this rank's stashes held at once.
    pub(crate) fn peak(&self) -> usize {
        self.peak
    }

    /// The `(microbatch, loss)` pairs computed so far, in the order they were computed.
    pub(crate) fn take_losses(&mut self) -> Vec<(usize, P::Loss)> {
        std::mem::take(&mut self.losses)
    }

    /// The `(microbatch, output of the last stage)` pairs an evaluation kept so far.
    pub(crate) fn take_outputs(&mut self) -> Vec<(usize, P)> {
        std::mem::take(&mut self.outputs)
    }

    /// The losses computed so far by microbatch, `None` where none was, for `microbatches`
    /// microbatches.
    pub(crate) fn losses_by_microbatch(&mut self, microbatches: usize) -> Vec<Option<P::Loss>> {
        let mut by = Vec::with_capacity(microbatches);
        by.resize_with(microbatches, || None);
        for (k, l) in self.take_losses() {
            if let Some(slot) = by.get_mut(k) {
                *slot = Some(l);
            }
        }
        by
    }

    /// The transfers taken so far (data that crossed ranks and arrived here).
    pub(crate) fn take_transfers(&mut self) -> Vec<Transfer> {
        self.mailbox.take_transfers()
    }
}
