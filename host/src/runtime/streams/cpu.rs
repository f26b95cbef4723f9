//! [`CpuStreams`]: the reference [`Device`]: one worker thread per stream, events as flags, the host
//! layers run by the workers.
//!
//! It exists to test what a GPU backend relies on, without a GPU: the executor enqueues from one
//! thread and returns at once, the workers run their queues in order and meet only at events. A stage
//! is wrapped as [`OnStreams`], whose calls enqueue the host stage's work and return [`Pending`]
//! results; a program that lacked a wait would let a consumer run before its producer, and the
//! consumer would find its input missing (an error, not a wrong number).
//!
//! What it does not do: count activation memory ([`OnStreams`] reports 0 held bytes, since the stash is
//! filled later by a worker) or transfer bytes (a pending payload's size is known only once it runs).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Device, DeviceError, StreamId};
use crate::runtime::{Loss, Payload, Stage, StageError, Tensor};

type Job = Box<dyn FnOnce() + Send>;

/// A value a stream worker fills later (or one given ready).
pub struct Pending<T> {
    slot: Arc<Mutex<Option<T>>>,
    scale: f32,
}

impl<T> Pending<T> {
    /// A value that is already there (inputs and targets handed to a step).
    pub fn ready(value: T) -> Self {
        Pending {
            slot: Arc::new(Mutex::new(Some(value))),
            scale: 1.0,
        }
    }

    fn empty() -> Self {
        Pending {
            slot: Arc::new(Mutex::new(None)),
            scale: 1.0,
        }
    }

