//! [`Outcome`]: what the steps' reports add up to (the loop's "report" phase).

use pipefill_host::plan::Plan;
use pipefill_host::runtime::StepReport;
use pipefill_host::sim::simulate;
use pipefill_host::timeline::{Source, Timeline};

use super::{HostEnqueue, TrainError};

/// What the training phase produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Steps trained before this run (from a checkpoint; 0 otherwise): `losses[i]` is step
    /// `first_step + i` (from 0).
    pub first_step: usize,
    /// One loss per step run here.
    pub losses: Vec<f32>,
    /// Wall seconds per step.
    pub step_seconds: Vec<f64>,
    /// The measured timeline of the median step (rebuilt by the simulator with `replay`).
    pub measured: Timeline,
    /// The simulator's timeline from the median step's own action durations (mean per stage and
    /// op): what the schedule would take if the runtime added nothing to the layers' time. Set
    /// apart from the profile-based prediction, it tells profile error from runtime overhead.
    pub resimulated: Timeline,
    /// Sequential step time estimate: the sum of the median step's layer seconds.
    pub work_seconds: f64,
    /// Per rank, the most activation bytes its stashes (and kept inputs, with recomputation)
    /// held at once over the run's steps, as the runtime measured them (replica 0's; 0 where the
    /// runner does not count them: pending payloads on streams).
    pub peak_held_bytes: Vec<usize>,
    /// Per rank, the seconds the median step spent rebuilding stashes before `I` or `B`
    /// (recomputation; [`StepReport::rebuild_seconds`]): 0 without recomputation, and where the
    /// runner does not time the rebuild apart (streams).
    pub rebuild_seconds: Vec<f64>,
    /// Per stage, the share of the median step's `I`/`B` time on it that rebuilt stashes, over
    /// the actions that rebuilt one (0 where none did): what the SVG hatches.
    pub rebuild_share: Vec<f64>,
    /// The stream runner's host enqueue time per action, plain and with a captured graph.
    pub host_enqueue: Option<HostEnqueue>,
}

impl Outcome {
    /// Losses, step times, the median step's measured timeline and its resimulation from its own
    /// action durations (`replay`: the resimulation is the measured timeline too).
    pub fn of(
        plan: &Plan,
        first_step: usize,
        reports: &[StepReport],
        replay: bool,
    ) -> Result<Self, TrainError> {
        let losses = reports.iter().map(|r| r.loss).collect();
        let step_seconds: Vec<f64> = reports.iter().map(|r| r.seconds).collect();
        let r = reports
            .get(median_index(&step_seconds))
            .ok_or(TrainError::NoStep)?;
        let work_seconds = r.action_seconds.iter().map(|(_, t)| t).sum();
        let mut peak_held_bytes = vec![0; plan.schedule.ranks];
        for (r, &b) in reports
            .iter()
            .flat_map(|x| x.peak_held_bytes.iter().enumerate())
        {
            if let Some(p) = peak_held_bytes.get_mut(r) {
                *p = (*p).max(b);
            }
        }
        // The run's own action durations, simulated: what the schedule takes if the runtime adds
        // nothing to the layers' time.
        let resimulated = simulate(&plan.schedule, &plan.cost.with_durations(&r.action_seconds))
            .map_err(|e| TrainError::Runner(e.to_string()))?
            .timeline;
        let measured = if replay {
            let mut t = resimulated.clone();
            t.source = Source::Measured;
            t
        } else {
            r.timeline.clone()
        };
        let (rebuild_seconds, rebuild_share) = rebuilds(plan, r);
        Ok(Outcome {
            rebuild_seconds,
            rebuild_share,
            first_step,
            losses,
            step_seconds,
            measured,
            resimulated,
            work_seconds,
            peak_held_bytes,
            host_enqueue: None,
        })
    }
}

/// Per rank, `r`'s rebuild seconds; per stage, the share of the rebuilding actions' seconds that
/// rebuilt.
fn rebuilds(plan: &Plan, r: &StepReport) -> (Vec<f64>, Vec<f64>) {
    let stages = plan.schedule.stages();
    let (mut rebuilt, mut total) = (vec![0.0; stages], vec![0.0; stages]);
    for (a, t) in &r.rebuild_seconds {
        if let Some(x) = rebuilt.get_mut(a.stage) {
            *x += t;
        }
    }
    for (a, t) in &r.action_seconds {
        if r.rebuild_seconds.iter().any(|(b, _)| b == a) {
            if let Some(x) = total.get_mut(a.stage) {
                *x += t;
            }
        }
    }
    let share = rebuilt
        .iter()
        .zip(&total)
        .map(|(&b, &t)| if t > 0.0 { (b / t).min(1.0) } else { 0.0 })
        .collect();
    (r.rebuild_seconds_by_rank(&plan.schedule), share)
}

/// Index of the median of `v`.
pub fn median_index(v: &[f64]) -> usize {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    idx.get(v.len() / 2).copied().unwrap_or(0)
}
