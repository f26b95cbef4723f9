//! Choosing recomputation per stage under a memory limit (module [`crate::cost::recompute`] has the
//! memory and time model).
//!
//! The planner tries, for every schedule and partition, the mode sets [`RecomputeChoice`] allows:
//! none everywhere, full everywhere, selective wherever a stage declares it, and with `auto` also
//! [`fit_recompute`]'s greedy set (stage by stage, on the ranks still over the limit, the step
//! that frees the most bytes per second of rebuild it adds, until the plan fits: a selective
//! stage frees fewer bytes than a full one but costs far less time). Each set is simulated like
//! any other candidate; the fastest plan that fits wins, so recomputation is chosen only where no
//! plan fits without it or where it lets a deeper schedule (more microbatches in flight) run
//! faster.

use crate::cost::{CostModel, Recompute, RecomputeChoice};
use crate::schedule::Schedule;
use crate::sim::{simulate, SimError, Simulation};

/// `model` with stage `s` run in `modes[s]` (stages past `modes` keep theirs).
pub fn with_modes(mut model: CostModel, modes: &[Recompute]) -> CostModel {
    for (st, &mode) in model.stages.iter_mut().zip(modes) {
        *st = st.with_recompute(mode);
    }
    model
}

/// Per rank, the parameters of its stages plus the simulator's activation peak, bytes.
pub fn peak_memory(schedule: &Schedule, model: &CostModel, sim: &Simulation) -> Vec<f64> {
    let mut mem = sim.peak_activations.clone();
    mem.resize(schedule.ranks, 0.0);
    for (s, st) in model.stages.iter().enumerate() {
        mem[schedule.rank_of(s)] += st.parameter_bytes;
    }
    mem
}

/// The mode sets `choice` tries for `model`'s stages, before the greedy one: none, full,
/// selective (where a stage declares it), or (`auto`) all three, none first; selective only where
/// some stage declares it.
pub(crate) fn uniform_sets(choice: RecomputeChoice, model: &CostModel) -> Vec<Vec<Recompute>> {
    let set = |m| vec![m; model.stages.len()];
    let selective = || {
        let modes = model.stages.iter().map(|st| {
            if st.selective() {
                Recompute::Selective
            } else {
                Recompute::None
            }
        });
        modes.collect()
    };
    let any_selective = model.stages.iter().any(|st| st.selective());
    match choice {
        RecomputeChoice::Full => vec![set(Recompute::Full)],
        RecomputeChoice::Selective => vec![selective()],
        RecomputeChoice::Auto if any_selective => {
            vec![set(Recompute::None), set(Recompute::Full), selective()]
        }
        RecomputeChoice::Auto => vec![set(Recompute::None), set(Recompute::Full)],
        _ => vec![set(Recompute::None)],
    }
}

/// [`uniform_sets`] before the layers are split into stages: `stages` stages, `selective` when some
/// layer declares a selective part (a stage that gets none of them runs without recomputation:
/// [`StageCost::with_recompute`](crate::cost::StageCost::with_recompute)).
pub(crate) fn uniform_sets_before_split(
    choice: RecomputeChoice,
    stages: usize,
    selective: bool,
) -> Vec<Vec<Recompute>> {
    let set = |m| vec![m; stages];
    match choice {
        RecomputeChoice::Full => vec![set(Recompute::Full)],
        RecomputeChoice::Selective => vec![set(Recompute::Selective)],
        RecomputeChoice::Auto if selective => vec![
            set(Recompute::None),
            set(Recompute::Full),
            set(Recompute::Selective),
        ],
        RecomputeChoice::Auto => vec![set(Recompute::None), set(Recompute::Full)],
        _ => vec![set(Recompute::None)],
    }
}

/// The greedy per-stage choice for `schedule` under `model` and `limit` bytes per rank
/// (parameters included): starting from no recomputation, while some rank's predicted peak is
/// over the limit, the step on one of that rank's stages (none to selective where the stage
/// declares it, none or selective to full) that frees the most stash bytes per second of rebuild
/// it adds. `Ok(None)` when even that cannot bring every rank under the limit. No stage
/// recomputes when the schedule fits without.
///
/// ```
/// use pipefill_host::cost::{CostModel, LinkCost, Recompute, StageCost};
/// use pipefill_host::plan::fit_recompute;
/// use pipefill_host::schedule::{families, Params};
/// let mut st = StageCost::uniform(1.0, 1.0, 1.0);
/// (st.activation_bytes, st.input_bytes) = (10.0, 1.0);
/// let model = CostModel::uniform(st, 4, LinkCost::default());
/// let s = families::generate("1f1b", &Params::new(4, 8)).unwrap();
/// // Rank 0 holds four stashes (40 bytes) in 1F1B; 30 bytes need recomputation there only.
/// let modes = fit_recompute(&s, &model, 30.0).unwrap().unwrap();
/// assert_eq!(modes[0], Recompute::Full);
/// assert_eq!(modes[3], Recompute::None);
/// assert_eq!(fit_recompute(&s, &model, 100.0).unwrap(), Some(vec![Recompute::None; 4]));
/// assert_eq!(fit_recompute(&s, &model, 5.0).unwrap(), None);
/// // Half the stash rebuilt in a tenth of the forward: selective suffices at 30 bytes.
/// let model = CostModel::uniform(StageCost { selective_bytes: 5.0, selective_time: 0.1, ..st }, 4, LinkCost::default());
/// let modes = fit_recompute(&s, &model, 30.0).unwrap().unwrap();
/// assert_eq!(modes[0], Recompute::Selective);
/// ```
pub fn fit_recompute(
    schedule: &Schedule,
    model: &CostModel,
    limit: f64,
) -> Result<Option<Vec<Recompute>>, SimError> {
    let mut modes = vec![Recompute::None; model.stages.len()];
    loop {
        let costs = with_modes(model.clone(), &modes);
        let sim = simulate(schedule, &costs)?;
        let peak = peak_memory(schedule, &costs, &sim);
        let over = |r: usize| peak[r] > limit;
        if !(0..peak.len()).any(over) {
            return Ok(Some(modes));
        }
        // Per stage, its best next step: (stage, mode, bytes freed per second added).
        let step = |s: usize| {
            let now = &costs.stages[s];
            [Recompute::Selective, Recompute::Full]
                .into_iter()
                .filter(|&m| m != now.recompute && now.recompute != Recompute::Full)
                .filter_map(|m| {
                    let next = now.with_recompute(m);
                    let saved = next.rebuilt_bytes() - now.rebuilt_bytes();
                    let added = next.rebuild_time() - now.rebuild_time();
                    (next.recompute == m && saved > 0.0)
                        .then(|| (s, m, saved / added.max(f64::MIN_POSITIVE)))
                })
                .max_by(|a, b| a.2.total_cmp(&b.2))
        };
        let next = (0..modes.len())
            .filter(|&s| over(schedule.rank_of(s)))
            .filter_map(step)
            .max_by(|a, b| a.2.total_cmp(&b.2).then(b.0.cmp(&a.0)));
        match next {
            Some((s, m, _)) => modes[s] = m,
            None => return Ok(None),
        }
    }
}

/// How a plan's stages recompute, compactly: `-` for none, `full` or `selective` for all in that
/// mode, else `k of S` (stages that recompute, in either mode).
pub fn summary(modes: &[Recompute]) -> String {
    let k = modes.iter().filter(|&&m| m != Recompute::None).count();
    match k {
        0 => "-".into(),
        k if k == modes.len() && modes.iter().all(|&m| m == modes[0]) => modes[0].to_string(),
        k => format!("{k} of {}", modes.len()),
    }
}
