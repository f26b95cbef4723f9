//! Where a plan's schedules come from: a handcrafted family, generated from `P`, `V` and `M`, or
//! `auto`, solved for the costs at that shape ([`crate::auto`]). Every planner ([`super::plan`],
//! [`super::plan_workers`], [`super::plan_given`]) takes both alike: one schedule per shape, then the
//! same partitions, simulation, memory check and ranking; so `auto` is planned at the request's
//! `P`, `D` and microbatch size, as the families are.

use crate::auto::{solve, AutoOptions, AUTO};
use crate::cost::{split_even, CostFile};
use crate::schedule::families::{Family, FAMILIES};
use crate::schedule::{Params, Schedule};

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
                let model = costs.model(&counts)?;
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
            None => Err(PlanError::UnknownFamily {
                name: n.clone(),
                known: FAMILIES
                    .iter()
                    .map(|f| f.name)
                    .chain(std::iter::once(AUTO))
                    .collect(),
            }),
        })
        .collect()
}
