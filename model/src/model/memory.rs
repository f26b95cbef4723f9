//! How much memory a run of the built-in model needs, estimated from its sizes before anything is
//! allocated, and how much the machine has.
//!
//! The estimate ([`ModelSpec::footprint`]) adds, in `f32` values of 4 bytes:
//!
//! - weights: `inputs * outputs + outputs` per layer;
//! - gradients: as many (every [`Linear`](crate::layers::Linear) allocates `dW` and `db` up front);
//! - optimizer state: one more copy for SGD with momentum (velocity), two for AdamW (moments);
//! - activations: per layer and row in flight, the input `X`, the pre-activation `Z` (not kept
//!   for the identity) and `dZ`, for every microbatch in flight (a training run counts all `M`:
//!   GPipe's peak, the most any family holds), in the run's [`ActivationDtype`] (`f32` unless the
//!   run stores activations as BF16, [`RunShape::with_activation_dtype`]: then 2 bytes each);
//! - data: the rows in flight as inputs and targets, plus the synthetic teacher's two matrices;
//! - thread stacks: [`THREAD_STACK_BYTES`] per rank (each rank is a thread);
//! - per-layer bookkeeping: [`LAYER_BYTES`] per layer (checked alone by [`check_layer_count`]
//!   before the layer list itself is built).
//!
//! Every product and sum is checked: an overflow is [`MemoryError::Overflow`], never a wrap.
//! [`check_memory`] compares the total with [`available_memory`] (Linux `MemAvailable`) and
//! refuses a total above [`ABSURD_BYTES`] even when the machine's memory cannot be read.

use std::fmt;

use pipefill_host::cost::ActivationDtype;

use super::{ModelSpec, TEACHER_HIDDEN};
use crate::layers::Optimizer;

/// Bytes of one value (`f32`).
const VALUE_BYTES: u64 = 4;

/// Stack reserved for each rank's thread (Rust's default for spawned threads).
pub const THREAD_STACK_BYTES: u64 = 2 << 20;

/// Bookkeeping per layer, an upper bound: its description, its `Linear` (without the buffers)
/// and its cost entry.
pub const LAYER_BYTES: u64 = 1 << 10;

/// A total above this (1 PiB) is refused whatever the machine reports: no machine this runs on has
/// it, and the check must hold where `/proc/meminfo` cannot be read.
pub const ABSURD_BYTES: u64 = 1 << 50;

/// The shape of a run beyond the model itself: what is in flight at once and who holds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunShape {
    /// Microbatches whose activations can be held at the same time.
    pub microbatches_in_flight: usize,
    /// Rows of each microbatch.
    pub rows: usize,
    /// Ranks, one thread each.
    pub ranks: usize,
    /// The optimizer whose state is allocated (`None`: no optimizer step runs).
    pub optimizer: Option<Optimizer>,
    /// Whether the synthetic teacher is built (training runs).
    pub teacher: bool,
    /// How activations are stored (weights, gradients, optimizer state and data stay `f32`).
    pub activation_dtype: ActivationDtype,
    /// Data-parallel replicas in this process (`--data-parallel D`): each holds its own weights,
    /// gradients, optimizer state, activations and rank threads.
    pub replicas: usize,
}

impl RunShape {
    /// A training run: `batch` rows split into `microbatches` (all in flight at GPipe's peak), on
    /// `ranks` threads, with `optimizer` and the teacher.
    pub fn training(batch: usize, microbatches: usize, ranks: usize, optimizer: Optimizer) -> Self {
        let microbatches = microbatches.max(1);
        RunShape {
            microbatches_in_flight: microbatches,
            rows: batch.div_ceil(microbatches),
            ranks,
            optimizer: Some(optimizer),
            teacher: true,
            activation_dtype: ActivationDtype::F32,
            replicas: 1,
        }
    }

