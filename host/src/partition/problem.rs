//! The partitioner's input: per-layer integer costs, memory and boundary transfers, with prefix
//! sums so that any stage's cost is O(1) and its memory O(moments of the schedule), and each
//! stage's recomputation mode.

use crate::cost::{LayerCost, LinkCost, Recompute, StageCost};
use crate::schedule::deps::Footprint;

use super::{Holds, Layout, Partition, PartitionError, NANOS_PER_SECOND};

/// The partitioner's input: per-layer costs in integer units, and per-boundary transfer times.
///
/// Times are `F + I + W` per microbatch in nanoseconds (rounded from the cost file's seconds).
/// `transfer[i]` is the time to move layer `i`'s output to the next rank (`latency + output_bytes /
/// bandwidth`); a boundary after layer `i` that crosses ranks costs `transfer[i]` to the stage before it
/// (sending the activation) and `transfer[i]` to the stage after it (sending the gradient back).
///
/// With a recomputation mode per stage ([`Problem::with_recompute`]) a stage's cost includes the
/// forward it runs again and its memory counts what that mode keeps ([`Problem::stage_model`]):
/// the simulator's own formulas ([`StageCost::time`], [`StageCost::footprint`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    times: Vec<u64>,
    parameters: Vec<u64>,
    activations: Vec<u64>,
    transfer: Vec<u64>,
    /// Per layer: bytes sent on (a stage's input is the output of the layer before it).
    outputs: Vec<u64>,
    prefix_time: Vec<u64>,
    prefix_param: Vec<u64>,
    prefix_act: Vec<u64>,
    prefix_forward: Vec<u64>,
    prefix_released: Vec<u64>,
    /// Per layer, prefix sums of the bytes it can drop after F and rebuild (selective
    /// recomputation) and of the rebuild's time; a stage counts them from its second layer on.
    prefix_selective_bytes: Vec<u64>,
    prefix_selective_time: Vec<u64>,
    /// Per stage; stages past the end recompute nothing.
    recompute: Vec<Recompute>,
}

fn prefix(v: &[u64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(v.len() + 1);
    let mut acc = 0u64;
    out.push(0);
    for &x in v {
        acc = acc.saturating_add(x);
        out.push(acc);
    }
    out
}

/// Panics unless every length in `lengths` is `layers` (a programming error of the caller of
/// `Problem::{what}`, not an input error).
fn same_lengths(layers: usize, lengths: &[usize], what: &str) {
    assert!(
        lengths.iter().all(|&l| l == layers),
        "Problem::{what}: all per-layer vectors must have the same length"
    );
}

fn nanos(
    index: usize,
    name: &str,
    field: &'static str,
    seconds: f64,
) -> Result<u64, PartitionError> {
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(PartitionError::BadCost {
            index,
            name: name.to_string(),
            field,
            value: seconds,
        });
    }
    Ok((seconds * NANOS_PER_SECOND).round() as u64)
}

fn bytes(index: usize, name: &str, field: &'static str, value: f64) -> Result<u64, PartitionError> {
    if !value.is_finite() || value < 0.0 {
        return Err(PartitionError::BadCost {
            index,
            name: name.to_string(),
            field,
            value,
        });
    }
    Ok(value.round() as u64)
}

impl Problem {
    /// Layers with the given times (any integer unit), no memory and free transfers.
    pub fn from_times(times: &[u64]) -> Self {
        let zeros = vec![0; times.len()];
        Self::new(times.to_vec(), zeros.clone(), zeros.clone(), zeros)
    }

    /// Builds a problem from parts of equal length `L`: per-layer times, parameter bytes, activation
    /// bytes per microbatch, and transfer times after each layer (the last entry is unused).
    ///
    /// # Panics
    /// If the lengths differ (a programming error, not an input error).
    pub fn new(
        times: Vec<u64>,
        parameters: Vec<u64>,
        activations: Vec<u64>,
        transfer: Vec<u64>,
    ) -> Self {
        let n = times.len();
        same_lengths(
            n,
            &[parameters.len(), activations.len(), transfer.len()],
            "new",
        );
        Problem {
            prefix_time: prefix(&times),
            prefix_param: prefix(&parameters),
            prefix_act: prefix(&activations),
            prefix_forward: vec![0; n + 1],
            prefix_released: vec![0; n + 1],
            prefix_selective_bytes: vec![0; n + 1],
            prefix_selective_time: vec![0; n + 1],
            outputs: vec![0; n],
            times,
            parameters,
            activations,
            transfer,
            recompute: Vec::new(),
        }
    }

