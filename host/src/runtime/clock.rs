//! Timing and guarding a worker's layer calls: the [`Clock`] that turns call boundaries into span
//! and action times, and [`guarded`], which turns a layer's error or panic into a [`RankStop`] naming
//! the rank and the action.
//!
//! Beside the wall clock, a layer call reads the thread's CPU clock
//! ([`thread_cpu_seconds`]) before and after: the wall time
//! it took beyond its CPU time is time the thread was descheduled (ready, not running). That clock
//! is a system call (0.2-3 us a read, most in virtual machines), so calls are read only while the
//! rank's calls are long ([`CPU_CLOCK_FROM`]): microsecond layers are not slowed, and their rare
//! descheduling is missed (counted as compute).
//!
//! The hot functions are `#[inline]`: in a module of their own they may land in another codegen
//! unit than the worker's loop, and not inlining them cost about 20 ns per action (measured with
//! `cargo bench --bench runtime -- executor`, see docs/measurements.md).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Instant;

use super::machine::{action_failed, Calls, RankOutcome, RankStop};
use super::{RuntimeError, StageError, Tensor};
use crate::cpu_time::thread_cpu_seconds;
use crate::schedule::Action;

/// A rank's layer calls are read on the CPU clock while its recent calls take this long (the
/// longest of the last call, half the one before, a quarter of the one before that, ...): two
/// reads then cost at most a few percent of a call.
pub const CPU_CLOCK_FROM: f64 = 100e-6;

/// Times layer calls: the span of an item runs from its first layer call's start to its last
/// one's end, so waiting for an input is idle time, not busy time. The same holds per action
/// (the last stage's `F` is two calls: its forward and the loss).
pub(super) struct Clock<'c> {
    pub epoch: Instant,
    pub exclusive: Option<&'c Mutex<()>>,
    /// Start of the current item's first layer call.
    pub first_start: Option<f64>,
    /// Start of the current action's first layer call.
    pub action_start: Option<f64>,
    /// End of the last layer call.
    pub last_end: f64,
    /// Seconds the current item's layer calls took beyond the thread's CPU time in them.
    pub descheduled: f64,
    /// Seconds the current item's inputs from other ranks had been sent while the rank waited
    /// for them but had not yet returned from the receive (set by the worker).
    pub woken_late: f64,
    /// The length of the rank's recent calls, decaying by half a call: the CPU clock is read
    /// while it is at least [`CPU_CLOCK_FROM`].
    recent: f64,
}

impl<'c> Clock<'c> {
    /// A clock counting seconds from `epoch`, taking the `exclusive` lock (if any) for each call.
    #[inline]
    pub fn new(epoch: Instant, exclusive: Option<&'c Mutex<()>>) -> Self {
        Clock {
            epoch,
            exclusive,
            first_start: None,
            action_start: None,
            last_end: 0.0,
            descheduled: 0.0,
            woken_late: 0.0,
            // The step's first call is read: nothing is known of the rank's calls yet.
            recent: CPU_CLOCK_FROM,
        }
    }

    /// Starts a new item: no layer call yet, nothing lost yet.
    #[inline]
    pub fn next_item(&mut self) {
        self.first_start = None;
        self.descheduled = 0.0;
        self.woken_late = 0.0;
    }

    /// Runs a layer call, timing it (holding the exclusive lock if any), and turns its error or
    /// panic into a failure naming rank and action.
    #[inline]
    pub fn call<T>(
        &mut self,
        rank: usize,
        action: Action,
        times: &mut Vec<(Action, f64)>,
        f: impl FnOnce() -> Result<T, StageError>,
    ) -> Result<T, RankStop> {
        let _turn = self
            .exclusive
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()));
        // The CPU clock is read outside the wall clock's reads, so that its own cost is not
        // counted as time descheduled.
        let cpu_start = (self.recent >= CPU_CLOCK_FROM)
            .then(thread_cpu_seconds)
            .flatten();
        let start = self.epoch.elapsed().as_secs_f64();
        let result = guarded(rank, action, f);
        let end = self.epoch.elapsed().as_secs_f64();
        if let Some(a) = cpu_start {
            if let Some(b) = thread_cpu_seconds() {
                self.descheduled += ((end - start) - (b - a)).max(0.0);
            }
        }
        self.recent = (end - start).max(0.5 * self.recent);
        self.first_start.get_or_insert(start);
        self.action_start.get_or_insert(start);
        self.last_end = end;
        times.push((action, end - start));
        result
    }
}