    /// A profiling run: one microbatch of at most `rows` rows through the whole model, on the
    /// calling thread, without optimizer steps.
    pub fn profiling(rows: usize) -> Self {
        RunShape {
            microbatches_in_flight: 1,
            rows,
            ranks: 1,
            optimizer: None,
            teacher: false,
            activation_dtype: ActivationDtype::F32,
            replicas: 1,
        }
    }

    /// The same run as `replicas` data-parallel replicas in one process, each with its share of
    /// the rows (the rows of this shape are one replica's).
    pub fn with_replicas(self, replicas: usize) -> Self {
        RunShape {
            replicas: replicas.max(1),
            ..self
        }
    }

    /// The same run with activations stored as `dtype`.
    pub fn with_activation_dtype(self, dtype: ActivationDtype) -> Self {
        RunShape {
            activation_dtype: dtype,
            ..self
        }
    }
}

/// The estimated bytes of a run, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Weights and biases.
    pub weights: u64,
    /// Their gradients.
    pub gradients: u64,
    /// Optimizer state.
    pub optimizer: u64,
    /// Activations held from `F` to `W` for every microbatch in flight.
    pub activations: u64,
    /// Inputs, targets and the teacher.
    pub data: u64,
    /// Thread stacks of the ranks.
    pub threads: u64,
    /// Per-layer bookkeeping.
    pub layers: u64,
    /// The sum of the parts.
    pub total: u64,
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} in all: weights {}, gradients {}, optimizer state {}, activations {}, data {}, \
             thread stacks {}, per-layer bookkeeping {}",
            Bytes(self.total),
            Bytes(self.weights),
            Bytes(self.gradients),
            Bytes(self.optimizer),
            Bytes(self.activations),
            Bytes(self.data),
            Bytes(self.threads),
            Bytes(self.layers)
        )
    }
}

/// A byte count shown with a binary unit and, past KiB, the exact number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut v = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while v >= 1024.0 && unit + 1 < UNITS.len() {
            v /= 1024.0;
            unit += 1;
        }
        write!(f, "{v:.1} {} ({} B)", UNITS[unit], self.0)
    }
}

/// Why a run's sizes cannot be allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// A product or sum of the sizes does not fit 64 bits: far beyond any machine.
    #[error("the {part} of these sizes overflow a 64-bit byte count")]
    Overflow {
        /// Which part of the estimate overflowed (`weights`, `activations`, ...).
        part: &'static str,
    },
    /// The estimate is above [`ABSURD_BYTES`].
    #[error("the run needs an estimated {footprint}, above the {} that any machine this runs on has", Bytes(*limit))]
    Absurd {
        /// The estimate.
        footprint: Footprint,
        /// [`ABSURD_BYTES`].
        limit: u64,
    },
    /// The estimate is above the machine's available memory.
    #[error("the run needs an estimated {footprint}, but the machine has {} available", Bytes(*available))]
    TooLarge {
        /// The estimate.
        footprint: Footprint,
        /// Available bytes (Linux `MemAvailable`).
        available: u64,
    },
}

/// `a * b`, or the overflow of `part`.
fn mul(a: u64, b: u64, part: &'static str) -> Result<u64, MemoryError> {
    a.checked_mul(b).ok_or(MemoryError::Overflow { part })
}

/// `a + b`, or the overflow of `part`.
fn add(a: u64, b: u64, part: &'static str) -> Result<u64, MemoryError> {
    a.checked_add(b).ok_or(MemoryError::Overflow { part })
}

/// `usize` as `u64` (never loses bits on the 64- and 32-bit targets pipefill builds for).
fn n(v: usize) -> u64 {
    v as u64
}

