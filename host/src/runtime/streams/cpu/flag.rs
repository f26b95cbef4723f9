//! [`Flag`]: the events of [`CpuStreams`](super::CpuStreams).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// An event of [`CpuStreams`](super::CpuStreams): a flag its stream's worker raises when it reaches the record.
pub struct Flag {
    set: Mutex<bool>,
    cond: Condvar,
    /// Whether a stream waited on it during a capture (see `cpu/joins.rs`).
    waited: AtomicBool,
}

impl Flag {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Flag {
            set: Mutex::new(false),
            cond: Condvar::new(),
            waited: AtomicBool::new(false),
        })
    }

    /// The flag's identity while it is alive (its address), for the capture's event map.
    pub(super) fn id(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as usize
    }

    /// A stream waited on this flag during a capture.
    pub(super) fn note_waited(&self) {
        self.waited.store(true, Ordering::SeqCst);
    }

    /// Whether a stream waited on this flag during a capture.
    pub(super) fn was_waited(&self) -> bool {
        self.waited.load(Ordering::SeqCst)
    }

    pub(super) fn lower(&self) {
        *self.set.lock().unwrap_or_else(PoisonError::into_inner) = false;
    }

    pub(super) fn raise(&self) {
        *self.set.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cond.notify_all();
    }

    /// Waits until raised, or until `failed` (then nothing will raise it reliably).
    pub(super) fn wait(&self, failed: &AtomicBool) {
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
