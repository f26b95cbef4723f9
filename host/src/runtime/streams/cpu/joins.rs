//! The fork/join rule of stream capture, as CUDA enforces it, checked on [`CpuStreams`](super::CpuStreams).
//!
//! CUDA captures what is enqueued on the origin stream (where `cuStreamBeginCapture` was called)
//! and on every stream that *joins* the capture by waiting on an event recorded on a capturing
//! stream; work enqueued on a stream that has not joined is not captured at all (it runs once, now,
//! and never in a replay). At `cuStreamEndCapture` every stream that joined must have been joined
//! back: its last captured work must be an ancestor of the origin's, through event waits, else the
//! capture fails with `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`. The [`Joins`] model keeps, as CUDA does,
//! each stream's *tail* (the captured nodes its next work depends on) and each node's parents, and
//! refuses both cases by name ([`unforked`], [`unjoined`]), so a program whose fork or join is
//! wrong fails on the CPU twin as it would on a GPU.

use std::collections::{HashMap, HashSet};

use crate::runtime::streams::DeviceError;

/// The capture's dependency graph: each stream's tail (`None`: not in the capture), each node's
/// parents, and the tail each event recorded in the capture stands for (by the flag's address).
#[derive(Debug, Default)]
pub(super) struct Joins {
    tails: Vec<Option<Vec<usize>>>,
    parents: Vec<Vec<usize>>,
    events: HashMap<usize, Vec<usize>>,
}

/// The error of work enqueued on a stream that never joined the capture.
pub(super) fn unforked(stream: usize) -> DeviceError {
    DeviceError::new(format!(
        "stream {stream} was given work during a capture without joining it (no wait on an event \
         recorded on a capturing stream): on CUDA that work would run once, outside the graph, \
         and never on replay; fork it from the origin stream first"
    ))
}

/// The error of a capture that ends with a stream not joined back (CUDA's
/// `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`).
pub(super) fn unjoined(what: &str) -> String {
    format!(
        "stream capture unjoined (CUDA_ERROR_STREAM_CAPTURE_UNJOINED): {what} joined the capture \
         but its last work was not joined back into the origin stream (an event recorded on it \
         and waited on by the origin) before the capture ended"
    )
}

impl Joins {
    /// A capture of `streams` streams begun on stream 0.
    pub(super) fn begin(streams: usize) -> Self {
        let mut tails = vec![None; streams];
        if let Some(origin) = tails.first_mut() {
            *origin = Some(Vec::new());
        }
        Joins {
            tails,
            parents: Vec::new(),
            events: HashMap::new(),
        }
    }

    /// One node of work on `stream` (after its tail); refused on a stream not in the capture.
    pub(super) fn work(&mut self, stream: usize) -> Result<(), DeviceError> {
        let node = self.parents.len();
        let tail = self
            .tails
            .get_mut(stream)
            .and_then(Option::as_mut)
            .ok_or_else(|| unforked(stream))?;
        self.parents.push(std::mem::replace(tail, vec![node]));
        Ok(())
    }

    /// An event recorded on `stream` (after [`work`](Joins::work) put the record's node there).
    pub(super) fn record(&mut self, stream: usize, event: usize) {
        if let Some(Some(tail)) = self.tails.get(stream) {
            self.events.insert(event, tail.clone());
        }
    }

    /// `stream` waits on `event`: it joins the capture (or gains a dependency) when the event was
    /// recorded in it; an event of another owner (a link's) adds nothing here.
    pub(super) fn wait(&mut self, stream: usize, event: usize) {
        let (Some(after), Some(tail)) = (self.events.get(&event), self.tails.get_mut(stream))
        else {
            return;
        };
        let tail = tail.get_or_insert_with(Vec::new);
        tail.extend(
            after
                .iter()
                .filter(|n| !tail.contains(n))
                .copied()
                .collect::<Vec<_>>(),
        );
    }

    /// Every stream that joined is joined back: its tail is among the origin's ancestors.
    pub(super) fn end(&self) -> Result<(), DeviceError> {
        let mut seen: HashSet<usize> = HashSet::new();
        let mut todo: Vec<usize> = self.tails.first().cloned().flatten().unwrap_or_default();
        while let Some(n) = todo.pop() {
            if seen.insert(n) {
                todo.extend(self.parents.get(n).into_iter().flatten());
            }
        }
        for (s, tail) in self.tails.iter().enumerate().skip(1) {
            if let Some(tail) = tail {
                if tail.iter().any(|n| !seen.contains(n)) {
                    return Err(DeviceError::new(unjoined(&format!("stream {s}"))));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_and_a_join_pass_and_a_missing_one_is_named() {
        // Stream 1 forked from 0, works, joined back: fine.
        let mut j = Joins::begin(2);
        j.work(0).unwrap();
        j.record(0, 100);
        j.wait(1, 100);
        j.work(1).unwrap();
        j.work(1).unwrap();
        j.record(1, 101);
        j.wait(0, 101);
        j.work(0).unwrap();
        j.end().unwrap();
        // Work after the join, never joined again: unjoined.
        j.work(1).unwrap();
        let e = j.end().unwrap_err().message;
        assert!(e.contains("UNJOINED") && e.contains("stream 1"), "{e}");
        // A stream never forked cannot take work.
        let mut j = Joins::begin(3);
        let e = j.work(2).unwrap_err().message;
        assert!(e.contains("stream 2") && e.contains("fork"), "{e}");
        // Joined through another stream (2 -> 1 -> 0) counts.
        j.work(0).unwrap();
        j.record(0, 1);
        j.wait(2, 1);
        j.wait(1, 1);
        j.work(2).unwrap();
        j.record(2, 2);
        j.wait(1, 2);
        j.work(1).unwrap();
        j.record(1, 3);
        j.wait(0, 3);
        j.end().unwrap();
    }
}