impl ModelSpec {
    /// The estimated bytes of `run` on this model, with checked arithmetic.
    pub fn footprint(&self, run: &RunShape) -> Result<Footprint, MemoryError> {
        let mut params = 0u64;
        let mut per_row = 0u64;
        for (i, o, act) in self.dims() {
            let (i, o) = (n(i), n(o));
            params = add(params, add(mul(i, o, "weights")?, o, "weights")?, "weights")?;
            let kept = if act == pipefill_kernels::Activation::Identity {
                1
            } else {
                2
            };
            let layer = add(i, mul(o, kept, "activations")?, "activations")?;
            per_row = add(per_row, layer, "activations")?;
        }
        let weights = mul(params, VALUE_BYTES, "weights")?;
        let slots = match run.optimizer {
            None => 0,
            Some(Optimizer::Sgd(_)) => 1,
            Some(Optimizer::AdamW(_)) => 2,
        };
        let optimizer = mul(weights, slots, "optimizer state")?;
        let rows = mul(n(run.rows), n(run.microbatches_in_flight), "activations")?;
        let values = mul(rows, per_row, "activations")?;
        let activations = mul(values, run.activation_dtype.bytes(), "activations")?;
        let data = self.data_values(rows, run.teacher)?;
        let data = mul(data, VALUE_BYTES, "data")?;
        let threads = mul(n(run.ranks), THREAD_STACK_BYTES, "thread stacks")?;
        let layers = mul(n(self.layers.len()), LAYER_BYTES, "layers")?;
        // Every replica holds its own copy of all but the data.
        let d = n(run.replicas.max(1));
        let weights = mul(weights, d, "weights")?;
        let optimizer = mul(optimizer, d, "optimizer state")?;
        let activations = mul(activations, d, "activations")?;
        let threads = mul(threads, d, "thread stacks")?;
        let layers = mul(layers, d, "layers")?;
        // The gradients are as large as the weights.
        let total = [
            weights,
            weights,
            optimizer,
            activations,
            data,
            threads,
            layers,
        ]
        .into_iter()
        .try_fold(0, |sum, part| add(sum, part, "total"))?;
        Ok(Footprint {
            weights,
            gradients: weights,
            optimizer,
            activations,
            data,
            threads,
            layers,
            total,
        })
    }

    /// Values of the inputs and targets of `rows` rows, plus the teacher's matrices if built.
    fn data_values(&self, rows: u64, teacher: bool) -> Result<u64, MemoryError> {
        let (input, outputs) = (n(self.input), n(self.outputs()));
        let io = mul(rows, add(input, outputs, "data")?, "data")?;
        if !teacher {
            return Ok(io);
        }
        let t = mul(n(TEACHER_HIDDEN), add(input, outputs, "data")?, "data")?;
        add(io, t, "data")
    }
}

/// Estimates `run` on `spec` and refuses it when the total is above [`ABSURD_BYTES`] or above
/// `available` (when known). Returns the estimate when it fits.
pub fn check_memory(
    spec: &ModelSpec,
    run: &RunShape,
    available: Option<u64>,
) -> Result<Footprint, MemoryError> {
    fits(spec.footprint(run)?, available)
}

/// Refuses `layers` layers whose bookkeeping alone ([`LAYER_BYTES`] each) cannot fit: checked
/// before the list of layers is built.
pub fn check_layer_count(layers: usize, available: Option<u64>) -> Result<Footprint, MemoryError> {
    let bytes = mul(n(layers), LAYER_BYTES, "layers")?;
    let footprint = Footprint {
        weights: 0,
        gradients: 0,
        optimizer: 0,
        activations: 0,
        data: 0,
        threads: 0,
        layers: bytes,
        total: bytes,
    };
    fits(footprint, available)
}

/// `footprint` if its total is at most [`ABSURD_BYTES`] and `available` (when known).
fn fits(footprint: Footprint, available: Option<u64>) -> Result<Footprint, MemoryError> {
    if footprint.total > ABSURD_BYTES {
        return Err(MemoryError::Absurd {
            footprint,
            limit: ABSURD_BYTES,
        });
    }
    match available {
        Some(available) if footprint.total > available => Err(MemoryError::TooLarge {
            footprint,
            available,
        }),
        _ => Ok(footprint),
    }
}

