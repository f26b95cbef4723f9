//! Activation memory over time, for any timeline (predicted or measured).
//!
//! `F(s,k)` allocates `activation_bytes` of stage `s` when it starts; `B` frees them all when it ends;
//! `I` frees `released_at_input` when it ends and `W` the rest. Parameters are not counted (they are
//! constant: `parameter_bytes` of the rank's stages).

use crate::cost::CostModel;
use crate::schedule::Item;
use crate::timeline::Timeline;

/// Per rank, the activation bytes held after each change, as `(time, bytes)` points in time order
/// (a step function: the value holds until the next point). Stages outside `costs` count 0.
///
/// ```
/// use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// use pipefill_host::sim::activation_curve;
/// use pipefill_host::timeline::{Source, Timeline};
/// let mut stage = StageCost::uniform(1.0, 1.0, 1.0);
/// stage.activation_bytes = 10.0;
/// stage.released_at_input = 4.0;
/// let costs = CostModel::uniform(stage, 1, LinkCost::default());
/// let mut t = Timeline::new("x", Source::Measured, 1);
/// for (i, a) in ["0F0", "0I0", "0W0"].iter().enumerate() {
///     t.push(0, a.parse().unwrap(), i as f64, i as f64 + 1.0);
/// }
/// assert_eq!(activation_curve(&t, &costs)[0], vec![(0.0, 10.0), (2.0, 6.0), (3.0, 0.0)]);
/// ```
pub fn activation_curve(timeline: &Timeline, costs: &CostModel) -> Vec<Vec<(f64, f64)>> {
    timeline
        .spans
        .iter()
        .map(|lane| {
            let mut now = 0.0;
            let mut points = Vec::with_capacity(2 * lane.len());
            for span in lane {
                let (alloc, freed) = bytes(&span.item(), costs);
                if alloc > 0.0 {
                    now += alloc;
                    points.push((span.start, now));
                }
                if freed > 0.0 {
                    now -= freed;
                    points.push((span.end, now));
                }
            }
            points
        })
        .collect()
}

/// Per rank, the largest activation bytes held at any time (see [`activation_curve`]).
pub fn peak_activations(timeline: &Timeline, costs: &CostModel) -> Vec<f64> {
    activation_curve(timeline, costs)
        .iter()
        .map(|c| c.iter().map(|p| p.1).fold(0.0, f64::max))
        .collect()
}

/// Bytes an item allocates at its start and frees at its end.
fn bytes(item: &Item, costs: &CostModel) -> (f64, f64) {
    let mut alloc = 0.0;
    let mut freed = 0.0;
    for a in item.actions() {
        let Some(st) = costs.stages.get(a.stage) else {
            continue;
        };
        let footprint = st.footprint();
        alloc += footprint.allocated_by(a.op);
        freed += footprint.released_by(a.op);
    }
    (alloc, freed)
}
