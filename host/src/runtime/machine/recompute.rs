//! Full recomputation on the [`Machine`]: `F` keeps a copy of the stage's input instead of the
//! stash, and the stage's `I` or `B` (finding no stash) runs the forward again on that input,
//! inside its own layer call, before the backward. The accounting follows the footprint model
//! ([`StageCost::footprint`](crate::cost::StageCost::footprint)) move for move: `F` holds the
//! input's bytes, and the rebuilt stash is held from the start of `I` or `B`.

use super::{Calls, Machine, Stashed};
use crate::runtime::{Payload, Stage};
use crate::schedule::{Action, Op};

impl<P: Payload, T> Machine<P, T> {
    /// `F` with full recomputation: keeps a copy of `input` (its bytes held until the backward)
    /// and drops the stash as soon as the forward returns.
    pub(super) fn forward_keeping_input<S: Stage<P, Stash = T>, C: Calls<P>>(
        &mut self,
        a: Action,
        key: (usize, usize),
        input: P,
        stage: &mut S,
        calls: &mut C,
    ) -> Result<P, C::Stop> {
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
        let split = a.op == Op::I;
        let (grad_input, left, rebuilt) = calls.call(a, || {
            let (_, mut stash) = stage.forward(input)?;
            let rebuilt = stage.held_bytes(&stash);
            if split {
                let grad_input = stage.backward_input(&mut stash, grad)?;
                let bytes = stage.held_bytes(&stash);
                Ok((grad_input, Some((stash, bytes)), rebuilt))
            } else {
                Ok((stage.backward(stash, grad)?, None, rebuilt))
            }
        })?;
        self.hold(rebuilt, kept);
        let bytes = left.as_ref().map_or(0, |(_, b)| *b);
        self.hold(bytes, rebuilt);
        if let Some((stash, bytes)) = left {
            let stashed = Stashed {
                stash,
                input_done: true,
                bytes,
            };
            self.stashes.insert(key, stashed);
        }
        Ok(grad_input)
    }
}
