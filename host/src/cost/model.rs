//! Building a [`CostModel`]: from per-layer costs and stage boundaries, or from any cost source for a
//! given `P` and `V` ([`CostSpec`]).

use super::{CostError, CostFile, CostModel, LayerCost, LinkCost, StageCost};

impl CostModel {
    /// Per-stage costs from per-layer costs and a partition given as layer counts per stage (in stage
    /// order, each `>= 1`, summing to the number of layers).
    ///
    /// A stage's times, activation, released and parameter bytes are the sums over its layers; its
    /// `output_bytes` (what it sends to the next stage, and receives back as a gradient) are those of
    /// its last layer. The overlap share is 0; set it afterwards if needed.
    ///
    /// ```
    /// use pipefill_host::cost::{CostModel, LayerCost, LinkCost};
    /// let layers: Vec<_> = (0..3).map(|i| LayerCost::new(format!("l{i}"), 1.0, 1.0, 1.0)).collect();
    /// let m = CostModel::from_layers(&layers, &[2, 1], LinkCost::default()).unwrap();
    /// assert_eq!(m.stages[0].forward, 2.0);
    /// assert!(CostModel::from_layers(&layers, &[2, 2], LinkCost::default()).is_err());
    /// ```
    pub fn from_layers(
        layers: &[LayerCost],
        layers_per_stage: &[usize],
        link: LinkCost,
    ) -> Result<CostModel, CostError> {
        check_partition(layers.len(), layers_per_stage)?;
        let mut stages = Vec::with_capacity(layers_per_stage.len());
        let mut next = 0;
        for &count in layers_per_stage {
            let mut stage = sum_layers(&layers[next..next + count]);
            // The stage's input is what the layer before it sends on.
            stage.input_bytes = next.checked_sub(1).map_or(0.0, |i| layers[i].output_bytes);
            stages.push(stage);
            next += count;
        }
        let model = CostModel {
            stages,
            link,
            overlap_share: 0.0,
        };
        model.check()?;
        Ok(model)
    }
}

impl CostFile {
    /// The per-stage model of this file under a partition (layer counts per stage), with the file's
    /// transfer cost and overlap share.
    pub fn model(&self, layers_per_stage: &[usize]) -> Result<CostModel, CostError> {
        let mut m = CostModel::from_layers(&self.layers, layers_per_stage, self.transfer)?;
        m.overlap_share = self.overlap_share;
        Ok(m)
    }
}

/// The sum of a run of layers as one stage; the output bytes are the last layer's. What the layers
/// declare selective counts from the second on: the first rebuilds from a layer in another stage.
fn sum_layers(layers: &[LayerCost]) -> StageCost {
    let mut s = StageCost::uniform(0.0, 0.0, 0.0);
    for l in layers.iter().skip(1) {
        s.selective_bytes += l.selective_bytes;
        s.selective_time += l.selective_time;
    }
    for l in layers {
        s.forward += l.forward;
        s.backward_input += l.backward_input;
        s.backward_weight += l.backward_weight;
        s.backward += l.backward;
        s.activation_bytes += l.activation_bytes;
        s.released_at_input += l.released_at_input;
        s.parameter_bytes += l.parameter_bytes;
    }
    s.output_bytes = layers.last().map_or(0.0, |l| l.output_bytes);
    s
}

/// Checks that `counts` partitions `layers` layers into non-empty contiguous stages.
fn check_partition(layers: usize, counts: &[usize]) -> Result<(), CostError> {
    if counts.is_empty() {
        return Err(CostError::mismatch(
            "the partition has no stages",
            "give at least one layer count per stage",
        ));
    }
    if let Some(s) = counts.iter().position(|&c| c == 0) {
        return Err(CostError::mismatch(
            format!("stage {s} of the partition has no layers"),
            "give every stage at least one layer",
        ));
    }
    // Summed with a check: counts near usize::MAX must not wrap around to a plausible total.
    let total = counts.iter().try_fold(0usize, |t, &c| t.checked_add(c));
    if total != Some(layers) {
        let total = total.map_or_else(|| "more than 2^64".to_string(), |t| t.to_string());
        return Err(CostError::mismatch(
            format!("the partition covers {total} layers but the cost file has {layers}"),
            format!("make the layer counts per stage sum to {layers}"),
        ));
    }
    Ok(())
}

/// `stages` contiguous stages with layer counts as equal as possible (the first `layers % stages`
/// stages get one more): the `uniform` partition.
///
/// ```
/// assert_eq!(pipefill_host::cost::split_even(7, 3).unwrap(), vec![3, 2, 2]);
/// ```
pub fn split_even(layers: usize, stages: usize) -> Result<Vec<usize>, CostError> {
    if stages == 0 || layers < stages {
        return Err(CostError::mismatch(
            format!("cannot split {layers} layers into {stages} stages of at least one layer"),
            format!("use at most {layers} stages (ranks x chunks), or give a cost file with more layers"),
        ));
    }
    let (q, r) = (layers / stages, layers % stages);
    Ok((0..stages).map(|s| q + usize::from(s < r)).collect())
}

