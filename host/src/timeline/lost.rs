//! Time lost to time-sharing in a measured [`Timeline`]: each rank's makespan split into compute,
//! descheduled (ready but not running) and waiting for data, and the same timeline replayed
//! without time-sharing (every item lasting only its CPU time), which tells the schedule's own
//! bubble from the time other work on the machine took.

use std::collections::HashMap;

use super::{Span, Timeline};
use crate::schedule::walk::{walk, Waker, Walk};
use crate::schedule::Action;

impl Timeline {
    /// Time rank `r` was ready but not running, lost to time-sharing: descheduled inside its
    /// items and woken late before them ([`Span::descheduled`], [`Span::woken_late`]). 0 where
    /// not measured.
    pub fn descheduled(&self, r: usize) -> f64 {
        self.spans[r]
            .iter()
            .map(|s| s.descheduled() + s.woken_late())
            .sum()
    }

    /// Time rank `r` computed on a core: its busy time less the time it was descheduled in it
    /// (the thread's CPU time in its layer calls, where measured).
    pub fn compute(&self, r: usize) -> f64 {
        let inside: f64 = self.spans[r].iter().map(Span::descheduled).sum();
        (self.busy(r) - inside).max(0.0)
    }

    /// Time rank `r` waited for data within the makespan, runnable-ready or not: its idle time less
    /// the time it was woken late. `compute + descheduled + waiting = makespan` for each rank.
    pub fn waiting(&self, r: usize) -> f64 {
        let late: f64 = self.spans[r].iter().map(Span::woken_late).sum();
        (self.idle(r) - late).max(0.0)
    }

    /// The same items in the same order on each rank, each lasting only its CPU time (its
    /// duration less [`Span::descheduled`]) and started, from 0, as soon as the rank's previous
    /// item and the producers of its inputs from other ranks (the timeline's transfers, taken as
    /// free) have ended. What the step would take if no rank ever waited for a core or a wake-up:
    /// its bubble is the schedule's own on this run's CPU times, and the measured makespan less
    /// its makespan is what time-sharing (and the runtime's own overhead between items) cost.
    /// `None` where the transfers name an action no span holds or the order does not replay (not
    /// a timeline the runtime measured).
    pub fn without_time_sharing(&self) -> Option<Timeline> {
        let mut replay = Replay {
            timeline: self,
            needs: HashMap::new(),
            to: HashMap::new(),
            ended: HashMap::new(),
            clock: vec![0.0; self.ranks()],
            out: Timeline::new(self.name.clone(), self.source, self.ranks()),
        };
        for t in &self.transfers {
            replay
                .needs
                .entry(t.consumer())
                .or_default()
                .push(t.producer());
            replay.to.entry(t.producer()).or_default().push(t.to_rank());
        }
        // The one walk (`schedule::walk`): a rank whose input is not produced yet waits for it.
        let stuck = walk(&mut replay, &mut vec![0; self.ranks()]);
        stuck.is_empty().then_some(replay.out)
    }
}

/// [`Timeline::without_time_sharing`] as a [`Walk`]: each item for its CPU time, after its rank's
/// previous item and its inputs' producers.
struct Replay<'t> {
    timeline: &'t Timeline,
    /// Per consuming action, the producers of its inputs from other ranks.
    needs: HashMap<Action, Vec<Action>>,
    /// Per producing action, the ranks its outputs go to.
    to: HashMap<Action, Vec<usize>>,
    ended: HashMap<Action, f64>,
    clock: Vec<f64>,
    out: Timeline,
}

impl Walk for Replay<'_> {
    /// The producer whose end an item waits for.
    type Wanted = Action;

    fn advance(&mut self, r: usize, pos: &mut usize, waker: &mut Waker<Action>) -> Option<Action> {
        while let Some(span) = self.timeline.spans[r].get(*pos) {
            let item = span.item();
            let mut start = self.clock[r];
            for x in item
                .actions()
                .flat_map(|a| self.needs.get(&a).into_iter().flatten())
            {
                match self.ended.get(x) {
                    Some(&e) => start = start.max(e),
                    None => return Some(*x),
                }
            }
            let end = start + (span.end - span.start - span.descheduled()).max(0.0);
            for a in item.actions() {
                self.ended.insert(a, end);
                for &to in self.to.get(&a).into_iter().flatten() {
                    waker.wake(to, a);
                }
            }
            self.out.spans[r].push(Span::new(item, start, end));
            self.clock[r] = end;
            *pos += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Item, Op};
    use crate::timeline::{Source, Transfer};

    #[test]
    fn time_lost_to_time_sharing_reads_back_and_splits_each_rank() {
        let mut t = Timeline::new("m", Source::Measured, 2);
        let f0: Item = Action::new(Op::F, 0, 0).into();
        t.spans[0].push(Span::new(f0, 0.0, 1.0).with_lost(0.25, 0.0));
        let f1: Item = Action::new(Op::F, 1, 0).into();
        t.spans[1].push(Span::new(f1, 1.5, 2.0).with_lost(0.125, 0.5));
        let json = serde_json::to_string(&t).unwrap();
        assert!(
            json.contains(r#""descheduled":0.125,"woken_late":0.5"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Timeline>(&json).unwrap(), t);
        // Rank 0: 0.75 s on the CPU, 0.25 s descheduled in its forward, 1 s waiting after it.
        assert_eq!(
            (t.compute(0), t.descheduled(0), t.waiting(0)),
            (0.75, 0.25, 1.0)
        );
        // Rank 1: of its 1.5 s idle, 0.5 s was after its data came: 1 s waiting.
        assert_eq!(
            (t.compute(1), t.descheduled(1), t.waiting(1)),
            (0.375, 0.625, 1.0)
        );
    }

    #[test]
    fn without_time_sharing_each_item_takes_its_cpu_time_after_its_inputs() {
        let (f0, f1) = (Action::new(Op::F, 0, 0), Action::new(Op::F, 1, 0));
        let (b1, b0) = (Action::new(Op::B, 1, 0), Action::new(Op::B, 0, 0));
        let mut t = Timeline::new("m", Source::Measured, 2);
        // Rank 0's forward lost 1 of its 2 s; rank 1 was woken 0.5 s late after it.
        t.spans[0].push(Span::new(f0.into(), 0.5, 2.5).with_lost(1.0, 0.0));
        t.spans[1].push(Span::new(f1.into(), 3.0, 4.0).with_lost(0.0, 0.5));
        t.spans[1].push(Span::new(b1.into(), 4.0, 6.0).with_lost(0.5, 0.0));
        t.spans[0].push(Span::new(b0.into(), 6.5, 7.5));
        t.push_transfer(Transfer::new(0, 1, f0, f1, 2.5, 3.0, 8.0));
        t.push_transfer(Transfer::new(1, 0, b1, b0, 6.0, 6.5, 8.0));
        let free = t.without_time_sharing().unwrap();
        let times = |r: usize| -> Vec<(f64, f64)> {
            free.spans[r].iter().map(|s| (s.start, s.end)).collect()
        };
        assert_eq!(times(0), vec![(0.0, 1.0), (3.5, 4.5)]);
        assert_eq!(times(1), vec![(1.0, 2.0), (2.0, 3.5)]);
        assert_eq!(free.makespan(), 4.5);
        // A transfer from an action no span holds: not a measured timeline.
        t.push_transfer(Transfer::new(
            0,
            1,
            Action::new(Op::F, 0, 9),
            f1,
            0.0,
            0.0,
            8.0,
        ));
        assert!(t.without_time_sharing().is_none());
    }
}
