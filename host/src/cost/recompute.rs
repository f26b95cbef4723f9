//! Activation recomputation: how a stage keeps what its backward needs.
//!
//! Without recomputation (`none`) a stage's forward keeps everything its backward reads (its
//! *stash*, `activation_bytes` per microbatch) from the end of `F` until `I`/`W` (or `B`) free it.
//! With full recomputation (`full`) the forward keeps only the stage's input (`input_bytes`) and
//! runs again right before the microbatch's `I` (or `B`): the stash is rebuilt there, so
//!
//! - `F` holds `input_bytes` (at most `activation_bytes`) instead of `activation_bytes`;
//! - `I` (or `B`) allocates the rest again at its start and takes `forward` longer;
//! - `W` and the releases are unchanged.
//!
//! The trade is time for memory: a schedule that keeps many microbatches in flight (ZB-H2, ZB-V,
//! `auto` under a loose limit) may fit a limit only with it, and may then beat the best schedule
//! that fits without it. The cost model carries the mode per stage ([`StageCost::recompute`]); the
//! simulator, the memory curve and the lower bound read the times through [`StageCost::time`] and
//! the memory through [`StageCost::footprint`], so they all see it.
//!
//! [`StageCost::recompute`]: super::StageCost::recompute
//! [`StageCost::time`]: super::StageCost::time
//! [`StageCost::footprint`]: super::StageCost::footprint

use serde::{Deserialize, Serialize};

use crate::schedule::{Op, Schedule};

/// A stage's recomputation mode.
///
/// ```
/// use pipefill_host::cost::Recompute;
/// assert_eq!("full".parse::<Recompute>(), Ok(Recompute::Full));
/// assert_eq!(Recompute::default().to_string(), "none");
/// assert!("some".parse::<Recompute>().unwrap_err().contains("none, full, selective"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Recompute {
    /// Keep the whole stash from `F` until the backward frees it.
    #[default]
    None,
    /// Keep only the stage's input; run the forward again before `I` or `B`.
    Full,
    /// Drop after `F` the part of the stash the stage declares it can rebuild cheaply
    /// ([`StageCost::selective_bytes`], e.g. the built-in layers' inputs, which are the activation
    /// of the layer before's kept pre-activation) and rebuild it before `I` or `B`
    /// ([`StageCost::selective_time`]). Only for a stage that declares it
    /// ([`StageCost::selective`]).
    ///
    /// [`StageCost::selective_bytes`]: super::StageCost::selective_bytes
    /// [`StageCost::selective_time`]: super::StageCost::selective_time
    /// [`StageCost::selective`]: super::StageCost::selective
    Selective,
}

crate::named_enum!(Recompute as "recomputation mode" {
    None => "none",
    Full => "full",
    Selective => "selective",
});

impl super::CostModel {
    /// Each stage's recomputation mode, by stage: what a runtime is told to run
    /// (e.g. [`Executor::set_recompute`](crate::runtime::Executor::set_recompute)), so that what
    /// runs is what the simulator priced.
    ///
    /// ```
    /// use pipefill_host::cost::{CostModel, LinkCost, Recompute, StageCost};
    /// let mut m = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 2, LinkCost::default());
    /// m.stages[1].recompute = Recompute::Full;
    /// assert_eq!(m.recompute(), vec![Recompute::None, Recompute::Full]);
    /// ```
    pub fn recompute(&self) -> Vec<Recompute> {
        self.stages.iter().map(|s| s.recompute).collect()
    }

    /// This model with [`Recompute::Selective`] on every stage that declares it
    /// ([`StageCost::selective`](super::StageCost::selective)) and no recomputation elsewhere;
    /// `None` when no stage declares it.
    ///
    /// ```
    /// use pipefill_host::cost::{CostModel, LinkCost, Recompute, StageCost};
    /// let mut m = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 2, LinkCost::default());
    /// assert!(m.clone().selective_where_declared().is_none());
    /// (m.stages[1].activation_bytes, m.stages[1].selective_bytes) = (8.0, 4.0);
    /// let s = m.selective_where_declared().unwrap();
    /// assert_eq!(s.recompute(), vec![Recompute::None, Recompute::Selective]);
    /// ```
    pub fn selective_where_declared(mut self) -> Option<Self> {
        if !self.stages.iter().any(|s| s.selective()) {
            return None;
        }
        for st in &mut self.stages {
            let mode = if st.selective() {
                Recompute::Selective
            } else {
                Recompute::None
            };
            *st = st.with_recompute(mode);
        }
        Some(self)
    }

    /// Per stage, the share of its `I` (or, where `schedule` has no `I` on it, `B`) spent on the
    /// forward run again (0 without recomputation): what a timeline picture marks as rebuilt
    /// ([`SvgOptions::rebuild_share`](crate::trace::SvgOptions::rebuild_share)).
    ///
    /// ```
    /// use pipefill_host::cost::{CostModel, LinkCost, Recompute, StageCost};
    /// use pipefill_host::schedule::{families, Params};
    /// let mut m = CostModel::uniform(StageCost::uniform(1.0, 2.0, 2.0), 2, LinkCost::default());
    /// m.stages[1].recompute = Recompute::Full;
    /// let zb = families::generate("zb-h1", &Params::new(2, 4)).unwrap();
    /// assert_eq!(m.rebuild_shares(&zb), vec![0.0, 1.0 / 3.0]); // F / (F + I)
    /// let one = families::generate("1f1b", &Params::new(2, 4)).unwrap();
    /// assert_eq!(m.rebuild_shares(&one), vec![0.0, 0.2]); // F / (F + B)
    /// ```
    pub fn rebuild_shares(&self, schedule: &Schedule) -> Vec<f64> {
        let split = |s: usize| {
            let mut items = schedule.actions.iter().flatten();
            items.any(|i| i.actions().any(|a| a.stage == s && a.op == Op::I))
        };
        (self.stages.iter().enumerate())
            .map(|(s, st)| {
                let total = st.time(if split(s) { Op::I } else { Op::B });
                if total > 0.0 {
                    st.rebuild_time() / total
                } else {
                    0.0
                }
            })
            .collect()
    }
}

/// What a planner may do about recomputation (`plan --recompute`, [`PlanRequest::recompute`]).
///
/// ```
/// use pipefill_host::cost::RecomputeChoice;
/// assert_eq!("auto".parse::<RecomputeChoice>(), Ok(RecomputeChoice::Auto));
/// assert!("most".parse::<RecomputeChoice>().unwrap_err().contains("none, full, selective, auto"));
/// ```
///
/// [`PlanRequest::recompute`]: crate::plan::PlanRequest::recompute
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum RecomputeChoice {
    /// No stage recomputes.
    #[default]
    None,
    /// Every stage recomputes fully.
    Full,
    /// Every stage that declares part of its stash rebuildable
    /// ([`StageCost::selective`](super::StageCost::selective)) recomputes selectively; the
    /// others keep their stash.
    Selective,
    /// Per stage, chosen with the partition and the schedule under the memory limit: none
    /// everywhere, full everywhere, selective wherever declared, and the greedy set
    /// ([`crate::plan::fit_recompute`]: stage by stage, the step (none to selective or full,
    /// selective to full) that frees the most bytes per second of rebuild added, until the plan
    /// fits); the fastest plan that fits wins, the fewest recomputing stages on a tie.
    Auto,
}

crate::named_enum!(RecomputeChoice as "recomputation choice" {
    None => "none",
    Full => "full",
    Selective => "selective",
    Auto => "auto",
});
