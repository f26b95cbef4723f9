//! [`CpuStreams`]: the reference [`Device`]: one worker thread per stream, events as flags, the host
//! layers run by the workers.
//!
//! It exists to test what a GPU backend relies on, without a GPU: the executor enqueues from one
//! thread and returns at once, the workers run their queues in order and meet only at events. A stage
//! is wrapped as [`OnStreams`], whose calls enqueue the host stage's work on the [`CpuStream`] they
//! are given and return [`Pending`] results; a program that lacked a wait would let a consumer run before its producer, and the
//! consumer would find its input missing (an error, not a wrong number).
//!
//! Several devices: [`CpuStreams::with_devices`] puts each rank's streams on a device of a map, tags
//! every payload with the device it lives on ([`Pending::device`]), refuses a payload from another
//! device ([`Misplaced`](super::Misplaced)) and moves one with [`Device::adopt`] (counting the bytes:
//! [`CpuStreams::copied_bytes`]). See `cpu/devices.rs`.
//!
//! What it does not do: count activation memory ([`OnStreams`] reports 0 held bytes, since the stash is
//! filled later by a worker) or transfer bytes (a pending payload's size is known only once it runs).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use super::{Device, DeviceError, StreamId};

mod capture;
mod devices;
mod flag;
mod joins;
mod on;
mod peer;

use crate::runtime::{Loss, Payload, Stage, StageError, Tensor};

/// One stream of a [`CpuStreams`], as a stage call is given it: the worker its work is queued to.
pub struct CpuStream {
    link: Arc<Link>,
    index: usize,
}

impl CpuStream {
    /// Enqueues layer work on this stream; skipped once anything failed, and a failure or a panic
    /// is kept as the device's error.
    fn enqueue(
        &self,
        work: impl Fn() -> Result<(), String> + Send + 'static,
    ) -> Result<(), StageError> {
        self.link
            .enqueue_on(self.index, work)
            .map_err(|e| StageError::new(e.message))
    }

    /// The device of this stream, when `payload` lives there (see [`Link::placed`]).
    fn placed<T>(&self, payload: &Pending<T>) -> Result<usize, StageError> {
        self.link.placed(self.index, payload)
    }
}
pub use flag::Flag;
use joins::unjoined;
pub use on::{OnStreams, OnStreamsLoss};
pub use peer::{CpuPeer, CpuPeers};

/// What a stream job says when a value it reads was never filled.
const NOT_READY: &str =
    "input not ready: its producer has not run on its stream yet (a missing wait?)";

/// What a stream worker is sent.
enum Job {
    /// Run this once now.
    Once(Box<dyn FnOnce() + Send>),
    /// Keep this for every [`Job::Replay`] (sent while capturing).
    Keep(Box<dyn Fn() + Send>),
    /// Run every kept job, in the order kept.
    Replay,
}

/// A value a stream worker fills later (or one given ready), tagged with the device it lives on.
pub struct Pending<T> {
    slot: Arc<Mutex<Option<T>>>,
    scale: f32,
    device: usize,
}

impl<T> Pending<T> {
    /// A value that is already there (inputs and targets handed to a step), on device 0.
    pub fn ready(value: T) -> Self {
        Self::ready_on(0, value)
    }

    /// A value that is already there, on device `device` (of a [`CpuStreams::with_devices`] map).
    pub fn ready_on(device: usize, value: T) -> Self {
        Pending {
            slot: Arc::new(Mutex::new(Some(value))),
            scale: 1.0,
            device,
        }
    }

    fn empty() -> Self {
        Self::empty_on(0)
    }

    fn empty_on(device: usize) -> Self {
        Pending {
            slot: Arc::new(Mutex::new(None)),
            scale: 1.0,
            device,
        }
    }

    /// A second handle to the same slot (for the job that fills or reads it).
    fn share(&self) -> Self {
        Pending {
            slot: Arc::clone(&self.slot),
            scale: 1.0,
            device: self.device,
        }
    }

    /// The device the value lives on (0 unless the device has a map).
    pub fn device(&self) -> usize {
        self.device
    }

