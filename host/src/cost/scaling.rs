//! Scaling a layer's times to another microbatch size: the affine model `time(b) = fixed + per_row * b`.
//!
//! A cost file is measured at one microbatch size `b0`. Planning for a different `M` changes the
//! microbatch to `b = N / M` samples, so every time must be rescaled. Scaling linearly
//! (`time(b) = time(b0) * b / b0`) assumes a layer costs nothing at zero rows; real kernels do not:
//! each call has a fixed part (launch, thread start-up, packing the weights) and small matrices run
//! at lower GEMM efficiency. That makes the linear model badly optimistic for small microbatches.
//!
//! A layer may therefore carry a [`FixedCost`] (the cost file's optional per-layer `"fixed"` object,
//! which `pipefill profile` fits from two microbatch sizes): the part of each of `F`, `I`, `W` that does
//! not grow with the rows. With `t0` the time measured at `b0` and `f` its fixed part,
//!
//! ```text
//! time(b) = f + (t0 - f) * b / b0          (per_row = (t0 - f) / b0)
//! ```
//!
//! so `time(b0) = t0` always and `f = 0` is the linear model (what a layer without `"fixed"` gets).
//! The fused backward `B` scales with fixed part `min(f_I + f_W, B)`. Byte sizes always scale
//! linearly (activations and outputs are proportional to the rows; parameters do not change).

use serde::Serialize;

use super::check::Quantity;
use super::{CostError, LayerCost};

/// The per-call fixed part (seconds at zero rows) of a layer's `F`, `I` and `W`: each at least 0 and at
/// most the layer's time for that op at the measured microbatch size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FixedCost {
    /// Fixed part of `F`.
    pub forward: f64,
    /// Fixed part of `I`.
    pub backward_input: f64,
    /// Fixed part of `W`.
    pub backward_weight: f64,
}

impl FixedCost {
    /// Checks each part (finite, `>= 0`, at most the layer's measured time for that op), naming
    /// fields `{path}.fixed.forward` and so on.
    pub fn check(&self, path: &str, layer: &LayerCost) -> Result<(), CostError> {
        for (name, fixed, total) in [
            ("forward", self.forward, layer.forward),
            ("backward_input", self.backward_input, layer.backward_input),
            (
                "backward_weight",
                self.backward_weight,
                layer.backward_weight,
            ),
        ] {
            let field = format!("{path}.fixed.{name}");
            Quantity::Seconds.check(&field, fixed)?;
            if fixed > total {
                return Err(CostError::field(
                    field,
                    format!("is larger than the layer's {name} ({fixed} > {total})"),
                    format!(
                        "the fixed part is the share of {name} that does not grow with the rows: \
                         between 0 and {name}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `f + (t0 - f) * factor` (see the module docs).
fn affine(t0: f64, fixed: f64, factor: f64) -> f64 {
    fixed + (t0 - fixed) * factor
}

impl LayerCost {
    /// This layer at `factor = b / b0` times the measured microbatch size: times by the affine model
    /// when [`LayerCost::fixed`] is known (linearly otherwise), activation and output bytes linearly,
    /// parameter bytes unchanged.
    ///
    /// ```
    /// use pipefill_host::cost::{FixedCost, LayerCost};
    /// let mut l = LayerCost::new("a", 1.0, 2.0, 2.0);
    /// assert_eq!(l.scaled(0.25).forward, 0.25); // no fixed part: linear
    /// l.fixed = Some(FixedCost { forward: 0.6, backward_input: 0.0, backward_weight: 2.0 });
    /// let q = l.scaled(0.25);
    /// assert_eq!((q.forward, q.backward_input, q.backward_weight), (0.7, 0.5, 2.0));
    /// assert_eq!(q.backward, 2.5);
    /// ```
    pub fn scaled(&self, factor: f64) -> LayerCost {
        let f = self.fixed.unwrap_or(FixedCost {
            forward: 0.0,
            backward_input: 0.0,
            backward_weight: 0.0,
        });
        let fixed_backward = (f.backward_input + f.backward_weight).min(self.backward);
        LayerCost {
            name: self.name.clone(),
            forward: affine(self.forward, f.forward, factor),
            backward_input: affine(self.backward_input, f.backward_input, factor),
            backward_weight: affine(self.backward_weight, f.backward_weight, factor),
            backward: affine(self.backward, fixed_backward, factor),
            activation_bytes: self.activation_bytes * factor,
            released_at_input: self.released_at_input * factor,
            parameter_bytes: self.parameter_bytes,
            output_bytes: self.output_bytes * factor,
            // The fixed part is absolute: scaling the result again stays consistent.
            fixed: self.fixed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer() -> LayerCost {
        let mut l = LayerCost::new("a", 4.0, 6.0, 8.0);
        l.activation_bytes = 100.0;
        l.released_at_input = 40.0;
        l.parameter_bytes = 7.0;
        l.output_bytes = 20.0;
        l
    }

    #[test]
    fn without_fixed_part_scaling_is_linear() {
        let s = layer().scaled(0.5);
        assert_eq!(
            (s.forward, s.backward_input, s.backward_weight, s.backward),
            (2.0, 3.0, 4.0, 7.0)
        );
        assert_eq!((s.activation_bytes, s.released_at_input), (50.0, 20.0));
        assert_eq!((s.parameter_bytes, s.output_bytes), (7.0, 10.0));
    }

    #[test]
    fn affine_scaling_matches_fixed_plus_per_row() {
        let mut l = layer();
        l.fixed = Some(FixedCost {
            forward: 1.0,
            backward_input: 2.0,
            backward_weight: 0.5,
        });
        // Measured at b0 = 8 rows: per_row F = (4 - 1) / 8. At b = 2 rows, factor 1/4.
        let s = l.scaled(0.25);
        let per_row = |t: f64, f: f64| (t - f) / 8.0;
        let want = |t: f64, f: f64| f + per_row(t, f) * 2.0;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12;
        assert!(close(s.forward, want(4.0, 1.0)));
        assert!(close(s.backward_input, want(6.0, 2.0)));
        assert!(close(s.backward_weight, want(8.0, 0.5)));
        assert!(close(s.backward, want(14.0, 2.5)));
        // Factor 1 gives back the measured times; memory stays linear.
        assert_eq!(l.scaled(1.0).forward, 4.0);
        assert_eq!(s.activation_bytes, 25.0);
        // Smaller microbatches cost more than linear, never less.
        assert!(s.forward > layer().scaled(0.25).forward);
    }

    #[test]
    fn fixed_part_is_checked_against_the_time() {
        let l = layer();
        let bad = FixedCost {
            forward: 5.0,
            backward_input: 0.0,
            backward_weight: 0.0,
        };
        let e = bad.check("layers[2]", &l).unwrap_err().to_string();
        assert!(
            e.contains("layers[2].fixed.forward") && e.contains("larger"),
            "{e}"
        );
        let nan = FixedCost {
            backward_weight: f64::NAN,
            ..bad
        };
        let e = FixedCost {
            forward: 0.0,
            ..nan
        }
        .check("layers[0]", &l)
        .unwrap_err()
        .to_string();
        assert!(e.contains("layers[0].fixed.backward_weight"), "{e}");
    }
}
