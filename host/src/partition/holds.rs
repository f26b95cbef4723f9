//! What a schedule keeps in flight on each rank, for any stage footprint: the partitioner's side
//! of the simulator's memory count.
//!
//! The simulator adds a stage's [`Footprint`] as each action starts and ends (the one definition,
//! [`InFlight`]); on a rank that order is the rank's list order, whatever the times. What a stage
//! holds at any moment is linear in its footprint's three numbers (`bytes`, `released_at_input`,
//! `rebuilt`): so walking the schedule once with three unit footprints ([`BASIS`]) gives, at every
//! moment an action starts, three counts from which the held bytes of *any* footprint follow
//! ([`held`]). The partitioner then prices a candidate stage's footprint (its layers, its
//! recomputation mode: [`StageCost::footprint`](crate::cost::StageCost::footprint)) in `O(moments)`
//! without simulating, and counts exactly what the simulator counts: per rank, the largest sum over
//! its stages at one moment.

use crate::schedule::deps::{Footprint, InFlight};
use crate::schedule::Schedule;

use super::Layout;

/// Three unit footprints whose held counts determine any footprint's (see [`held`]): a whole
/// stash, one released whole at `I`, one rebuilt whole at the backward.
pub const BASIS: [Footprint; 3] = [
    Footprint {
        bytes: 1.0,
        released_at_input: 0.0,
        rebuilt: 0.0,
    },
    Footprint {
        bytes: 1.0,
        released_at_input: 1.0,
        rebuilt: 0.0,
    },
    Footprint {
        bytes: 1.0,
        released_at_input: 0.0,
        rebuilt: 1.0,
    },
];

/// The edges of the cone of footprints (`released_at_input, rebuilt <= bytes`): a moment holds no
/// more than another under every footprint when it does under each of these.
const EDGES: [Footprint; 4] = [
    BASIS[0],
    BASIS[1],
    BASIS[2],
    Footprint {
        bytes: 1.0,
        released_at_input: 1.0,
        rebuilt: 1.0,
    },
];

/// Whether a moment with counts `a` (per stage) holds no more than one with `b` whatever the
/// stages' footprints.
fn dominated(a: &[Counts], b: &[Counts]) -> bool {
    a.iter()
        .zip(b)
        .all(|(a, b)| EDGES.iter().all(|f| held(a, f) <= held(b, f)))
}

/// `moments` without those another one dominates (the first of equal ones kept).
fn frontier<T: AsRef<[Counts]> + Clone>(moments: &[T]) -> Vec<T> {
    let mut kept: Vec<T> = Vec::new();
    for m in moments {
        if kept.iter().any(|k| dominated(m.as_ref(), k.as_ref())) {
            continue;
        }
        kept.retain(|k| !dominated(k.as_ref(), m.as_ref()));
        kept.push(m.clone());
    }
    kept
}

/// What one stage holds at one moment, counted under the three [`BASIS`] footprints.
pub type Counts = [u64; 3];

/// Bytes held at a moment with `counts` by a stage whose microbatches each hold `f`.
///
/// `f = (bytes - released - rebuilt) BASIS[0] + released BASIS[1] + rebuilt BASIS[2]`, and
/// what is held is linear in the footprint (for `released, rebuilt <= bytes`, which every stage
/// cost satisfies), so the same combination of the counts is what `f` holds.
pub fn held(counts: &Counts, f: &Footprint) -> f64 {
    let [whole, released, rebuilt] = counts.map(|c| c as f64);
    (f.bytes - f.released_at_input - f.rebuilt) * whole
        + f.released_at_input * released
        + f.rebuilt * rebuilt
}

/// Per rank, the moments an action starts (deduplicated), each with what every stage of the rank
/// holds then; and per stage, the distinct counts it takes at those moments.
///
/// ```
/// use pipefill_host::partition::{Holds, Layout};
/// use pipefill_host::schedule::deps::Footprint;
/// use pipefill_host::schedule::{families, Params};
/// let s = families::generate("1f1b", &Params::new(2, 4))?;
/// let holds = Holds::of_schedule(&s);
/// let stash = Footprint { bytes: 10.0, released_at_input: 0.0, rebuilt: 0.0 };
/// // 1F1B: stage 0 holds two stashes at its peak, stage 1 one.
/// assert_eq!(holds.stage_peak(0, &stash), 20.0);
/// assert_eq!(holds.stage_peak(1, &stash), 10.0);
/// // Recomputing stage 0 (keeping 1 of its 10 bytes): one input, one rebuilt stash.
/// let rebuilt = Footprint { rebuilt: 9.0, ..stash };
/// assert_eq!(holds.stage_peak(0, &rebuilt), 11.0);
/// // The old count, every in-flight microbatch a whole stash whatever the footprint:
/// let whole = Holds::whole(&Layout::one_stage_per_rank(2), &[2, 1]);
/// assert_eq!(whole.stage_peak(0, &rebuilt), 20.0);
/// # Ok::<(), pipefill_host::schedule::ScheduleError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holds {
    /// Per rank, its stages in increasing order.
    rank_stages: Vec<Vec<usize>>,
    /// Per rank, per moment, the counts of each of `rank_stages[r]` (same order).
    moments: Vec<Vec<Vec<Counts>>>,
    /// Per stage, the distinct counts it takes at its rank's moments.
    stage_counts: Vec<Vec<Counts>>,
}

