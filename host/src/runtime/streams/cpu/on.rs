//! [`OnStreams`] and [`OnStreamsLoss`]: a host stage and a host loss whose calls a [`CpuStreams`]
//! worker runs, on the stream each call is given.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

#[cfg(doc)]
use super::CpuStreams;
use super::{CpuStream, Pending, NOT_READY};
use crate::runtime::streams::{GradientsFn, StreamLoss, StreamStage};
use crate::runtime::{Loss, Stage, StageError, Tensor};

/// A host [`Stage`] whose calls a [`CpuStreams`] worker runs: each call enqueues the work on the
/// stream it is given and returns [`Pending`] results at once.
pub struct OnStreams<S> {
    stage: Arc<Mutex<S>>,
}

impl<S> OnStreams<S> {
    pub(super) fn new(stage: S) -> Self {
        OnStreams {
            stage: Arc::new(Mutex::new(stage)),
        }
    }

    /// The host stage (between steps: its weights and gradients).
    pub fn inner(&self) -> MutexGuard<'_, S> {
        self.stage.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn lock<S>(stage: &Mutex<S>) -> MutexGuard<'_, S> {
    stage.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<S: Stage + 'static> StreamStage<CpuStream, Pending<Tensor>> for OnStreams<S>
where
    S::Stash: 'static,
{
    type Stash = Pending<S::Stash>;

    fn forward(
        &mut self,
        on: &CpuStream,
        input: Pending<Tensor>,
    ) -> Result<(Pending<Tensor>, Self::Stash), StageError> {
        let device = on.placed(&input)?;
        let (out, stash) = (Pending::empty_on(device), Pending::empty_on(device));
        let (o, st, stage) = (out.share(), stash.share(), Arc::clone(&self.stage));
        on.enqueue(move || {
            let x = input.take_tensor()?;
            let (y, s) = lock(&stage).forward(x).map_err(|e| e.to_string())?;
            o.fill(y);
            st.fill(s);
            Ok(())
        })?;
        Ok((out, stash))
    }

    fn backward_input(
        &mut self,
        on: &CpuStream,
        stash: &mut Self::Stash,
        grad_output: Pending<Tensor>,
    ) -> Result<Pending<Tensor>, StageError> {
        let out = Pending::empty_on(on.placed(&grad_output)?);
        let (o, st, stage) = (out.share(), stash.share(), Arc::clone(&self.stage));
        on.enqueue(move || {
            let g = grad_output.take_tensor()?;
            let mut held = st.lock();
            let s = held
                .as_mut()
                .ok_or("no stash: its forward has not run yet")?;
            o.fill(
                lock(&stage)
                    .backward_input(s, g)
                    .map_err(|e| e.to_string())?,
            );
            Ok(())
        })?;
        Ok(out)
    }

    fn backward_weight(&mut self, on: &CpuStream, stash: Self::Stash) -> Result<(), StageError> {
        let stage = Arc::clone(&self.stage);
        on.enqueue(move || {
            let s = stash.take()?;
            lock(&stage).backward_weight(s).map_err(|e| e.to_string())
        })
    }

    fn backward(
        &mut self,
        on: &CpuStream,
        stash: Self::Stash,
        grad_output: Pending<Tensor>,
    ) -> Result<Pending<Tensor>, StageError> {
        let out = Pending::empty_on(on.placed(&grad_output)?);
        let (o, stage) = (out.share(), Arc::clone(&self.stage));
        on.enqueue(move || {
            let (s, g) = (stash.take()?, grad_output.take_tensor()?);
            o.fill(lock(&stage).backward(s, g).map_err(|e| e.to_string())?);
            Ok(())
        })?;
        Ok(out)
    }

    fn held_bytes(&self, _: &Self::Stash) -> usize {
        0
    }

    /// Enqueued after the forward: `true` before the stash is known (the host stage's
    /// [`Stage::rebuild`] does nothing on a stash its `shrink` left whole).
    fn shrink(&mut self, on: &CpuStream, stash: &mut Self::Stash) -> Result<bool, StageError> {
        let (st, stage) = (stash.share(), Arc::clone(&self.stage));
        on.enqueue(move || {
            let mut held = st.lock();
            let s = held.as_mut().ok_or("no stash: its forward has not run")?;
            lock(&stage).shrink(s).map_err(|e| e.to_string())?;
            Ok(())
        })?;
        Ok(true)
    }

    /// Enqueued before the backward.
    fn rebuild(&mut self, on: &CpuStream, stash: &mut Self::Stash) -> Result<(), StageError> {
        let (st, stage) = (stash.share(), Arc::clone(&self.stage));
        on.enqueue(move || {
            let mut held = st.lock();
            let s = held.as_mut().ok_or("no stash: its forward has not run")?;
            lock(&stage).rebuild(s).map_err(|e| e.to_string())
        })
    }

    /// Now, or (while the device captures) as a job on `on`, kept for every replay.
    fn zero_grad(&mut self, on: &CpuStream) {
        if !on.link.capturing.load(Ordering::SeqCst) {
            lock(&self.stage).zero_grad();
            return;
        }
        let stage = Arc::clone(&self.stage);
        let queued = on.enqueue(move || {
            lock(&stage).zero_grad();
            Ok(())
        });
        if let Err(e) = queued {
            on.link.fail(format!("zero_grad: {e}"));
        }
    }

    /// On the host, after the step was synchronised.
    fn optimizer_step(&mut self, _: &CpuStream) -> Result<(), StageError> {
        lock(&self.stage).optimizer_step()
    }

    /// On the host, after the step was synchronised: the host stage's own buffers.
    fn with_gradients(&mut self, _: &CpuStream, f: &mut GradientsFn<'_>) -> Result<(), StageError> {
        f(lock(&self.stage).gradients())
    }
}

/// A host [`Loss`] computed by a [`CpuStreams`] worker, on the stream it is given.
pub struct OnStreamsLoss<L> {
    loss: Arc<L>,
}

crate::boxed_stream_stage!(CpuStream, Pending<Tensor>);

impl<L> OnStreamsLoss<L> {
    pub(super) fn new(loss: L) -> Self {
        OnStreamsLoss {
            loss: Arc::new(loss),
        }
    }
}

impl<L: Loss + Send + 'static> StreamLoss<CpuStream, Pending<Tensor>> for OnStreamsLoss<L> {
    fn loss(
        &self,
        on: &CpuStream,
        output: &Pending<Tensor>,
        target: &Pending<Tensor>,
    ) -> Result<(Pending<f32>, Pending<Tensor>), StageError> {
        on.placed(output)?;
        let device = on.placed(target)?;
        let (value, grad) = (Pending::empty_on(device), Pending::empty_on(device));
        let (v, g, y, t) = (value.share(), grad.share(), output.share(), target.share());
        let loss = Arc::clone(&self.loss);
        on.enqueue(move || {
            // Read in place, not taken: an evaluation keeps the output after its loss.
            let y = y.lock();
            let y = y.as_ref().ok_or(NOT_READY)?;
            let t = t.lock();
            let t = t.as_ref().ok_or("no target for this microbatch")?;
            let (lv, lg) = loss.loss(y, t).map_err(|e| e.to_string())?;
            v.fill(lv);
            g.fill(lg);
            Ok(())
        })?;
        Ok((value, grad))
    }
}