/// The worker's layer calls for the [`Machine`](super::machine::Machine): timed by `clock`
/// (`out.action_seconds` gets each call's duration, `out.rebuild_seconds` each stash rebuild's
/// again), guarded against errors and panics.
pub(super) struct Timed<'r, 'c> {
    pub clock: &'r mut Clock<'c>,
    pub rank: usize,
    pub out: &'r mut RankOutcome,
}

impl Calls<Tensor> for Timed<'_, '_> {
    type Stop = RankStop;

    fn rank(&self) -> usize {
        self.rank
    }

    /// A clone: the forward consumes its input, the rebuild reads the clone.
    #[inline]
    fn keep(&mut self, _: Action, input: &Tensor) -> Result<Tensor, RankStop> {
        Ok(input.clone())
    }

    #[inline]
    fn call<R>(
        &mut self,
        action: Action,
        f: impl FnOnce() -> Result<R, StageError>,
    ) -> Result<R, RankStop> {
        self.clock
            .call(self.rank, action, &mut self.out.action_seconds, f)
    }

    /// Timed as any call (its time is the action's), and recorded apart as a rebuild.
    #[inline]
    fn rebuild<R>(
        &mut self,
        action: Action,
        f: impl FnOnce() -> Result<R, StageError>,
    ) -> Result<R, RankStop> {
        let r = self
            .clock
            .call(self.rank, action, &mut self.out.action_seconds, f);
        if let Some(&last) = self.out.action_seconds.last() {
            self.out.rebuild_seconds.push(last);
        }
        r
    }
}

/// Runs a layer call, turning its error or panic into a failure naming rank and action.
#[inline]
pub(super) fn guarded<T>(
    rank: usize,
    action: Action,
    f: impl FnOnce() -> Result<T, StageError>,
) -> Result<T, RankStop> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(RankStop::Failed(action_failed(rank, action, e))),
        Err(p) => Err(RankStop::Failed(RuntimeError::ActionPanicked {
            rank,
            action,
            message: panic_message(&*p),
        })),
    }
}

/// The text of a panic payload.
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    #[cfg(unix)]
    fn long_calls_are_read_on_the_cpu_clock_and_short_ones_are_not() {
        let a: Action = "0F0".parse().unwrap();
        let mut clock = Clock::new(Instant::now(), None);
        let mut times = Vec::new();
        let mut call = |clock: &mut Clock<'_>, sleep: Duration| {
            let slept = || {
                std::thread::sleep(sleep);
                Ok(())
            };
            clock.call(0, a, &mut times, slept).unwrap();
        };
        // The first call is read: a sleep is off the CPU, so all of it counts as descheduled.
        call(&mut clock, Duration::from_millis(2));
        assert!(clock.descheduled >= 0.0019, "{}", clock.descheduled);
        // Instant calls: the recent length decays below CPU_CLOCK_FROM (by half a call)...
        for _ in 0..1000 {
            call(&mut clock, Duration::ZERO);
            if clock.recent < CPU_CLOCK_FROM {
                break;
            }
        }
        assert!(clock.recent < CPU_CLOCK_FROM);
        // ...so the next call is not read, however long it turns out.
        let before = clock.descheduled;
        call(&mut clock, Duration::from_millis(2));
        assert_eq!(clock.descheduled, before);
        // Now recent calls are long again: the next is read.
        call(&mut clock, Duration::from_millis(2));
        assert!(clock.descheduled >= before + 0.0019);
    }
}
