//! The manifest: what a checkpoint is of (step, plan with its schedule and partition, model shape,
//! seed, optimizer, format version) and the rank files it covers. Written last, so a checkpoint
//! folder without one is incomplete and never used.

use pipefill_host::cost::ActivationDtype;
use pipefill_host::input;
use pipefill_host::plan::Plan;
use pipefill_host::schedule::Schedule;
use serde::{Deserialize, Serialize};

use super::error::Field;
use super::{CheckpointError, FORMAT_VERSION};
use crate::layers::Optimizer;
use crate::model::ModelSpec;

/// The `format` value of every manifest.
pub const FORMAT: &str = "pipefill-checkpoint";

/// One layer's shape as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerShape {
    /// Output width.
    pub width: usize,
    /// The fused activation's name.
    pub activation: String,
}

/// The model's shape as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    /// Width of the input rows.
    pub input: usize,
    /// The layers, in order.
    pub layers: Vec<LayerShape>,
    /// The loss's name.
    pub loss: String,
    /// Rows per step.
    pub batch: usize,
}

impl ModelShape {
    /// The shape of `spec`.
    pub fn of(spec: &ModelSpec) -> Self {
        ModelShape {
            input: spec.input,
            layers: spec
                .layers
                .iter()
                .map(|l| LayerShape {
                    width: l.width,
                    activation: l.activation.to_string(),
                })
                .collect(),
            loss: spec.loss.name().to_string(),
            batch: spec.batch,
        }
    }

    /// In words: `4 layers (16 gelu, ..., 4 identity) from 16 inputs, mse loss`.
    fn describe(&self) -> String {
        let layers: Vec<String> = self
            .layers
            .iter()
            .map(|l| format!("{} {}", l.width, l.activation))
            .collect();
        format!(
            "{} layers ({}) from {} inputs, {} loss",
            self.layers.len(),
            layers.join(", "),
            self.input,
            self.loss
        )
    }
}

/// Whether `name` is one file name with no folder in it (no separator, not `.` or `..`, not
/// empty): what a manifest's rank file entries must be.
fn plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// One rank file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankFile {
    /// The rank.
    pub rank: usize,
    /// The file's name in the checkpoint's folder.
    pub file: String,
    /// Its length in bytes.
    pub bytes: u64,
    /// Its FNV-1a 64 checksum.
    pub checksum: u64,
}

/// A checkpoint's manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`] of the build that wrote it.
    pub version: u32,
    /// Optimizer steps completed.
    pub step: u64,
    /// The seed of the weights, the teacher and the data stream.
    pub seed: u64,
    /// The model's shape.
    pub model: ModelShape,
    /// The optimizer's name.
    pub optimizer: String,
    /// Its learning rate.
    pub lr: f32,
    /// How activations are stored (`f32`, `bf16`): a resume with another storage would round
    /// differently and diverge. Absent in checkpoints written before it was recorded: `f32`, the
    /// only storage then.
    #[serde(default = "f32_activations")]
    pub activations: String,
    /// The plan trained with: schedule (family name, `P`, `V`, `M`, the actions), partition
    /// (`layers_per_stage`) and the costs it was chosen with.
    pub plan: Plan,
    /// The rank files, one per rank in rank order.
    pub files: Vec<RankFile>,
}

/// The activation storage of a manifest that does not say.
fn f32_activations() -> String {
    ActivationDtype::F32.to_string()
}

/// What the run that wants to resume is: each field is compared with the checkpoint's.
#[derive(Debug, Clone, Copy)]
pub struct RunIdentity<'a> {
    /// The model.
    pub spec: &'a ModelSpec,
    /// `P`.
    pub ranks: usize,
    /// `M`.
    pub microbatches: usize,
    /// `V`, when the run fixes it.
    pub chunks: Option<usize>,
    /// The schedule's name, when the run fixes it.
    pub schedule: Option<&'a str>,
    /// The schedule itself, when the run gives one (a schedule file): it must equal the
    /// checkpoint's action for action.
    pub given: Option<&'a Schedule>,
    /// Layers per stage, when the run fixes them.
    pub partition: Option<&'a [usize]>,
    /// The seed.
    pub seed: u64,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// How activations are stored.
    pub activations: ActivationDtype,
}

/// The learning rate of `o`.
pub fn learning_rate(o: &Optimizer) -> f32 {
    match o {
        Optimizer::Sgd(s) => s.lr,
        Optimizer::AdamW(a) => a.lr,
    }
}

impl Manifest {
    /// Reads a manifest's text and checks it ([`Manifest::check_self`]); `path` names the file in
    /// errors.
    pub fn parse(text: &str, path: &std::path::Path) -> Result<Manifest, CheckpointError> {
        let text = pipefill_host::input::without_bom(text);
        let manifest: Manifest = serde_json::from_str(text)
            .map_err(|e| CheckpointError::corrupt(path, input::json_error_in(text, &e)))?;
        manifest.check_self(path)?;
        Ok(manifest)
    }