impl Holds {
    /// What `schedule` keeps: every rank's list walked in order, as the simulator does.
    pub fn of_schedule(schedule: &Schedule) -> Holds {
        let stages = schedule.stages();
        let rank_stages = group(stages, schedule.ranks, |s| schedule.rank_of(s));
        let mut count = BASIS.map(|_| InFlight::new(stages));
        let mut moments: Vec<Vec<Vec<Counts>>> = vec![Vec::new(); schedule.ranks];
        for (r, list) in schedule.actions.iter().enumerate().take(schedule.ranks) {
            for item in list {
                let actions = || item.actions().filter(|a| a.stage < stages);
                for a in actions() {
                    for (c, f) in count.iter_mut().zip(&BASIS) {
                        c.start(a.stage, a, f);
                    }
                    let now = rank_stages[r]
                        .iter()
                        .map(|&s| count.each_ref().map(|c| c.now()[s].round() as u64))
                        .collect::<Vec<_>>();
                    if !moments[r].contains(&now) {
                        moments[r].push(now);
                    }
                }
                for a in actions() {
                    for (c, f) in count.iter_mut().zip(&BASIS) {
                        c.end(a.stage, a, f);
                    }
                }
            }
        }
        Holds::new(rank_stages, moments, stages)
    }

    /// The count without a schedule: stage `s` holds `in_flight[s]` whole stashes at once, all the
    /// stages of a rank at the same moment (an upper bound on any schedule with those peaks).
    pub fn whole(layout: &Layout, in_flight: &[u64]) -> Holds {
        let rank_stages = group(in_flight.len(), layout.ranks, |s| layout.rank_of(s));
        let moments = rank_stages
            .iter()
            .map(|own| vec![own.iter().map(|&s| [in_flight[s]; 3]).collect()])
            .collect();
        Holds::new(rank_stages, moments, in_flight.len())
    }

    /// Keeps only the moments that may be a peak: no other one holds as much or more under every
    /// footprint.
    fn new(rank_stages: Vec<Vec<usize>>, moments: Vec<Vec<Vec<Counts>>>, stages: usize) -> Holds {
        let moments: Vec<Vec<Vec<Counts>>> = moments.iter().map(|m| frontier(m)).collect();
        let mut stage_counts: Vec<Vec<[Counts; 1]>> = vec![Vec::new(); stages];
        for (own, list) in rank_stages.iter().zip(&moments) {
            for moment in list {
                for (&s, c) in own.iter().zip(moment) {
                    stage_counts[s].push([*c]);
                }
            }
        }
        let stage_counts = (stage_counts.iter())
            .map(|c| frontier(c).into_iter().map(|[c]| c).collect())
            .collect();
        Holds {
            rank_stages,
            moments,
            stage_counts,
        }
    }

    /// `S`: the number of stages counted.
    pub fn stages(&self) -> usize {
        self.stage_counts.len()
    }

    /// The most stage `stage` holds at once with footprint `f`.
    pub fn stage_peak(&self, stage: usize, f: &Footprint) -> f64 {
        self.stage_counts
            .get(stage)
            .into_iter()
            .flatten()
            .map(|c| held(c, f))
            .fold(0.0, f64::max)
    }

    /// The stages of rank `rank`, in increasing order.
    pub fn rank_stages(&self, rank: usize) -> &[usize] {
        self.rank_stages.get(rank).map_or(&[], Vec::as_slice)
    }

    /// The moments of rank `rank`: per moment, the counts of each of [`Holds::rank_stages`].
    pub fn moments(&self, rank: usize) -> &[Vec<Counts>] {
        self.moments.get(rank).map_or(&[], Vec::as_slice)
    }

    /// The most rank `rank` holds at once when its stages (in [`Holds::rank_stages`] order) have
    /// footprints `f`.
    pub fn rank_peak(&self, rank: usize, f: &[Footprint]) -> f64 {
        self.moments(rank)
            .iter()
            .map(|m| m.iter().zip(f).map(|(c, f)| held(c, f)).sum::<f64>())
            .fold(0.0, f64::max)
    }
}

/// Stages `0..stages` grouped by rank.
fn group(stages: usize, ranks: usize, rank_of: impl Fn(usize) -> usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); ranks];
    for s in 0..stages {
        if let Some(own) = out.get_mut(rank_of(s)) {
            own.push(s);
        }
    }
    out
}
