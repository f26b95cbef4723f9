//! A cost model whose times come from a run: each stage's `F`, `I`, `W`, `B` replaced by the mean
//! measured duration of that stage's actions.
//!
//! What a runtime measured (per action, its seconds) simulated again tells profile error from runtime
//! overhead: the simulator on these costs predicts what the schedule would take if the runtime added
//! nothing to the layers' own time.

use super::CostModel;
use crate::schedule::{Action, Op};

impl CostModel {
    /// This model with every stage's times replaced by the mean measured duration of that stage's
    /// actions in `durations` (`(action, seconds)` pairs, as a runtime step reports them). Byte sizes,
    /// the link and the overlap share are kept, and so are the times of ops that did not run:
    ///
    /// - `F` from the forwards;
    /// - `I` and `W` from the split backwards when both ran (`B` from the fused ones, else `I + W`);
    /// - with only fused backwards, `B` from them, split into `I` and `W` in this model's ratio
    ///   (half and half when this model's `I + W` is 0);
    /// - on a stage with recomputation, a measured `I` or `B` includes the forward run again
    ///   before it: that stage's (new) forward time is taken off, since [`StageCost::time`]
    ///   adds it back.
    ///
    /// [`StageCost::time`]: super::StageCost::time
    ///
    /// ```
    /// use pipefill_host::cost::{CostModel, LinkCost, StageCost};
    /// use pipefill_host::schedule::{Action, Op};
    /// let base = CostModel::uniform(StageCost::uniform(1.0, 1.0, 3.0), 2, LinkCost::default());
    /// let run = [
    ///     (Action::new(Op::F, 0, 0), 2.0),
    ///     (Action::new(Op::F, 0, 1), 4.0),
    ///     (Action::new(Op::B, 1, 0), 8.0),
    /// ];
    /// let m = base.with_durations(&run);
    /// assert_eq!(m.stages[0].forward, 3.0); // the mean of the two forwards
    /// assert_eq!(m.stages[0].backward, 4.0); // stage 0's backward did not run: kept
    /// assert_eq!((m.stages[1].backward_input, m.stages[1].backward_weight), (2.0, 6.0));
    /// ```
    pub fn with_durations(&self, durations: &[(Action, f64)]) -> CostModel {
        let mut cost = self.clone();
        for (s, st) in cost.stages.iter_mut().enumerate() {
            if let Some(f) = mean_of(durations, s, Op::F) {
                st.forward = f;
            }
            let rebuild = st.rebuild_time();
            let mean = |op: Op| {
                let t = mean_of(durations, s, op)?;
                Some(match op {
                    Op::I | Op::B => (t - rebuild).max(0.0),
                    _ => t,
                })
            };
            match (mean(Op::I), mean(Op::W), mean(Op::B)) {
                (Some(i), Some(w), b) => {
                    st.backward_input = i;
                    st.backward_weight = w;
                    st.backward = b.unwrap_or(i + w);
                }
                (_, _, Some(b)) => {
                    let old = st.backward_input + st.backward_weight;
                    let share = if old > 0.0 {
                        st.backward_input / old
                    } else {
                        0.5
                    };
                    st.backward = b;
                    st.backward_input = b * share;
                    st.backward_weight = b - st.backward_input;
                }
                _ => {}
            }
        }
        cost
    }
}

/// The mean seconds of `op` on `stage` in `durations`; `None` when none ran.
fn mean_of(durations: &[(Action, f64)], stage: usize, op: Op) -> Option<f64> {
    let (sum, n) = durations
        .iter()
        .filter(|(a, _)| a.stage == stage && a.op == op)
        .fold((0.0, 0usize), |(sum, n), (_, t)| (sum + t, n + 1));
    (n > 0).then(|| sum / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{LinkCost, Recompute, StageCost};

    #[test]
    fn a_recomputing_stages_measured_backward_is_priced_once_with_its_rebuild() {
        let st = StageCost::uniform(1.0, 1.0, 1.0).with_recompute(Recompute::Full);
        let base = CostModel::uniform(st, 1, LinkCost::default());
        // Measured: F 2, and I 5 of which the rebuild (a forward) took 2.
        let run = [
            (Action::new(Op::F, 0, 0), 2.0),
            (Action::new(Op::I, 0, 0), 5.0),
            (Action::new(Op::W, 0, 0), 1.0),
        ];
        let m = base.with_durations(&run);
        assert_eq!(m.stages[0].backward_input, 3.0);
        assert_eq!(m.stages[0].time(Op::I), 5.0, "the run's I, not 7");
    }

    #[test]
    fn split_backwards_replace_i_w_and_keep_bytes_and_share() {
        let mut stage = StageCost::uniform(1.0, 1.0, 1.0);
        stage.activation_bytes = 64.0;
        let mut base = CostModel::uniform(stage, 1, LinkCost::default());
        base.overlap_share = 1.0;
        let run = [
            (Action::new(Op::I, 0, 0), 0.5),
            (Action::new(Op::I, 0, 1), 1.5),
            (Action::new(Op::W, 0, 0), 3.0),
        ];
        let m = base.with_durations(&run);
        let st = m.stages[0];
        assert_eq!(
            (st.forward, st.backward_input, st.backward_weight),
            (1.0, 1.0, 3.0)
        );
        assert_eq!(st.backward, 4.0);
        assert_eq!((st.activation_bytes, m.overlap_share), (64.0, 1.0));
    }
}
