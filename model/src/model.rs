//! The built-in model: a stack of Linear + bias + activation layers with a loss, described by flags
//! or by a TOML/JSON file with per-layer widths (so uneven stages can be built), its deterministic
//! initial weights, and the synthetic teacher that generates its training data.
//!
//! Everything random here is drawn from ChaCha8 generators seeded from `--seed` and a fixed tag per
//! use (weights of layer `l`, the teacher, the batch of step `t`), so a run is reproducible and the
//! weights of layer `l` do not depend on how the layers are split into stages.
//!
//! A model file (TOML shown; JSON with the same fields also works, chosen by the extension):
//!
//! ```toml
//! input = 64          # width of the input rows
//! batch = 256         # rows per training step (split into the microbatches)
//! loss = "mse"        # "mse" or "ce" (softmax cross-entropy; the last width is the class count)
//!
//! [[layers]]
//! width = 256
//! activation = "relu" # identity, relu, gelu or silu; default identity
//!
//! [[layers]]
//! width = 16
//! ```

use std::ops::Range;
use std::path::Path;

use pipefill_host::input;
use pipefill_host::runtime::Tensor;
use pipefill_kernels::Activation;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use crate::layers::gemm::GemmBackend;
use crate::layers::{Linear, LinearStage, LossKind, Optimizer};

mod memory;
pub use memory::{
    available_memory, check_layer_count, check_memory, parse_meminfo, Bytes, Footprint,
    MemoryError, RunShape, ABSURD_BYTES, LAYER_BYTES, THREAD_STACK_BYTES,
};

/// Hidden width of the synthetic [`Teacher`].
pub const TEACHER_HIDDEN: usize = 32;

/// A model description that does not hold together; the message names the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ModelError(pub String);

/// One layer of the model: its output width and activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpec {
    /// Output width.
    pub width: usize,
    /// The fused activation.
    pub activation: Activation,
}

/// The built-in model: input width, layers, loss and rows per step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// Width of the input rows.
    pub input: usize,
    /// The layers in order.
    pub layers: Vec<LayerSpec>,
    /// The loss after the last layer.
    pub loss: LossKind,
    /// Rows per training step (split evenly into the microbatches).
    pub batch: usize,
}

/// The raw model file, before checks.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    input: usize,
    #[serde(default)]
    batch: Option<usize>,
    #[serde(default)]
    loss: Option<String>,
    layers: Vec<LayerFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LayerFile {
    width: usize,
    #[serde(default)]
    activation: Option<String>,
}

impl ModelSpec {
    /// `layers` layers of width `hidden` with `activation`, then an output layer of width
    /// `outputs` without activation (its output is the regression value or the class logits).
    pub fn uniform(
        layers: usize,
        hidden: usize,
        outputs: usize,
        activation: Activation,
        loss: LossKind,
        batch: usize,
    ) -> Result<Self, ModelError> {
        if layers < 1 {
            return Err(ModelError(
                "--layers must be at least 1 (the output layer counts)".into(),
            ));
        }
        check_layer_count(layers, available_memory())
            .map_err(|e| ModelError(format!("--layers {layers}: {e}; fix: give fewer --layers")))?;
        let mut specs = vec![
            LayerSpec {
                width: hidden,
                activation
            };
            layers - 1
        ];
        specs.push(LayerSpec {
            width: outputs,
            activation: Activation::Identity,
        });
        let spec = ModelSpec {
            input: hidden,
            layers: specs,
            loss,
            batch,
        };
        spec.check("--")?;
        Ok(spec)
    }