/// The machine's available memory in bytes: `MemAvailable` of `/proc/meminfo` (Linux); `None`
/// where it cannot be read.
pub fn available_memory() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_meminfo(&text))
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes (the file gives kB); `None` if absent or
/// malformed.
pub fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line["MemAvailable:".len()..].split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => kib.checked_mul(1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::LossKind;
    use pipefill_kernels::Activation;

    fn spec(layers: usize, hidden: usize, outputs: usize, batch: usize) -> ModelSpec {
        ModelSpec::uniform(
            layers,
            hidden,
            outputs,
            Activation::Gelu,
            LossKind::Mse,
            batch,
        )
        .unwrap()
    }

    #[test]
    fn each_replica_holds_its_own_model_and_its_share_of_the_rows() {
        let s = spec(3, 4096, 16, 256);
        let one = s
            .footprint(&RunShape::training(256, 8, 2, Optimizer::adamw(1e-3)))
            .unwrap();
        // Two replicas of 128 rows each: twice the model, the same activations in all.
        let two = s
            .footprint(&RunShape::training(128, 8, 2, Optimizer::adamw(1e-3)).with_replicas(2))
            .unwrap();
        assert_eq!(two.weights, 2 * one.weights);
        assert_eq!(two.gradients, 2 * one.gradients);
        assert_eq!(two.optimizer, 2 * one.optimizer);
        assert_eq!(two.activations, one.activations);
        assert_eq!(two.threads, 2 * one.threads);
    }

    #[test]
    fn estimate_matches_a_hand_count() {
        // 3 layers, hidden 4096, outputs 16: two 4096x4096 gelu layers, one 4096x16 identity layer.
        // Parameters: 2 * (4096 * 4096 + 4096) + (4096 * 16 + 16) = 33_628_176.
        let s = spec(3, 4096, 16, 256);
        assert_eq!(s.parameters(), 33_628_176);
        let run = RunShape::training(256, 8, 2, Optimizer::adamw(1e-3));
        let f = s.footprint(&run).unwrap();
        assert_eq!(f.weights, 33_628_176 * 4);
        assert_eq!(f.gradients, 33_628_176 * 4);
        assert_eq!(f.optimizer, 2 * 33_628_176 * 4);
        // Per row: gelu layers keep X (4096) + Z and dZ (2 * 4096) = 12_288 each; the identity
        // layer X (4096) + dZ (16) = 4112. 256 rows in flight (8 microbatches of 32).
        assert_eq!(f.activations, 256 * (2 * 12_288 + 4112) * 4);
        // Inputs and targets 256 * (4096 + 16), teacher 32 * (4096 + 16).
        assert_eq!(f.data, (256 + 32) * (4096 + 16) * 4);
        assert_eq!(f.threads, 2 * (2 << 20));
        assert_eq!(f.layers, 3 * 1024);
        let sum =
            f.weights + f.gradients + f.optimizer + f.activations + f.data + f.threads + f.layers;
        assert_eq!(f.total, sum);
        assert_eq!(f.total, 576_361_728);
        // About 551 MiB: fits a machine with 1 GiB available, not one with 512 MiB.
        assert_eq!(check_memory(&s, &run, Some(1 << 30)), Ok(f));
        assert_eq!(check_memory(&s, &run, Some(f.total)), Ok(f));
        assert!(matches!(
            check_memory(&s, &run, Some(f.total - 1)),
            Err(MemoryError::TooLarge { available, .. }) if available == f.total - 1
        ));
    }

    #[test]
    fn bf16_activations_halve_the_activation_bytes_only() {
        let s = spec(3, 4096, 16, 256);
        let run = RunShape::training(256, 8, 2, Optimizer::adamw(1e-3));
        let f32_run = s.footprint(&run).unwrap();
        let bf16_run = s
            .footprint(&run.with_activation_dtype(ActivationDtype::Bf16))
            .unwrap();
        assert_eq!(bf16_run.activations, 256 * (2 * 12_288 + 4112) * 2);
        assert_eq!(bf16_run.activations * 2, f32_run.activations);
        assert_eq!(
            (bf16_run.weights, bf16_run.optimizer, bf16_run.data),
            (f32_run.weights, f32_run.optimizer, f32_run.data)
        );
        assert_eq!(
            bf16_run.total + bf16_run.activations,
            f32_run.total,
            "only the activations shrink"
        );
    }

    #[test]
    fn sgd_keeps_one_copy_and_profiling_none() {
        let s = spec(2, 10, 3, 8);
        // Parameters: 10 * 10 + 10 + 10 * 3 + 3 = 143.
        let sgd = s
            .footprint(&RunShape::training(8, 3, 1, Optimizer::sgd(0.1)))
            .unwrap();
        assert_eq!((sgd.weights, sgd.optimizer), (143 * 4, 143 * 4));
        // 8 rows in 3 microbatches: 3 rows each, 9 rows in flight; per row 10 + 20 + 10 + 3 = 43.
        assert_eq!(sgd.activations, 9 * 43 * 4);
        let p = s.footprint(&RunShape::profiling(8)).unwrap();
        assert_eq!((p.optimizer, p.activations), (0, 8 * 43 * 4));
        assert_eq!((p.data, p.threads), (8 * 13 * 4, 2 << 20));
    }

    #[test]
    fn absurd_sizes_are_refused_without_knowing_the_machine() {
        // hidden 1e8: each hidden layer has 1e16 weights, 4e16 bytes: far above 1 PiB.
        let s = spec(8, 100_000_000, 16, 256);
        let run = RunShape::training(256, 8, 2, Optimizer::adamw(1e-3));
        let e = check_memory(&s, &run, None).unwrap_err();
        let MemoryError::Absurd { footprint, limit } = e else {
            panic!("{e:?}")
        };
        assert_eq!(limit, ABSURD_BYTES);
        assert_eq!(
            footprint.weights,
            4 * (7 * (100_000_000u64 * 100_000_000 + 100_000_000) + 100_000_000 * 16 + 16)
        );
        let text = MemoryError::Absurd { footprint, limit }.to_string();
        assert!(text.contains("PiB"), "{text}");
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let s = spec(2, usize::MAX / 2, 2, 1);
        let e = s
            .footprint(&RunShape::training(1, 1, 1, Optimizer::sgd(0.1)))
            .unwrap_err();
        assert!(
            matches!(e, MemoryError::Overflow { part: "weights" }),
            "{e:?}"
        );
        let s = spec(2, 4, 2, usize::MAX);
        let e = s.footprint(&RunShape::profiling(usize::MAX)).unwrap_err();
        assert!(
            matches!(
                e,
                MemoryError::Overflow {
                    part: "activations"
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn layer_counts_are_checked_before_the_list_is_built() {
        // A billion layers: 1 TiB of bookkeeping, refused on a machine with 64 GiB available.
        let e = check_layer_count(1 << 30, Some(64 << 30)).unwrap_err();
        assert!(
            matches!(e, MemoryError::TooLarge { footprint, .. } if footprint.layers == 1 << 40)
        );
        assert_eq!(
            check_layer_count(1000, Some(64 << 30)).map(|f| f.total),
            Ok(1000 * 1024)
        );
        assert!(matches!(
            check_layer_count(usize::MAX, None),
            Err(MemoryError::Overflow { part: "layers" })
        ));
    }

    #[test]
    fn meminfo_is_parsed_in_kib() {
        let text = "MemTotal:       16384 kB\nMemFree:  100 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(parse_meminfo(text), Some(2048 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_meminfo("MemAvailable: x kB\n"), None);
        assert_eq!(parse_meminfo("MemAvailable: 5 MB\n"), None);
    }

    #[test]
    fn bytes_show_a_unit_and_the_exact_count() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(3 << 30).to_string(), "3.0 GiB (3221225472 B)");
    }
}
