//! The partitioner's input: per-layer integer costs, memory and boundary transfers, with prefix
//! sums so that any stage's cost and memory are O(1).

use crate::cost::{LayerCost, LinkCost};

use super::{Layout, Partition, PartitionError, NANOS_PER_SECOND};

/// The partitioner's input: per-layer costs in integer units, and per-boundary transfer times.
///
/// Times are `F + I + W` per microbatch in nanoseconds (rounded from the cost file's seconds).
/// `transfer[i]` is the time to move layer `i`'s output to the next rank (`latency + output_bytes /
/// bandwidth`); a boundary after layer `i` that crosses ranks costs `transfer[i]` to the stage before it
/// (sending the activation) and `transfer[i]` to the stage after it (sending the gradient back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    times: Vec<u64>,
    parameters: Vec<u64>,
    activations: Vec<u64>,
    transfer: Vec<u64>,
    prefix_time: Vec<u64>,
    prefix_param: Vec<u64>,
    prefix_act: Vec<u64>,
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
        assert!(
            parameters.len() == n && activations.len() == n && transfer.len() == n,
            "Problem::new: all per-layer vectors must have the same length"
        );
        Problem {
            prefix_time: prefix(&times),
            prefix_param: prefix(&parameters),
            prefix_act: prefix(&activations),
            times,
            parameters,
            activations,
            transfer,
        }
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
        for (i, l) in layers.iter().enumerate() {
            let f = nanos(i, &l.name, "forward", l.forward)?;
            let b = nanos(i, &l.name, "backward_input", l.backward_input)?;
            let w = nanos(i, &l.name, "backward_weight", l.backward_weight)?;
            times.push(f.saturating_add(b).saturating_add(w));
            parameters.push(bytes(i, &l.name, "parameter_bytes", l.parameter_bytes)?);
            activations.push(bytes(i, &l.name, "activation_bytes", l.activation_bytes)?);
            let out = bytes(i, &l.name, "output_bytes", l.output_bytes)?;
            transfer.push(nanos(i, &l.name, "transfer", link.time(out as f64))?);
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
        Ok(Self::new(times, parameters, activations, transfer))
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

    /// Compute time of layers `a..b`.
    pub fn compute(&self, a: usize, b: usize) -> u64 {
        self.prefix_time[b] - self.prefix_time[a]
    }

    /// Cost of stage `stage` holding layers `a..b` under `layout`: compute plus the transfers across
    /// its two boundaries when the neighbouring stage sits on another rank.
    pub fn stage_cost(&self, layout: &Layout, stage: usize, a: usize, b: usize) -> u64 {
        let mut c = self.compute(a, b);
        if stage > 0 && a > 0 && layout.crosses(stage - 1) {
            c = c.saturating_add(self.transfer[a - 1]);
        }
        if stage + 1 < layout.stages() && b < self.layers() && layout.crosses(stage) {
            c = c.saturating_add(self.transfer[b - 1]);
        }
        c
    }

    /// Memory of stage `stage` holding layers `a..b`: parameters + `in_flight` x activations.
    pub fn stage_memory(&self, a: usize, b: usize, in_flight: u64) -> u64 {
        let act = self.prefix_act[b] - self.prefix_act[a];
        (self.prefix_param[b] - self.prefix_param[a]).saturating_add(act.saturating_mul(in_flight))
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

    /// Per-rank memory of a split under a memory limit's in-flight counts.
    pub fn rank_memory(
        &self,
        layout: &Layout,
        boundaries: &[usize],
        in_flight: &[u64],
    ) -> Result<Vec<u64>, PartitionError> {
        if in_flight.len() != layout.stages() {
            return Err(PartitionError::InFlightLength {
                got: in_flight.len(),
                stages: layout.stages(),
            });
        }
        self.evaluate(layout, boundaries)?;
        let mut mem = vec![0u64; layout.ranks];
        for (s, k) in in_flight.iter().enumerate() {
            let r = layout.rank_of(s);
            mem[r] = mem[r].saturating_add(self.stage_memory(boundaries[s], boundaries[s + 1], *k));
        }
        Ok(mem)
    }
}
