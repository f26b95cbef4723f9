//! Recomputation on the [`Machine`].
//!
//! Full: `F` keeps a copy of the stage's input instead of the stash, and the stage's `I` or `B`
//! (finding no stash) runs the forward again on that input, in a layer call of its own
//! ([`Calls::rebuild`]), before the backward. Selective: `F` shrinks the stash
//! ([`Stage::shrink`]), and `I` or `B` (finding it shrunk) rebuilds it ([`Stage::rebuild`]) in a
//! layer call of its own before the backward.
//!
//! The accounting follows the footprint model
//! ([`StageCost::footprint`](crate::cost::StageCost::footprint)) move for move: `F` holds the
//! input's bytes (full) or the shrunk stash's (selective), and the rebuilt stash is held from the
//! start of `I` or `B`.

use super::{Calls, Machine, Stashed};
use crate::cost::Recompute;
use crate::runtime::{Payload, Stage};
use crate::schedule::{Action, Op};

impl<P: Payload, T> Machine<P, T> {
    /// `F` on a stage with recomputation `mode`. Full: keeps a copy of `input` (its bytes held
    /// until the backward) and drops the stash as soon as the forward returns. Selective: the
    /// forward, then [`Stage::shrink`] on its stash in the same layer call; the shrunk stash's
    /// bytes are held until the backward rebuilds it.
    #[cold]
    #[inline(never)]
    pub(super) fn forward_recomputing<S: Stage<P, Stash = T>, C: Calls<P>>(
        &mut self,
        mode: Recompute,
        a: Action,
        key: (usize, usize),
        input: P,
        stage: &mut S,
        calls: &mut C,
    ) -> Result<P, C::Stop> {
        if mode == Recompute::Selective {
            let (out, stash, bytes, shrunk) = calls.call(a, || {
                let (out, mut stash) = stage.forward(input)?;
                let shrunk = stage.shrink(&mut stash)?;
                let bytes = stage.held_bytes(&stash);
                Ok((out, stash, bytes, shrunk))
            })?;
            self.hold(bytes, 0);
            self.stash(key, stash, bytes, false, shrunk);
            return Ok(out);
        }
        if self.kept.contains_key(&key) {
            return Err(self.fail(a, "this forward already ran and its input is still kept"));
        }
        let kept = calls.keep(a, &input)?;
        let (out, stash) = calls.call(a, || stage.forward(input))?;
        drop(stash);
        self.hold(kept.bytes(), 0);
        self.kept.insert(key, kept);
        Ok(out)
    }

    /// `I` or `B` (`a.op`) on a stage that kept its input: the forward again on it, then the
    /// backward on the rebuilt stash, held from the call's start. After `I` the stash stays for
    /// `W`; after `B` it is gone.
    #[cold]
    #[inline(never)]
    pub(super) fn backward_rebuilt<S: Stage<P, Stash = T>, C: Calls<P>>(
        &mut self,
        a: Action,
        grad: P,
        stage: &mut S,
        calls: &mut C,
    ) -> Result<P, C::Stop> {
        let key = (a.stage, a.microbatch);
        let Some(input) = self.kept.remove(&key) else {
            return Err(self.no_stash(a));
        };
        let kept = input.bytes();
        let (stash, rebuilt) = calls.rebuild(a, || {
            let (_, stash) = stage.forward(input)?;
            let rebuilt = stage.held_bytes(&stash);
            Ok((stash, rebuilt))
        })?;
        self.hold(rebuilt, kept);
        self.backward_on(a, key, stash, rebuilt, grad, stage, calls)
    }

    /// `I` or `B` (`a.op`) on `slot`, a stash selective recomputation shrank after `F` (taken
    /// out of the stashes): the stage rebuilds it (its bytes held from the start), then the
    /// backward runs on it.
    #[cold]
    #[inline(never)]
    pub(super) fn backward_selective<S: Stage<P, Stash = T>, C: Calls<P>>(
        &mut self,
        a: Action,
        slot: Stashed<T>,
        grad: P,
        stage: &mut S,
        calls: &mut C,
    ) -> Result<P, C::Stop> {
        let key = (a.stage, a.microbatch);
        let Stashed {
            mut stash, bytes, ..
        } = slot;
        let rebuilt = calls.rebuild(a, || {
            stage.rebuild(&mut stash)?;
            Ok(stage.held_bytes(&stash))
        })?;
        self.hold(rebuilt, bytes);
        self.backward_on(a, key, stash, rebuilt, grad, stage, calls)
    }

    /// The backward `a.op` (`I` or `B`) on a rebuilt `stash` holding `rebuilt` bytes: after `I` the
    /// stash stays for `W`, holding what the stage says; after `B` it is gone.
    #[allow(clippy::too_many_arguments)]
    fn backward_on<S: Stage<P, Stash = T>, C: Calls<P>>(
        &mut self,
        a: Action,
        key: (usize, usize),
        mut stash: T,
        rebuilt: usize,
        grad: P,
        stage: &mut S,
        calls: &mut C,
    ) -> Result<P, C::Stop> {
        if a.op != Op::I {
            let grad_input = calls.call(a, || stage.backward(stash, grad));
            self.hold(0, rebuilt);
            return grad_input;
        }
        let (grad_input, bytes) = calls.call(a, || {
            let grad_input = stage.backward_input(&mut stash, grad)?;
            Ok((grad_input, stage.held_bytes(&stash)))
        })?;
        self.hold(bytes, rebuilt);
        self.stash(key, stash, bytes, true, false);
        Ok(grad_input)
    }
}