    /// A second handle to the same slot (for the job that fills or reads it).
    fn share(&self) -> Self {
        Pending {
            slot: Arc::clone(&self.slot),
            scale: 1.0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<T>> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fill(&self, value: T) {
        *self.lock() = Some(value);
    }

    fn take(&self) -> Result<T, String> {
        self.lock().take().ok_or_else(|| {
            "input not ready: its producer has not run on its stream yet (a missing wait?)".into()
        })
    }

    /// The value, once the step has been synchronised (`None` if it was never filled or was used).
    pub fn into_inner(self) -> Option<T> {
        self.lock().take()
    }
}

impl Pending<Tensor> {
    fn take_tensor(&self) -> Result<Tensor, String> {
        let mut t = self.take()?;
        if self.scale != 1.0 {
            t.scale(self.scale);
        }
        Ok(t)
    }
}

impl Payload for Pending<Tensor> {
    type Loss = Pending<f32>;

    fn bytes(&self) -> usize {
        self.lock().as_ref().map_or(0, Tensor::bytes)
    }

    fn scale_by(&mut self, by: f32) -> Result<(), StageError> {
        self.scale *= by;
        Ok(())
    }

    fn loss_value(loss: Pending<f32>) -> Result<f32, StageError> {
        loss.take().map_err(StageError::new)
    }
}

/// An event of [`CpuStreams`]: a flag its stream's worker raises when it reaches the record.
pub struct Flag {
    set: Mutex<bool>,
    cond: Condvar,
}

impl Flag {
    fn new() -> Arc<Self> {
        Arc::new(Flag {
            set: Mutex::new(false),
            cond: Condvar::new(),
        })
    }

    fn raise(&self) {
        *self.set.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cond.notify_all();
    }

    /// Waits until raised, or until `failed` (then nothing will raise it reliably).
    fn wait(&self, failed: &AtomicBool) {
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        while !*set && !failed.load(Ordering::SeqCst) {
            set = self
                .cond
                .wait_timeout(set, Duration::from_millis(5))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// What the device and the wrapped stages share: the queues, the bound stream, the first failure.
struct Link {
    queues: Mutex<Vec<Sender<Job>>>,
    current: AtomicUsize,
    failed: AtomicBool,
    error: Mutex<Option<String>>,
}

impl Link {
    fn send(&self, stream: usize, job: Job) -> Result<(), DeviceError> {
        let queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = queues
            .get(stream)
            .ok_or_else(|| DeviceError::new(format!("no stream {stream}")))?;
        tx.send(job)
            .map_err(|_| DeviceError::new(format!("stream {stream}'s worker has stopped")))
    }

    /// Enqueues layer work on the bound stream; skipped once anything failed, and a failure or a
    /// panic is kept as the device's error.
    fn enqueue(
        self: &Arc<Self>,
        work: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Result<(), StageError> {
        let link = Arc::clone(self);
        let stream = self.current.load(Ordering::SeqCst);
        let job: Job = Box::new(move || {
            if link.failed.load(Ordering::SeqCst) {
                return;
            }
            let message = match catch_unwind(AssertUnwindSafe(work)) {
                Ok(Ok(())) => return,
                Ok(Err(m)) => m,
                Err(_) => "a layer panicked".to_string(),
            };
            let mut error = link.error.lock().unwrap_or_else(PoisonError::into_inner);
            error.get_or_insert(format!("stream {stream}: {message}"));
            link.failed.store(true, Ordering::SeqCst);
        });
        self.send(stream, job)
            .map_err(|e| StageError::new(e.message))
    }
}

/// The reference device: one worker thread per stream, events as flags, host layers run by the
/// workers ([`OnStreams`]); it does not count activation or transfer bytes (they are known only once
/// a worker ran the work).
pub struct CpuStreams {
    link: Arc<Link>,
    workers: Vec<JoinHandle<()>>,
}

impl Default for CpuStreams {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuStreams {
    /// A device with no streams yet (the executor makes them).
    pub fn new() -> Self {
        CpuStreams {
            link: Arc::new(Link {
                queues: Mutex::new(Vec::new()),
                current: AtomicUsize::new(0),
                failed: AtomicBool::new(false),
                error: Mutex::new(None),
            }),
            workers: Vec::new(),
        }
    }

    /// `stage`, run by this device's stream workers.
    pub fn stage<S: Stage>(&self, stage: S) -> OnStreams<S> {
        OnStreams {
            stage: Arc::new(Mutex::new(stage)),
            link: Arc::clone(&self.link),
        }
    }

    /// `loss`, computed by this device's stream workers.
    pub fn loss<L: Loss + Send + 'static>(&self, loss: L) -> OnStreamsLoss<L> {
        OnStreamsLoss {
            loss: Arc::new(loss),
            link: Arc::clone(&self.link),
        }
    }

    fn control(
        &self,
        stream: usize,
        job: impl FnOnce() + Send + 'static,
    ) -> Result<(), DeviceError> {
        self.link.send(stream, Box::new(job))
    }
}

impl Drop for CpuStreams {
    fn drop(&mut self) {
        self.link.failed.store(true, Ordering::SeqCst);
        self.link
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Device for CpuStreams {
    type Payload = Pending<Tensor>;
    type Event = Arc<Flag>;
    type Mark = Pending<Instant>;

    fn make_streams(&mut self, streams: &[StreamId]) -> Result<(), DeviceError> {
        let mut queues = self
            .link
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for id in streams {
            let (tx, rx) = mpsc::channel::<Job>();
            let worker = std::thread::Builder::new()
                .name(format!("stream-r{}l{}", id.rank, id.lane))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .map_err(|e| DeviceError::new(format!("cannot start a stream worker: {e}")))?;
            queues.push(tx);
            self.workers.push(worker);
        }
        Ok(())
    }

    fn bind(&mut self, stream: usize) -> Result<(), DeviceError> {
        self.link.current.store(stream, Ordering::SeqCst);
        Ok(())
    }

    fn record(&mut self, stream: usize) -> Result<Arc<Flag>, DeviceError> {
        let flag = Flag::new();
        let f = Arc::clone(&flag);
        self.control(stream, move || f.raise())?;
        Ok(flag)
    }

    fn wait(&mut self, stream: usize, event: &Arc<Flag>) -> Result<(), DeviceError> {
        let (flag, link) = (Arc::clone(event), Arc::clone(&self.link));
        self.control(stream, move || flag.wait(&link.failed))
    }

    fn mark(&mut self, stream: usize) -> Result<Pending<Instant>, DeviceError> {
        let mark = Pending::empty();
        let m = mark.share();
        self.control(stream, move || m.fill(Instant::now()))?;
        Ok(mark)
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        let streams = self.workers.len();
        let mut flags = Vec::with_capacity(streams);
        for s in 0..streams {
            flags.push(self.record(s)?);
        }
        // The flags are raised even after a failure (control jobs always run).
        let never = AtomicBool::new(false);
        for f in &flags {
            f.wait(&never);
        }
        let error = self
            .link
            .error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.link.failed.store(false, Ordering::SeqCst);
        match error {
            Some(message) => Err(DeviceError::new(message)),
            None => Ok(()),
        }
    }

    fn seconds(
        &self,
        origin: &Pending<Instant>,
        mark: &Pending<Instant>,
    ) -> Result<f64, DeviceError> {
        let read = |m: &Pending<Instant>| {
            (*m.lock()).ok_or_else(|| DeviceError::new("a timing mark has not run"))
        };
        Ok(read(mark)?
            .saturating_duration_since(read(origin)?)
            .as_secs_f64())
    }
}

/// A host [`Stage`] whose calls a [`CpuStreams`] worker runs: each call enqueues the work on the bound
/// stream and returns [`Pending`] results at once.
pub struct OnStreams<S> {
    stage: Arc<Mutex<S>>,
    link: Arc<Link>,
}

impl<S> OnStreams<S> {
    /// The host stage (between steps: its weights and gradients).
    pub fn inner(&self) -> MutexGuard<'_, S> {
        self.stage.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn lock<S>(stage: &Mutex<S>) -> MutexGuard<'_, S> {
    stage.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<S: Stage + 'static> Stage<Pending<Tensor>> for OnStreams<S>
where
    S::Stash: 'static,
{
    type Stash = Pending<S::Stash>;

    fn forward(
        &mut self,
        input: Pending<Tensor>,
    ) -> Result<(Pending<Tensor>, Self::Stash), StageError> {
        let (out, stash) = (Pending::empty(), Pending::empty());
        let (o, st, stage) = (out.share(), stash.share(), Arc::clone(&self.stage));
        self.link.enqueue(move || {
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
        stash: &mut Self::Stash,
        grad_output: Pending<Tensor>,
    ) -> Result<Pending<Tensor>, StageError> {
        let out = Pending::empty();
        let (o, st, stage) = (out.share(), stash.share(), Arc::clone(&self.stage));
        self.link.enqueue(move || {
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

    fn backward_weight(&mut self, stash: Self::Stash) -> Result<(), StageError> {
        let stage = Arc::clone(&self.stage);
        self.link.enqueue(move || {
            let s = stash.take()?;
            lock(&stage).backward_weight(s).map_err(|e| e.to_string())
        })
    }

    fn backward(
        &mut self,
        stash: Self::Stash,
        grad_output: Pending<Tensor>,
    ) -> Result<Pending<Tensor>, StageError> {
        let out = Pending::empty();
        let (o, stage) = (out.share(), Arc::clone(&self.stage));
        self.link.enqueue(move || {
            let (s, g) = (stash.take()?, grad_output.take_tensor()?);
            o.fill(lock(&stage).backward(s, g).map_err(|e| e.to_string())?);
            Ok(())
        })?;
        Ok(out)
    }

    fn held_bytes(&self, _: &Self::Stash) -> usize {
        0
    }

    fn zero_grad(&mut self) {
        lock(&self.stage).zero_grad();
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        lock(&self.stage).optimizer_step()
    }
}

/// A host [`Loss`] computed by a [`CpuStreams`] worker.
pub struct OnStreamsLoss<L> {
    loss: Arc<L>,
    link: Arc<Link>,
}

impl<L: Loss + Send + 'static> Loss<Pending<Tensor>> for OnStreamsLoss<L> {
    fn loss(
        &self,
        output: &Pending<Tensor>,
        target: &Pending<Tensor>,
    ) -> Result<(Pending<f32>, Pending<Tensor>), StageError> {
        let (value, grad) = (Pending::empty(), Pending::empty());
        let (v, g, y, t) = (value.share(), grad.share(), output.share(), target.share());
        let loss = Arc::clone(&self.loss);
        self.link.enqueue(move || {
            let y = y.take_tensor()?;
            let t = t.lock().clone().ok_or("no target for this microbatch")?;
            let (lv, lg) = loss.loss(&y, &t).map_err(|e| e.to_string())?;
            v.fill(lv);
            g.fill(lg);
            Ok(())
        })?;
        Ok((value, grad))
    }
}