/// Where a simulation's costs come from, before `P` and `V` are known (one source serves several
/// schedules with different `V`).
#[derive(Debug, Clone, PartialEq)]
pub enum CostSpec {
    /// One rank's work at `V = 1` (the `--cost` flag); each of `V` chunks costs `1/V` of it.
    Uniform {
        /// The per-rank cost.
        rank: StageCost,
        /// The link between ranks.
        link: LinkCost,
        /// Non-overlapped share of an overlapped F/B pair.
        overlap_share: f64,
    },
    /// Per-stage costs (a `"stages"` cost file): used as they are; `S` must match.
    Stages(CostModel),
    /// Per-layer costs, split into `S` stages by `layers_per_stage`, or evenly by layer count.
    Layers {
        /// The cost file.
        file: CostFile,
        /// An explicit partition; `None` splits evenly ([`split_even`]).
        layers_per_stage: Option<Vec<usize>>,
    },
}

impl CostSpec {
    /// The cost model for a schedule with `ranks` ranks and `chunks` stages per rank.
    pub fn model_for(&self, ranks: usize, chunks: usize) -> Result<CostModel, CostError> {
        let stages = ranks * chunks;
        let model = match self {
            CostSpec::Uniform {
                rank,
                link,
                overlap_share,
            } => {
                let mut all = vec![rank.split(chunks); stages];
                // Every stage after the first takes in what the one before sends.
                for st in all.iter_mut().skip(1) {
                    st.input_bytes = st.output_bytes;
                }
                CostModel {
                    stages: all,
                    link: *link,
                    overlap_share: *overlap_share,
                }
            }
            CostSpec::Stages(m) if m.stages.len() == stages => m.clone(),
            CostSpec::Stages(m) => {
                return Err(CostError::mismatch(
                    format!(
                        "the cost file has {} stages but the schedule has {stages} ({ranks} ranks x {chunks} chunks)",
                        m.stages.len()
                    ),
                    "give one entry under \"stages\" per stage, or per-layer costs under \"layers\"",
                ))
            }
            CostSpec::Layers {
                file,
                layers_per_stage,
            } => match layers_per_stage {
                Some(counts) if counts.len() != stages => {
                    return Err(CostError::mismatch(
                        format!(
                            "the partition has {} stages but the schedule has {stages} ({ranks} ranks x {chunks} chunks)",
                            counts.len()
                        ),
                        format!("give {stages} layer counts"),
                    ))
                }
                Some(counts) => file.model(counts)?,
                None => file.model(&split_even(file.layers.len(), stages)?)?,
            },
        };
        model.check()?;
        Ok(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers() -> Vec<LayerCost> {
        (0..4)
            .map(|i| {
                let mut l = LayerCost::new(format!("l{i}"), 1.0 + i as f64, 1.0, 2.0);
                l.activation_bytes = 10.0;
                (l.selective_bytes, l.selective_time) = (3.0, 0.5);
                l.released_at_input = 4.0;
                l.output_bytes = 100.0 * (i + 1) as f64;
                l
            })
            .collect()
    }

    #[test]
    fn sums_and_boundary_bytes() {
        let m = CostModel::from_layers(&layers(), &[1, 3], LinkCost::default()).unwrap();
        assert_eq!(m.stages[1].forward, 2.0 + 3.0 + 4.0);
        assert_eq!(m.stages[1].backward, 9.0);
        assert_eq!(m.stages[1].activation_bytes, 30.0);
        assert_eq!(m.stages[1].released_at_input, 12.0);
        assert_eq!(m.stages[0].output_bytes, 100.0);
        assert_eq!(m.stages[1].output_bytes, 400.0);
        // Selective: only the layers after a stage's first (they rebuild from a layer beside them).
        assert_eq!(m.stages[0].selective_bytes, 0.0);
        assert!(!m.stages[0].selective());
        assert_eq!(
            (m.stages[1].selective_bytes, m.stages[1].selective_time),
            (6.0, 1.0)
        );
    }

    #[test]
    fn bad_partitions() {
        let l = layers();
        for counts in [&[][..], &[0, 4], &[1, 2], &[3, 3]] {
            assert!(
                CostModel::from_layers(&l, counts, LinkCost::default()).is_err(),
                "{counts:?}"
            );
        }
        assert!(split_even(2, 3).is_err());
        assert_eq!(split_even(8, 4).unwrap(), vec![2; 4]);
    }

    #[test]
    fn spec_splits_rank_work_over_chunks() {
        let spec = CostSpec::Uniform {
            rank: StageCost::uniform(2.0, 2.0, 2.0),
            link: LinkCost::default(),
            overlap_share: 0.0,
        };
        let m = spec.model_for(4, 2).unwrap();
        assert_eq!(m.stages.len(), 8);
        assert_eq!(m.stages[0].forward, 1.0);
        let file = CostFile {
            layers: layers(),
            transfer: LinkCost::default(),
            overlap_share: 0.5,
            meta: serde_json::Value::Null,
        };
        let spec = CostSpec::Layers {
            file,
            layers_per_stage: None,
        };
        let m = spec.model_for(2, 1).unwrap();
        assert_eq!(m.stages[0].forward, 3.0);
        assert_eq!(m.overlap_share, 0.5);
        assert!(spec.model_for(4, 2).is_err());
        let stages = CostSpec::Stages(m);
        assert!(stages.model_for(2, 1).is_ok());
        assert!(stages
            .model_for(4, 1)
            .unwrap_err()
            .to_string()
            .contains("2 stages"));
    }
}
