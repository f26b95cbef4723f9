//! Every handcrafted family that fits the request (same `V` and placement, under the memory limit),
//! scored: seeds of the improvement phase and the baseline `auto` must never lose to.

use serde::{Deserialize, Serialize};

use crate::schedule::families::FAMILIES;
use crate::schedule::Params;

use super::instance::Instance;
use super::score::{score, within_budget, Scored};
use super::{AutoError, Objective};

/// How one handcrafted family did on the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FamilyResult {
    /// The family.
    pub family: String,
    /// Its objective; `None` when it does not fit the memory limit.
    pub value: Option<f64>,
    /// Its simulated makespan.
    pub makespan: f64,
    /// Its peak activation memory, the largest over ranks, in the limit's unit.
    pub peak: f64,
}

/// The families of the instance's `V` and placement, each generated, simulated and checked against
/// the budgets: the report per family, and the schedules that fit.
pub(crate) fn seeds(
    inst: &Instance,
    objective: Objective,
) -> Result<(Vec<FamilyResult>, Vec<Scored>), AutoError> {
    let mut report = Vec::new();
    let mut fitting = Vec::new();
    for fam in FAMILIES.iter().filter(|f| f.placement == inst.placement) {
        let params = Params::new(inst.p, inst.m).with_chunks(inst.v);
        let Ok(s) = (fam.generate)(&params) else {
            continue;
        };
        if s.chunks != inst.v || s.placement != inst.placement {
            continue;
        }
        let mut unlimited = inst.clone();
        unlimited.budget = vec![f64::INFINITY; inst.p];
        let Some(all) = score(&unlimited, objective, s)? else {
            continue;
        };
        let peak = all.peak.iter().copied().fold(0.0, f64::max);
        let fits = within_budget(inst, &all.peak);
        report.push(FamilyResult {
            family: fam.name.to_string(),
            value: fits.then_some(all.value),
            makespan: all.makespan,
            peak,
        });
        if fits {
            fitting.push(all);
        }
    }
    Ok((report, fitting))
}