    fn lock(&self) -> MutexGuard<'_, Option<T>> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fill(&self, value: T) {
        *self.lock() = Some(value);
    }

    fn take(&self) -> Result<T, String> {
        self.lock().take().ok_or_else(|| NOT_READY.into())
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

/// What the device and its streams share: the queues, the first failure.
struct Link {
    queues: Mutex<Vec<Sender<Job>>>,
    failed: AtomicBool,
    error: Mutex<Option<String>>,
    /// Jobs are kept for replay instead of run (between `begin_capture` and `end_capture`).
    capturing: AtomicBool,
    /// The device of each stream (all 0 without a map).
    devices: Mutex<Vec<usize>>,
    /// Bytes moved between devices by adopted payloads, since the device was made.
    copied: AtomicUsize,
    /// The capture's fork/join model (while capturing).
    joins: Mutex<Option<joins::Joins>>,
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

    /// Sends `job` to run once, or to be kept for replay while capturing (refused on a stream
    /// that has not joined the capture: see `cpu/joins.rs`).
    fn submit(&self, stream: usize, job: impl Fn() + Send + 'static) -> Result<(), DeviceError> {
        let job = if self.capturing.load(Ordering::SeqCst) {
            if let Some(joins) = self.joins().as_mut() {
                joins.work(stream)?;
            }
            Job::Keep(Box::new(job))
        } else {
            Job::Once(Box::new(job))
        };
        self.send(stream, job)
    }

    fn joins(&self) -> MutexGuard<'_, Option<joins::Joins>> {
        self.joins.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `message` as the device's error (the first one wins) and skips later work.
    fn fail(&self, message: String) {
        let mut error = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        error.get_or_insert(message);
        self.failed.store(true, Ordering::SeqCst);
    }

    /// Enqueues layer work on `stream`; skipped once anything failed, and a failure or a panic is
    /// kept as the device's error.
    fn enqueue_on(
        self: &Arc<Self>,
        stream: usize,
        work: impl Fn() -> Result<(), String> + Send + 'static,
    ) -> Result<(), DeviceError> {
        let link = Arc::clone(self);
        self.submit(stream, move || {
            if link.failed.load(Ordering::SeqCst) {
                return;
            }
            let message = match catch_unwind(AssertUnwindSafe(&work)) {
                Ok(Ok(())) => return,
                Ok(Err(m)) => m,
                Err(_) => "a layer panicked".to_string(),
            };
            link.fail(format!("stream {stream}: {message}"));
        })
    }
}

/// The reference device: one worker thread per stream, events as flags, host layers run by the
/// workers ([`OnStreams`]); it does not count activation or transfer bytes (they are known only once
/// a worker ran the work). With a device map ([`CpuStreams::with_devices`]) it stands for several
/// devices and counts the bytes it copies between them.
pub struct CpuStreams {
    link: Arc<Link>,
    /// The streams made, as stage calls are given them.
    streams: Vec<CpuStream>,
    /// The device of each rank (empty: every rank on device 0).
    rank_devices: Vec<usize>,
    workers: Vec<JoinHandle<()>>,
    /// The events recorded while capturing: lowered before each replay.
    captured_flags: Vec<Arc<Flag>>,
    /// Whether the workers keep a captured step.
    captured: bool,
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
                failed: AtomicBool::new(false),
                error: Mutex::new(None),
                capturing: AtomicBool::new(false),
                devices: Mutex::new(Vec::new()),
                copied: AtomicUsize::new(0),
                joins: Mutex::new(None),
            }),
            streams: Vec::new(),
            rank_devices: Vec::new(),
            workers: Vec::new(),
            captured_flags: Vec::new(),
            captured: false,
        }
    }

    /// `stage`, run by the stream workers of the streams its calls are given.
    pub fn stage<S: Stage>(&self, stage: S) -> OnStreams<S> {
        OnStreams::new(stage)
    }

    /// `loss`, computed by the stream workers of the streams its calls are given.
    pub fn loss<L: Loss + Send + 'static>(&self, loss: L) -> OnStreamsLoss<L> {
        OnStreamsLoss::new(loss)
    }

    fn control(&self, stream: usize, job: impl Fn() + Send + 'static) -> Result<(), DeviceError> {
        self.link.submit(stream, job)
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
    type Stream = CpuStream;
    type Event = Arc<Flag>;
    type Mark = Pending<Instant>;

    fn make_streams(&mut self, streams: &[StreamId]) -> Result<(), DeviceError> {
        self.map_streams(streams)?;
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
                    let mut kept: Vec<Box<dyn Fn() + Send>> = Vec::new();
                    while let Ok(job) = rx.recv() {
                        match job {
                            Job::Once(job) => job(),
                            Job::Keep(job) => kept.push(job),
                            Job::Replay => kept.iter().for_each(|job| job()),
                        }
                    }
                })
                .map_err(|e| DeviceError::new(format!("cannot start a stream worker: {e}")))?;
            self.streams.push(CpuStream {
                link: Arc::clone(&self.link),
                index: queues.len(),
            });
            queues.push(tx);
            self.workers.push(worker);
        }
        Ok(())
    }

    fn stream(&self, index: usize) -> Option<&CpuStream> {
        self.streams.get(index)
    }

    fn record(&mut self, stream: usize) -> Result<Arc<Flag>, DeviceError> {
        let flag = Flag::new();
        let f = Arc::clone(&flag);
        self.control(stream, move || f.raise())?;
        if self.link.capturing.load(Ordering::SeqCst) {
            if let Some(joins) = self.link.joins().as_mut() {
                joins.record(stream, flag.id());
            }
            self.captured_flags.push(Arc::clone(&flag));
        }
        Ok(flag)
    }

    fn wait(&mut self, stream: usize, event: &Arc<Flag>) -> Result<(), DeviceError> {
        if self.link.capturing.load(Ordering::SeqCst) {
            event.note_waited();
            if let Some(joins) = self.link.joins().as_mut() {
                joins.wait(stream, event.id());
            }
        }
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
        if self.link.capturing.load(Ordering::SeqCst) {
            return Err(DeviceError::new("synchronize during a capture"));
        }
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

    fn stream_device(&self, stream: usize) -> usize {
        self.link.device_of(stream)
    }

    fn payload_device(&self, payload: &Pending<Tensor>) -> Option<usize> {
        Some(payload.device)
    }

    fn adopt(
        &mut self,
        stream: usize,
        payload: Pending<Tensor>,
    ) -> Result<Pending<Tensor>, DeviceError> {
        self.adopt_on(stream, payload)
    }

    fn begin_capture(&mut self) -> Result<(), DeviceError> {
        self.start_capture()
    }

    fn end_capture(&mut self) -> Result<(), DeviceError> {
        self.finish_capture()
    }

    fn replay(&mut self) -> Result<(), DeviceError> {
        self.replay_captured()
    }

    fn copy(&self, stream: usize, src: &Pending<Tensor>) -> Result<Pending<Tensor>, DeviceError> {
        self.copy_on(stream, src)
    }

    fn refresh(
        &mut self,
        dst: &mut Pending<Tensor>,
        src: Pending<Tensor>,
    ) -> Result<(), DeviceError> {
        capture::refresh(dst, src)
    }

    fn read_loss(&self, loss: &Pending<f32>) -> Result<f32, DeviceError> {
        (*loss.lock()).ok_or_else(|| DeviceError::new("the captured step left no loss value"))
    }
}
