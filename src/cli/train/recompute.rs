//! `train --recompute`: the recomputation mode every stage runs with, or the planner's choice per
//! stage under `--memory-limit`, priced into the candidate plans (so the prediction `train` prints
//! is the run's) and passed to the runtime through the plan's costs
//! ([`CostModel::recompute`](pipefill_host::cost::CostModel::recompute)).

use pipefill_host::cost::{Recompute, RecomputeChoice};
use pipefill_host::plan::Plan;

use crate::cli::CliError;

/// The value of `train --recompute`: a mode for every stage. A flag value of its own (not
/// [`Recompute`]) so that a value that is no single mode (the planner's choice) is one more row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecomputeFlag {
    /// Every stage keeps its whole stash from `F` to its backward.
    #[default]
    None,
    /// Every stage keeps only its input and runs its forward again before `I` or `B`.
    Full,
    /// Every stage that can drops what it rebuilds cheaply (its layers' inputs after the first)
    /// and rebuilds it before `I` or `B`.
    Selective,
    /// The planner chooses per stage, with the schedule and the partition, under `--memory-limit`
    /// ([`RecomputeChoice::Auto`]).
    Auto,
}

pipefill_host::named_enum!(RecomputeFlag as "recomputation mode" {
    None => "none",
    Full => "full",
    Selective => "selective",
    Auto => "auto",
});

impl RecomputeFlag {
    /// The flag's value, or its default: `auto` under a memory limit, else `none`.
    pub fn or_default(flag: Option<Self>, memory_limit: Option<f64>) -> Self {
        flag.unwrap_or(match memory_limit {
            Some(_) => RecomputeFlag::Auto,
            None => RecomputeFlag::None,
        })
    }

    /// The mode every stage runs with (`None` for `auto`: each plan carries the planner's choice).
    pub fn mode(self) -> Option<Recompute> {
        match self {
            RecomputeFlag::None => Some(Recompute::None),
            RecomputeFlag::Full => Some(Recompute::Full),
            RecomputeFlag::Selective => Some(Recompute::Selective),
            RecomputeFlag::Auto => None,
        }
    }

    /// What the planner may choose.
    pub fn choice(self) -> RecomputeChoice {
        match self {
            RecomputeFlag::None => RecomputeChoice::None,
            RecomputeFlag::Full => RecomputeChoice::Full,
            RecomputeFlag::Selective => RecomputeChoice::Selective,
            RecomputeFlag::Auto => RecomputeChoice::Auto,
        }
    }
}

/// `--recompute`: a mode name.
pub fn parse(s: &str) -> Result<RecomputeFlag, String> {
    s.parse()
}

/// `plans` with every stage run in `mode`, each re-scored by the simulator under its costs so
/// changed (step time, bubble, activation peak; the data-parallel tail kept), best first.
pub fn recomputed(plans: Vec<Plan>, mode: Recompute) -> Result<Vec<Plan>, CliError> {
    let mut out = Vec::with_capacity(plans.len());
    for mut p in plans {
        if mode == Recompute::Selective && !p.cost.stages.iter().any(|s| s.selective()) {
            return Err(CliError::Usage(
                "--recompute selective: no stage of this model can recompute selectively (a stage needs two layers or more, the one before with an activation other than identity, and f32 activations); give --recompute full or none".into(),
            ));
        }
        if p.cost.stages.iter().all(|s| s.recompute == mode) {
            out.push(p);
            continue;
        }
        for st in &mut p.cost.stages {
            *st = st.with_recompute(mode);
        }
        let sim = pipefill_host::sim::simulate(&p.schedule, &p.cost)
            .map_err(|e| CliError::Failed(format!("--recompute {mode}: {e}")))?;
        let makespan = sim.timeline.makespan();
        p.step_time = makespan + p.reduce_tail;
        p.bubble_fraction = sim.timeline.bubble_fraction();
        p.lower_bound = sim.lower_bound;
        p.ratio_to_bound = sim.ratio_to_bound();
        let mut peak = sim.peak_activations;
        peak.resize(p.schedule.ranks, 0.0);
        for (s, st) in p.cost.stages.iter().enumerate() {
            peak[p.schedule.rank_of(s)] += st.parameter_bytes;
        }
        p.peak_memory = peak;
        out.push(p);
    }
    out.sort_by(|a, b| a.step_time.total_cmp(&b.step_time));
    Ok(out)
}
