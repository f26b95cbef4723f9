//! Where a plan's schedules come from: a handcrafted family, generated from `P`, `V` and `M`, or
//! `auto`, solved for the costs at that shape ([`crate::auto`]). Every planner ([`super::plan`],
//! [`super::plan_workers`], [`super::plan_given`]) takes both alike: one schedule per shape, then the
//! same partitions, simulation, memory check and ranking; so `auto` is planned at the request's
//! `P`, `D` and microbatch size, as the families are.

use crate::auto::{solve, AutoOptions, AUTO};
use crate::cost::{split_even, CostFile, Recompute};
use crate::schedule::families::{Family, FAMILIES};
use crate::schedule::{Params, Schedule, ScheduleError};

use super::PlanError;

/// One source of schedules.
#[derive(Debug, Clone, Copy)]
pub(super) enum Source {
    /// A handcrafted family.
    Family(&'static Family),
    /// The automatic scheduler.
    Auto,
}

impl Source {
    /// The schedules' name.
    pub(super) fn name(self) -> &'static str {
        match self {
            Source::Family(f) => f.name,
            Source::Auto => AUTO,
        }
    }

    /// `V` when none is asked: the family's own, or `auto`'s ([`AutoOptions::chunks`]).
    pub(super) fn default_chunks(self, auto: &AutoOptions) -> usize {
        match self {
            Source::Family(f) => f.default_chunks,
            Source::Auto => auto.chunks(),
        }
    }

    /// The `V` values to try: for a family, `asked` and its own (each refuses what it cannot do);
    /// for `auto`, its one `V`.
    pub(super) fn chunk_counts(self, asked: &[usize], auto: &AutoOptions) -> Vec<usize> {
        let mut vs = match self {
            Source::Family(_) => asked.to_vec(),
            Source::Auto => Vec::new(),
        };
        vs.push(self.default_chunks(auto));
        vs.sort_unstable();
        vs.dedup();
        vs
    }

    /// The schedule for `params` (`P`, `M`, and `V` or the source's own). A family generates it;
    /// `auto` solves it for `costs` (at the schedule's microbatch size) cut evenly into `P x V`
    /// stages, under `memory_limit` bytes per rank (else `auto`'s own limit in microbatches).
    pub(super) fn schedule(
        self,
        params: &Params,
        costs: &CostFile,
        memory_limit: Option<f64>,
        auto: &AutoOptions,
    ) -> Result<Schedule, PlanError> {
        self.schedule_with(params, costs, memory_limit, auto, Recompute::None)
    }

    /// [`Source::schedule`] with `auto` solved for every stage run in recomputation `mode` (its
    /// memory model then keeps only the stages' inputs from `F` to `I`); a family ignores it.
    pub(super) fn schedule_with(
        self,
        params: &Params,
        costs: &CostFile,
        memory_limit: Option<f64>,
        auto: &AutoOptions,
        mode: Recompute,
    ) -> Result<Schedule, PlanError> {
        let chunks = params.chunks.unwrap_or(self.default_chunks(auto));
        match self {
            Source::Family(f) => {
                (f.generate)(&params.with_chunks(chunks)).map_err(|source| PlanError::Schedule {
                    name: f.name.to_string(),
                    source,
                })
            }
            Source::Auto => {
                let counts = split_even(costs.layers.len(), params.ranks * chunks)?;
                let model = super::with_modes(costs.model(&counts)?, &vec![mode; counts.len()]);
                let limit = auto.limit(memory_limit);
                let req = auto.request(params.ranks, params.microbatches, chunks, model, limit);
                Ok(solve(&req)?.schedule)
            }
        }
    }
}

/// The sources named (all handcrafted families when none is; `auto` only when named), or the
/// first unknown name.
pub(super) fn sources(names: &[String]) -> Result<Vec<Source>, PlanError> {
    if names.is_empty() {
        return Ok(FAMILIES.iter().map(Source::Family).collect());
    }
    names
        .iter()
        .map(|n| match FAMILIES.iter().find(|f| f.name == n) {
            Some(f) => Ok(Source::Family(f)),
            None if n == AUTO => Ok(Source::Auto),
            None => Err(unknown(n)),
        })
        .collect()
}

/// The error for a name that is neither a family nor `auto`.
fn unknown(name: &str) -> PlanError {
    PlanError::UnknownFamily {
        name: name.to_string(),
        known: FAMILIES
            .iter()
            .map(|f| f.name)
            .chain(std::iter::once(AUTO))
            .collect(),
    }
}

/// The one entry point that makes a schedule of any name: a family
/// ([`families::generate`](crate::schedule::families::generate), from `params`), or `auto`, solved
/// as `auto` says for `costs` cut evenly into `P x V` stages (its `V` when `params` gives none; its
/// limit in microbatches, [`AutoOptions::max_in_flight`]). `auto` without costs is
/// [`ScheduleError::AutoNeedsCosts`]; an unknown name lists every name, `auto` included.
///
/// ```
/// use pipefill_host::auto::AutoOptions;
/// use pipefill_host::cost::{CostFile, LayerCost, LinkCost};
/// use pipefill_host::plan::{generate, PlanError};
/// use pipefill_host::schedule::Params;
/// let layers = (0..4).map(|i| LayerCost::new(format!("l{i}"), 1.0, 1.0, 1.0)).collect();
/// let costs = CostFile { layers, transfer: LinkCost::default(), overlap_share: 0.0,
///                        meta: serde_json::Value::Null };
/// let params = Params::new(2, 4);
/// let opts = AutoOptions::default();
/// assert_eq!(generate("zbv", &params, None, &opts).unwrap().name, "zbv");
/// assert_eq!(generate("auto", &params, Some(&costs), &opts).unwrap().ranks, 2);
/// let e = generate("auto", &params, None, &opts).unwrap_err();
/// assert!(e.to_string().contains("plan::generate"), "{e}");
/// assert!(matches!(generate("nope", &params, None, &opts), Err(PlanError::UnknownFamily { .. })));
/// ```
pub fn generate(
    name: &str,
    params: &Params,
    costs: Option<&CostFile>,
    auto: &AutoOptions,
) -> Result<Schedule, PlanError> {
    let source = match sources(&[name.to_string()])?.first() {
        Some(&s) => s,
        None => return Err(unknown(name)),
    };
    match (source, costs) {
        (Source::Family(f), _) => (f.generate)(params).map_err(|source| PlanError::Schedule {
            name: f.name.to_string(),
            source,
        }),
        (Source::Auto, Some(costs)) => source.schedule(params, costs, None, auto),
        (Source::Auto, None) => Err(PlanError::Schedule {
            name: AUTO.to_string(),
            source: ScheduleError::AutoNeedsCosts,
        }),
    }
}