    /// The same problem with per-layer forward times (of `times`' unit), bytes released when `I`
    /// ends and output bytes (each of length `L`): what recomputation adds and keeps. The
    /// problems of [`Problem::new`] and [`Problem::from_times`] have zeros there.
    ///
    /// # Panics
    /// If a length differs from `L` (a programming error, not an input error).
    pub fn with_layer_detail(
        mut self,
        forward: &[u64],
        released_at_input: &[u64],
        outputs: Vec<u64>,
    ) -> Self {
        same_lengths(
            self.layers(),
            &[forward.len(), released_at_input.len(), outputs.len()],
            "with_layer_detail",
        );
        self.prefix_forward = prefix(forward);
        self.prefix_released = prefix(released_at_input);
        self.outputs = outputs;
        self
    }

    /// The same problem with per-layer selective parts (each of length `L`): the bytes a layer can
    /// drop after F and rebuild before I/B, and the rebuild's time (of `times`' unit), counted on
    /// a stage from its second layer on (the first rebuilds from a layer in another stage), as
    /// the cost model sums them.
    ///
    /// # Panics
    /// If a length differs from `L` (a programming error, not an input error).
    pub fn with_selective(mut self, bytes: &[u64], time: &[u64]) -> Self {
        same_lengths(self.layers(), &[bytes.len(), time.len()], "with_selective");
        self.prefix_selective_bytes = prefix(bytes);
        self.prefix_selective_time = prefix(time);
        self
    }

    /// The same problem with stage `s` run in recomputation mode `modes[s]` (stages past the end
    /// of `modes` recompute nothing).
    ///
    /// ```
    /// use pipefill_host::cost::{LayerCost, LinkCost, Recompute};
    /// use pipefill_host::partition::{Layout, Problem};
    /// let layers: Vec<_> = (0..4).map(|i| LayerCost::new(format!("l{i}"), 2e-9, 1e-9, 1e-9)).collect();
    /// let p = Problem::from_layers(&layers, &LinkCost::default())?;
    /// let layout = Layout::one_stage_per_rank(2);
    /// assert_eq!(p.stage_cost(&layout, 0, 0, 2), 8);
    /// // Recomputing runs the forward again: 2 x 2 ns more.
    /// let p = p.with_recompute(&[Recompute::Full]);
    /// assert_eq!((p.stage_cost(&layout, 0, 0, 2), p.stage_cost(&layout, 1, 2, 4)), (12, 8));
    /// # Ok::<(), pipefill_host::partition::PartitionError>(())
    /// ```
    pub fn with_recompute(mut self, modes: &[Recompute]) -> Self {
        self.recompute = modes.to_vec();
        self
    }

    /// Stage `stage`'s recomputation mode.
    pub fn recompute(&self, stage: usize) -> Recompute {
        self.recompute.get(stage).copied().unwrap_or_default()
    }

