//! [`Flag`]: the events of [`CpuStreams`](super::CpuStreams).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// An event of [`CpuStreams`](super::CpuStreams): a flag its stream's worker raises when it reaches the record.
pub struct Flag {
    set: Mutex<bool>,
    cond: Condvar,
}

impl Flag {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Flag {
            set: Mutex::new(false),
            cond: Condvar::new(),
        })
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