    /// Reads a TOML (`.toml`) or JSON (`.json`) model file; `default_batch` is used when the file
    /// has no `batch`.
    pub fn from_file(path: &Path, default_batch: usize) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ModelError(format!("cannot read model file {}: {e}", path.display())))?;
        ModelSpec::from_text(&text, path, default_batch)
    }

    /// Reads the text of a model file: `path`'s extension picks the format (`.toml` or `.json`)
    /// and names the file in errors; `default_batch` is used when the text has no `batch`.
    pub fn from_text(text: &str, path: &Path, default_batch: usize) -> Result<Self, ModelError> {
        let name = path.display();
        let text = input::without_bom(text);
        let raw: ModelFile = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => toml::from_str(text).map_err(|e: toml::de::Error| {
                let at = e.span().map_or(String::new(), |s| {
                    let before = text.get(..s.start).unwrap_or(text);
                    let line = before.matches('\n').count() + 1;
                    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                    format!(" at line {line} column {column}")
                });
                ModelError(format!(
                    "model file {name}: {}{at}",
                    input::message(e.message())
                ))
            })?,
            Some("json") => serde_json::from_str(text).map_err(|e| {
                ModelError(format!(
                    "model file {name}: {}",
                    input::json_error_in(text, &e)
                ))
            })?,
            _ => {
                return Err(ModelError(format!(
                    "model file {name}: the name must end in .toml or .json"
                )))
            }
        };
        let loss = match raw.loss.as_deref() {
            None => LossKind::Mse,
            Some(l) => l
                .parse()
                .map_err(|e| ModelError(format!("model file {name}: field `loss`: {e}")))?,
        };
        let layers = raw
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let activation = match l.activation.as_deref() {
                    None => Ok(Activation::Identity),
                    Some(a) => a.parse().map_err(|e| {
                        ModelError(format!(
                            "model file {name}: field `layers[{i}].activation`: {e}"
                        ))
                    }),
                }?;
                Ok(LayerSpec {
                    width: l.width,
                    activation,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let spec = ModelSpec {
            input: raw.input,
            layers,
            loss,
            batch: raw.batch.unwrap_or(default_batch),
        };
        spec.check(&format!("model file {name}: field `"))?;
        Ok(spec)
    }

    /// Checks sizes; `field` prefixes the field names in messages (`--` for flags).
    fn check(&self, field: &str) -> Result<(), ModelError> {
        let close = if field.ends_with('`') { "`" } else { "" };
        let bad = |f: &str, fix: &str| Err(ModelError(format!("{field}{f}{close} {fix}")));
        if self.input == 0 {
            return bad(
                if field == "--" { "hidden" } else { "input" },
                "must be at least 1",
            );
        }
        if self.batch == 0 {
            return bad("batch", "must be at least 1");
        }
        if self.layers.is_empty() {
            return bad("layers", "must list at least one layer");
        }
        if let Some(i) = self.layers.iter().position(|l| l.width == 0) {
            let f = if field == "--" {
                "hidden/--outputs".to_string()
            } else {
                format!("layers[{i}].width")
            };
            return bad(&f, "must be at least 1");
        }
        if self.loss == LossKind::CrossEntropy && self.outputs() < 2 {
            return bad(
                if field == "--" { "outputs" } else { "layers" },
                "must give the last layer at least 2 classes for the ce loss",
            );
        }
        Ok(())
    }

    /// Width of the last layer.
    pub fn outputs(&self) -> usize {
        self.layers.last().map_or(self.input, |l| l.width)
    }

    /// `(inputs, outputs, activation)` of every layer.
    pub fn dims(&self) -> impl Iterator<Item = (usize, usize, Activation)> + '_ {
        let ins = std::iter::once(self.input).chain(self.layers.iter().map(|l| l.width));
        ins.zip(&self.layers)
            .map(|(i, l)| (i, l.width, l.activation))
    }

    /// Total parameter count.
    pub fn parameters(&self) -> usize {
        self.dims().map(|(i, o, _)| i * o + o).sum()
    }

    /// The model's layers with their initial weights (deterministic from `seed`).
    pub fn init_layers(&self, seed: u64) -> Vec<Linear> {
        self.dims()
            .enumerate()
            .map(|(l, dims)| init_layer(seed, l, dims))
            .collect()
    }

    /// The stages of the model split at `ranges` (contiguous, covering all layers), with their
    /// initial weights from `seed`.
    pub fn build_stages(
        &self,
        ranges: &[Range<usize>],
        optimizer: Optimizer,
        gemm: GemmBackend,
        seed: u64,
    ) -> Result<Vec<LinearStage>, ModelError> {
        let all = self.build_stages_where(ranges, optimizer, gemm, seed, |_| true)?;
        Ok(all.into_iter().map(|(_, stage)| stage).collect())
    }

    /// Only the stages `keep` takes of [`build_stages`](ModelSpec::build_stages), as `(stage index,
    /// stage)`, with the same weights (one process of a multi-process run builds only its rank's).
    pub fn build_stages_where(
        &self,
        ranges: &[Range<usize>],
        optimizer: Optimizer,
        gemm: GemmBackend,
        seed: u64,
        keep: impl Fn(usize) -> bool,
    ) -> Result<Vec<(usize, LinearStage)>, ModelError> {
        let n = self.layers.len();
        let contiguous = ranges.first().is_some_and(|r| r.start == 0)
            && ranges.last().is_some_and(|r| r.end == n)
            && ranges.windows(2).all(|w| w[0].end == w[1].start)
            && ranges.iter().all(|r| r.start < r.end);
        if !contiguous {
            return Err(ModelError(format!(
                "stages {ranges:?} must split the {n} layers into contiguous non-empty runs"
            )));
        }
        let dims: Vec<_> = self.dims().collect();
        Ok(ranges
            .iter()
            .enumerate()
            .filter(|(s, _)| keep(*s))
            .map(|(s, r)| {
                let mine = r.clone().map(|l| init_layer(seed, l, dims[l])).collect();
                (s, LinearStage::new(mine, optimizer, gemm, s == 0))
            })
            .collect())
    }
}