    /// Converts cost-file layers (seconds, bytes) and the link into a problem, checking every value.
    pub fn from_layers(layers: &[LayerCost], link: &LinkCost) -> Result<Self, PartitionError> {
        if !(link.latency.is_finite() && link.latency >= 0.0) {
            return Err(PartitionError::BadLink(format!(
                "latency is {}; it must be a finite number of seconds >= 0",
                link.latency
            )));
        }
        if link.bandwidth.is_nan() || link.bandwidth <= 0.0 {
            return Err(PartitionError::BadLink(format!(
                "bandwidth is {}; it must be a number of bytes per second > 0",
                link.bandwidth
            )));
        }
        let mut times = Vec::with_capacity(layers.len());
        let mut parameters = Vec::with_capacity(layers.len());
        let mut activations = Vec::with_capacity(layers.len());
        let mut transfer = Vec::with_capacity(layers.len());
        let (mut forward, mut released, mut outputs) = (Vec::new(), Vec::new(), Vec::new());
        let (mut selective_bytes, mut selective_time) = (Vec::new(), Vec::new());
        for (i, l) in layers.iter().enumerate() {
            let f = nanos(i, &l.name, "forward", l.forward)?;
            forward.push(f);
            let b = nanos(i, &l.name, "backward_input", l.backward_input)?;
            let w = nanos(i, &l.name, "backward_weight", l.backward_weight)?;
            times.push(f.saturating_add(b).saturating_add(w));
            parameters.push(bytes(i, &l.name, "parameter_bytes", l.parameter_bytes)?);
            activations.push(bytes(i, &l.name, "activation_bytes", l.activation_bytes)?);
            released.push(bytes(i, &l.name, "released_at_input", l.released_at_input)?);
            selective_bytes.push(bytes(i, &l.name, "selective_bytes", l.selective_bytes)?);
            selective_time.push(nanos(i, &l.name, "selective_time", l.selective_time)?);
            let out = bytes(i, &l.name, "output_bytes", l.output_bytes)?;
            transfer.push(nanos(i, &l.name, "transfer", link.time(out as f64))?);
            outputs.push(out);
        }
        // Every sum the search forms stays below the total of all times (or all sizes), so a total
        // under MAX_TOTAL keeps all of it exact (the sums saturate rather than wrap, but a
        // saturated sum would read as "does not fit").
        let max = super::MAX_TOTAL as f64;
        let time_total = layers
            .iter()
            .map(|l| l.forward + l.backward_input + l.backward_weight + link.time(l.output_bytes))
            .sum::<f64>();
        if time_total * NANOS_PER_SECOND > max {
            return Err(PartitionError::TooLarge {
                what: "times (F + I + W and the transfers)",
                total: time_total,
                max: max / NANOS_PER_SECOND,
                unit: "s",
            });
        }
        let size_total = layers
            .iter()
            .map(|l| l.parameter_bytes + l.activation_bytes)
            .sum::<f64>();
        if size_total > max {
            return Err(PartitionError::TooLarge {
                what: "parameter and activation bytes",
                total: size_total,
                max,
                unit: "bytes",
            });
        }
        Ok(Self::new(times, parameters, activations, transfer)
            .with_layer_detail(&forward, &released, outputs)
            .with_selective(&selective_bytes, &selective_time))
    }

    /// `L`: the number of layers.
    pub fn layers(&self) -> usize {
        self.times.len()
    }

    /// Per-layer times (`F + I + W`).
    pub fn times(&self) -> &[u64] {
        &self.times
    }

    /// Per-layer parameter bytes.
    pub fn parameters(&self) -> &[u64] {
        &self.parameters
    }

    /// Parameter bytes of layers `a..b`.
    pub fn parameter_sum(&self, a: usize, b: usize) -> u64 {
        self.prefix_param[b] - self.prefix_param[a]
    }

    /// Compute time of layers `a..b`.
    pub fn compute(&self, a: usize, b: usize) -> u64 {
        self.prefix_time[b] - self.prefix_time[a]
    }

    /// Stage `stage` holding layers `a..b` as the simulator sees it, in the problem's units:
    /// forward time, activation, released and parameter bytes, input bytes (the output of layer
    /// `a - 1`, none for the first) and the stage's recomputation mode. Its
    /// [`rebuild_time`](StageCost::rebuild_time) and [`footprint`](StageCost::footprint) are what
    /// [`Problem::stage_cost`] and the memory count add.
    pub fn stage_model(&self, stage: usize, a: usize, b: usize) -> StageCost {
        let sum = |p: &[u64]| (p[b] - p[a]) as f64;
        let mut st = StageCost::uniform(sum(&self.prefix_forward), 0.0, 0.0);
        st.activation_bytes = sum(&self.prefix_act);
        st.released_at_input = sum(&self.prefix_released);
        st.parameter_bytes = sum(&self.prefix_param);
        st.input_bytes = a.checked_sub(1).map_or(0, |i| self.outputs[i]) as f64;
        if b > a + 1 {
            let from_second = |p: &[u64]| (p[b] - p[a + 1]) as f64;
            st.selective_bytes = from_second(&self.prefix_selective_bytes);
            st.selective_time = from_second(&self.prefix_selective_time);
        }
        st.with_recompute(self.recompute(stage))
    }