    /// Checks the format, the version and that the plan and file list hold together
    /// (`path` names the manifest in errors).
    pub fn check_self(&self, path: &std::path::Path) -> Result<(), CheckpointError> {
        let bad = |why: String| Err(CheckpointError::corrupt(path, why));
        if self.format != FORMAT {
            return bad(format!("format `{}`, expected `{FORMAT}`", self.format));
        }
        if self.version != FORMAT_VERSION {
            return bad(format!(
                "format version {}, this build reads version {FORMAT_VERSION}",
                self.version
            ));
        }
        // A rank file is a plain name inside the checkpoint's folder: never a path that leads
        // elsewhere (`../x`, `/dev/zero`).
        if let Some(f) = self.files.iter().find(|f| !plain_file_name(&f.file)) {
            return bad(format!(
                "rank {}'s file `{}` is not a plain file name in the checkpoint's folder",
                f.rank, f.file
            ));
        }
        let p = self.plan.schedule.ranks;
        let ranks: Vec<usize> = self.files.iter().map(|f| f.rank).collect();
        if ranks != (0..p).collect::<Vec<_>>() {
            return bad(format!(
                "files for ranks {ranks:?}, the schedule has {p} ranks"
            ));
        }
        let layers = self
            .plan
            .layers_per_stage
            .iter()
            .try_fold(0usize, |t, &c| t.checked_add(c));
        if layers != Some(self.model.layers.len())
            || self.plan.layers_per_stage.len() != self.plan.schedule.stages()
        {
            return bad(format!(
                "partition {:?} does not split the model's {} layers into the schedule's {} stages",
                self.plan.layers_per_stage,
                self.model.layers.len(),
                self.plan.schedule.stages()
            ));
        }
        if let Some(s) = self.plan.layers_per_stage.iter().position(|&n| n == 0) {
            return bad(format!(
                "field `plan.layers_per_stage`: stage {s} has no layers"
            ));
        }
        // The plan's costs must fit its schedule: a resume simulates them for its prediction.
        let costs = self.plan.cost.stages.len();
        if costs != self.plan.schedule.stages() {
            return bad(format!(
                "field `plan.cost.stages`: {costs} stage costs for the schedule's {} stages",
                self.plan.schedule.stages()
            ));
        }
        self.plan
            .timeline()
            .map(|_| ())
            .or_else(|e| bad(format!("field `plan`: its costs do not simulate: {e}")))
    }

    /// Refuses a run that differs from the checkpoint in anything its state depends on:
    /// [`CheckpointError::Mismatch`] naming the first such field.
    pub fn check_run(&self, run: &RunIdentity<'_>) -> Result<(), CheckpointError> {
        let differ = |field, checkpoint: String, run: String| {
            Err(CheckpointError::Mismatch {
                field,
                checkpoint,
                run,
            })
        };
        let mut shape = ModelShape::of(run.spec);
        let batch = std::mem::replace(&mut shape.batch, self.model.batch);
        if shape != self.model {
            return differ(Field::Model, self.model.describe(), shape.describe());
        }
        if batch != self.model.batch {
            return differ(
                Field::Batch,
                self.model.batch.to_string(),
                batch.to_string(),
            );
        }
        let s = &self.plan.schedule;
        if run.ranks != s.ranks {
            return differ(Field::Ranks, s.ranks.to_string(), run.ranks.to_string());
        }
        if run.microbatches != s.microbatches {
            let (c, r) = (s.microbatches, run.microbatches);
            return differ(Field::Microbatches, c.to_string(), r.to_string());
        }
        if let Some(v) = run.chunks.filter(|&v| v != s.chunks) {
            return differ(Field::Chunks, s.chunks.to_string(), v.to_string());
        }
        if let Some(name) = run.schedule.filter(|&n| n != self.plan.family) {
            return differ(Field::Schedule, self.plan.family.clone(), name.to_string());
        }
        if run.given.is_some_and(|g| g != s) {
            return differ(
                Field::Schedule,
                format!("`{}` as saved", self.plan.family),
                "a schedule with other actions".into(),
            );
        }
        if let Some(p) = run.partition.filter(|&p| p != self.plan.layers_per_stage) {
            let c = &self.plan.layers_per_stage;
            return differ(Field::Partition, format!("{c:?}"), format!("{p:?}"));
        }
        if run.seed != self.seed {
            return differ(Field::Seed, self.seed.to_string(), run.seed.to_string());
        }
        if run.optimizer.name() != self.optimizer {
            let name = run.optimizer.name().to_string();
            return differ(Field::Optimizer, self.optimizer.clone(), name);
        }
        let lr = learning_rate(&run.optimizer);
        if lr.to_bits() != self.lr.to_bits() {
            return differ(Field::LearningRate, self.lr.to_string(), lr.to_string());
        }
        let activations = run.activations.to_string();
        if activations != self.activations {
            return differ(Field::Activations, self.activations.clone(), activations);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::plain_file_name;

    #[test]
    fn rank_files_are_plain_names_in_the_folder() {
        assert!(plain_file_name("rank-0.bin"));
        for bad in ["", ".", "..", "../x", "/dev/zero", "a/b", "a\\b", "nul\0"] {
            assert!(!plain_file_name(bad), "{bad:?} accepted");
        }
    }
}