/// Layer `l` of shape `(inputs, outputs, activation)` with its initial weights from `seed` (each
/// layer draws from its own stream, so any subset of the layers is built alike).
fn init_layer(seed: u64, l: usize, (i, o, act): (usize, usize, Activation)) -> Linear {
    let mut rng = rng(seed, Tag::Weights, l as u64);
    let a = (3.0 / i as f32).sqrt();
    let w = (0..i * o).map(|_| rng.random_range(-a..a)).collect();
    Linear::new(i, o, act, w, vec![0.0; o])
}

/// The layer ranges of a split given as layer counts per stage (e.g. from
/// `pipefill_host::cost::split_even` or a partition).
pub fn stage_ranges(layers_per_stage: &[usize]) -> Vec<Range<usize>> {
    let mut start = 0;
    layers_per_stage
        .iter()
        .map(|&n| {
            start += n;
            start - n..start
        })
        .collect()
}

/// What each generator of a run is for (so that streams never collide).
#[derive(Debug, Clone, Copy)]
enum Tag {
    Weights = 1,
    Teacher = 2,
    Batch = 3,
}

/// A ChaCha8 generator for `(seed, tag, index)`.
fn rng(seed: u64, tag: Tag, index: u64) -> ChaCha8Rng {
    let mut z = seed ^ (tag as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index.rotate_left(32);
    // splitmix64 finaliser: nearby seeds give unrelated streams.
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ChaCha8Rng::seed_from_u64(z ^ (z >> 31))
}

/// The synthetic teacher: a fixed random network `tanh(x A) B` whose outputs (MSE) or argmax
/// classes (cross-entropy) are the targets, so the student's loss must fall as it learns.
#[derive(Debug, Clone)]
pub struct Teacher {
    input: usize,
    hidden: usize,
    outputs: usize,
    loss: LossKind,
    a: Vec<f32>,
    b: Vec<f32>,
    seed: u64,
}

impl Teacher {
    /// The teacher for `spec`, from `seed`.
    pub fn new(spec: &ModelSpec, seed: u64) -> Self {
        let hidden = TEACHER_HIDDEN;
        let (input, outputs) = (spec.input, spec.outputs());
        let mut r = rng(seed, Tag::Teacher, 0);
        let mut draw = |n: usize, fan_in: usize| -> Vec<f32> {
            let a = (3.0 / fan_in as f32).sqrt() * 1.5;
            (0..n).map(|_| r.random_range(-a..a)).collect()
        };
        let a = draw(input * hidden, input);
        let b = draw(hidden * outputs, hidden);
        Teacher {
            input,
            hidden,
            outputs,
            loss: spec.loss,
            a,
            b,
            seed,
        }
    }

    /// The teacher's outputs for `rows` rows of `x`, computed in f64.
    fn outputs_of(&self, x: &[f32], rows: usize) -> Vec<f64> {
        let mut y = vec![0.0f64; rows * self.outputs];
        let mut h = vec![0.0f64; self.hidden];
        for r in 0..rows {
            let xr = &x[r * self.input..(r + 1) * self.input];
            for (j, hj) in h.iter_mut().enumerate() {
                let s: f64 = (0..self.input)
                    .map(|i| xr[i] as f64 * self.a[i * self.hidden + j] as f64)
                    .sum();
                *hj = s.tanh();
            }
            for k in 0..self.outputs {
                y[r * self.outputs + k] = (0..self.hidden)
                    .map(|j| h[j] * self.b[j * self.outputs + k] as f64)
                    .sum();
            }
        }
        y
    }

    /// The batch of training step `step`, split into `microbatches` `(inputs, targets)` of
    /// `batch / microbatches` rows each (the caller checks that it divides).
    pub fn batch(
        &self,
        step: u64,
        batch: usize,
        microbatches: usize,
    ) -> (Vec<Tensor>, Vec<Tensor>) {
        let rows = batch / microbatches.max(1);
        let mut r = rng(self.seed, Tag::Batch, step);
        (0..microbatches)
            .map(|_| {
                let x: Vec<f32> = (0..rows * self.input)
                    .map(|_| r.random_range(-1.0f32..1.0))
                    .collect();
                let y = self.outputs_of(&x, rows);
                let target = match self.loss {
                    LossKind::Mse => {
                        Tensor::matrix(rows, self.outputs, y.iter().map(|&v| v as f32).collect())
                    }
                    LossKind::CrossEntropy => {
                        Tensor::matrix(rows, 1, y.chunks_exact(self.outputs).map(argmax).collect())
                    }
                };
                let input = Tensor::matrix(rows, self.input, x);
                // Shapes are built right here from the same numbers.
                (input.unwrap_or_default(), target.unwrap_or_default())
            })
            .unzip()
    }
}

/// Index of the largest value, as `f32` (a class label).
fn argmax(row: &[f64]) -> f32 {
    row.iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 {
                (i, v)
            } else {
                best
            }
        })
        .0 as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_ranges_follow_the_counts() {
        assert_eq!(stage_ranges(&[3, 2, 2]), vec![0..3, 3..5, 5..7]);
        assert!(stage_ranges(&[]).is_empty());
    }

    #[test]
    fn weights_do_not_depend_on_the_split() {
        let spec = ModelSpec::uniform(6, 8, 4, Activation::Relu, LossKind::Mse, 16).unwrap();
        let opt = Optimizer::sgd(0.1);
        let a = spec
            .build_stages(&stage_ranges(&[3, 3]), opt, GemmBackend::default(), 7)
            .unwrap();
        let b = spec
            .build_stages(&stage_ranges(&[2, 2, 2]), opt, GemmBackend::default(), 7)
            .unwrap();
        let flat = |s: &[LinearStage]| -> Vec<Linear> {
            s.iter().flat_map(|s| s.layers.clone()).collect()
        };
        assert_eq!(flat(&a), flat(&b));
        let c = spec
            .build_stages(&stage_ranges(&[2, 2, 2]), opt, GemmBackend::default(), 8)
            .unwrap();
        assert_ne!(flat(&a), flat(&c));
    }

    #[test]
    fn a_subset_of_the_stages_is_built_as_in_the_whole_model() {
        let spec = ModelSpec::uniform(6, 8, 4, Activation::Relu, LossKind::Mse, 16).unwrap();
        let (opt, ranges) = (Optimizer::sgd(0.1), stage_ranges(&[1, 2, 2, 1]));
        let all = spec
            .build_stages(&ranges, opt, GemmBackend::default(), 7)
            .unwrap();
        let odd = spec
            .build_stages_where(&ranges, opt, GemmBackend::default(), 7, |s| s % 2 == 1)
            .unwrap();
        assert_eq!(odd.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 3]);
        for (s, stage) in &odd {
            assert_eq!(stage.layers, all[*s].layers, "stage {s}");
            assert_eq!(stage.first, *s == 0);
        }
    }

    #[test]
    fn batches_are_deterministic_and_differ_by_step() {
        let spec =
            ModelSpec::uniform(3, 8, 3, Activation::Gelu, LossKind::CrossEntropy, 12).unwrap();
        let t = Teacher::new(&spec, 1);
        let (x0, y0) = t.batch(0, 12, 3);
        assert_eq!((x0.len(), x0[0].shape()), (3, &[4usize, 8][..]));
        assert_eq!(y0[0].shape(), &[4, 1]);
        assert!(y0
            .iter()
            .flat_map(|y| y.data())
            .all(|&c| (0.0..3.0).contains(&c)));
        assert_eq!(t.batch(0, 12, 3).0, x0);
        assert_ne!(t.batch(1, 12, 3).0, x0);
    }

    #[test]
    fn model_files_are_checked_field_by_field() {
        let dir = std::env::temp_dir().join(format!("pipefill-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let ok = write(
            "m.toml",
            "input = 4\nloss = \"ce\"\n[[layers]]\nwidth = 8\nactivation = \"silu\"\n[[layers]]\nwidth = 3\n",
        );
        let m = ModelSpec::from_file(&ok, 32).unwrap();
        assert_eq!(
            (m.input, m.outputs(), m.batch, m.loss),
            (4, 3, 32, LossKind::CrossEntropy)
        );
        assert_eq!(m.layers[0].activation, Activation::Silu);
        let json = write(
            "m.json",
            r#"{"input": 2, "batch": 8, "layers": [{"width": 0}]}"#,
        );
        let e = ModelSpec::from_file(&json, 32).unwrap_err().0;
        assert!(e.contains("`layers[0].width`"), "{e}");
        let act = write(
            "a.toml",
            "input = 2\n[[layers]]\nwidth = 2\nactivation = \"tanh\"\n",
        );
        let e = ModelSpec::from_file(&act, 32).unwrap_err().0;
        assert!(e.contains("layers[0].activation"), "{e}");
        let extra = write("x.toml", "input = 2\nlayer = []\n");
        assert!(ModelSpec::from_file(&extra, 32).is_err());
        assert!(ModelSpec::from_file(&dir.join("m.yaml"), 32).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