    /// What one microbatch of stage `stage` on layers `a..b` holds (module `holds`).
    pub fn footprint(&self, stage: usize, a: usize, b: usize) -> Footprint {
        self.stage_model(stage, a, b).footprint()
    }

    /// Cost of stage `stage` holding layers `a..b` under `layout`: compute (with the forward again
    /// when the stage recomputes) plus the transfers across its two boundaries when the
    /// neighbouring stage sits on another rank.
    pub fn stage_cost(&self, layout: &Layout, stage: usize, a: usize, b: usize) -> u64 {
        let mut c = self.compute(a, b);
        if self.recompute(stage) != Recompute::None {
            let rebuild = self.stage_model(stage, a, b).rebuild_time();
            c = c.saturating_add(rebuild as u64);
        }
        if stage > 0 && a > 0 && layout.crosses(stage - 1) {
            c = c.saturating_add(self.transfer[a - 1]);
        }
        if stage + 1 < layout.stages() && b < self.layers() && layout.crosses(stage) {
            c = c.saturating_add(self.transfer[b - 1]);
        }
        c
    }

    /// Memory of stage `stage` holding layers `a..b`: its parameters plus the most its
    /// microbatches hold at once under `holds` (its footprint in its mode).
    pub fn stage_memory(&self, holds: &Holds, stage: usize, a: usize, b: usize) -> u64 {
        let params = self.parameter_sum(a, b);
        let held = holds.stage_peak(stage, &self.footprint(stage, a, b));
        params.saturating_add(held.round() as u64)
    }

    /// Stage costs, rank loads, bottleneck and per-rank memory of a given split (`boundaries`: `S + 1`
    /// increasing layer indices from `0` to `L`).
    pub fn evaluate(
        &self,
        layout: &Layout,
        boundaries: &[usize],
    ) -> Result<Partition, PartitionError> {
        layout.check()?;
        let s = layout.stages();
        let ok = boundaries.len() == s + 1
            && boundaries.first() == Some(&0)
            && boundaries.last() == Some(&self.layers())
            && boundaries.windows(2).all(|w| w[0] < w[1]);
        if !ok {
            return Err(PartitionError::BadBoundaries(boundaries.to_vec()));
        }
        let stage_costs: Vec<u64> = (0..s)
            .map(|i| self.stage_cost(layout, i, boundaries[i], boundaries[i + 1]))
            .collect();
        let mut rank_loads = vec![0u64; layout.ranks];
        for (i, c) in stage_costs.iter().enumerate() {
            let r = layout.rank_of(i);
            rank_loads[r] = rank_loads[r].saturating_add(*c);
        }
        let bottleneck = rank_loads.iter().copied().max().unwrap_or(0);
        Ok(Partition {
            boundaries: boundaries.to_vec(),
            stage_costs,
            rank_loads,
            bottleneck,
            exact: false,
        })
    }

    /// Per-rank memory of a split under `holds`: the parameters of the rank's stages plus the most
    /// they hold at one moment, each in its recomputation mode (the simulator's peak plus the
    /// parameters, [`crate::plan::peak_memory`]).
    pub fn rank_memory(
        &self,
        layout: &Layout,
        boundaries: &[usize],
        holds: &Holds,
    ) -> Result<Vec<u64>, PartitionError> {
        if holds.stages() != layout.stages() {
            return Err(PartitionError::InFlightLength {
                got: holds.stages(),
                stages: layout.stages(),
            });
        }
        self.evaluate(layout, boundaries)?;
        let stage = |s: usize| (boundaries[s], boundaries[s + 1]);
        Ok((0..layout.ranks)
            .map(|r| {
                let own = holds.rank_stages(r);
                let params = own
                    .iter()
                    .map(|&s| self.parameter_sum(stage(s).0, stage(s).1));
                let feet: Vec<Footprint> = own
                    .iter()
                    .map(|&s| self.footprint(s, stage(s).0, stage(s).1))
                    .collect();
                let held = holds.rank_peak(r, &feet).round() as u64;
                params.fold(held, u64::saturating_add)
            })
            .collect())
    }
}
