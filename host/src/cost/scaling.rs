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
//!
//! Two points fix a line, but a CPU layer's time is not a line in the rows: small microbatches run at
//! lower GEMM efficiency, large ones fall out of the caches. Extrapolated far beyond the two sizes it
//! was fitted at, the affine model was measured 1.7-1.9x optimistic (docs/measurements.md, "Partition and plan").
//! A layer may therefore also carry [`SizeSample`]s: its times measured at other microbatch sizes
//! (`pipefill profile --sizes`; the cost file's per-layer `"samples"`, each at `scale = b / b0`).
//! With samples, times are **interpolated** piecewise linearly in `b` between the measured sizes
//! (the main measurement is the sample at scale 1). Outside them: below the smallest, the line
//! through the two smallest, kept between 0 and the smallest's time; above the largest, the line
//! through the two largest, at least proportional growth from the largest
//! (`time(largest) * b / b_largest`, which a GEMM that is already compute-bound follows).

use serde::Serialize;

use super::check::Quantity;
use super::{CostError, LayerCost};

/// A layer's times measured at another microbatch size: `scale` times the size its main times were
/// measured at (cost file: an entry of a layer's `"samples"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SizeSample {
    /// The microbatch size as a multiple of the layer's measured size `b0` (`b / b0`); positive,
    /// not 1 (scale 1 is the layer's own times).
    pub scale: f64,
    /// `F` at this size.
    pub forward: f64,
    /// `I` at this size.
    pub backward_input: f64,
    /// `W` at this size.
    pub backward_weight: f64,
    /// `B` at this size.
    pub backward: f64,
}

impl SizeSample {
    fn times(&self) -> [f64; 4] {
        [
            self.forward,
            self.backward_input,
            self.backward_weight,
            self.backward,
        ]
    }
}

/// Checks a layer's samples: every time a valid duration, every scale positive, finite, not 1, and
/// no scale twice; fields named `{path}.samples[j].scale` and so on.
pub(super) fn check_samples(path: &str, samples: &[SizeSample]) -> Result<(), CostError> {
    for (j, s) in samples.iter().enumerate() {
        let at = format!("{path}.samples[{j}]");
        for (name, v) in [
            ("forward", s.forward),
            ("backward_input", s.backward_input),
            ("backward_weight", s.backward_weight),
            ("backward", s.backward),
        ] {
            Quantity::Seconds.check(&format!("{at}.{name}"), v)?;
        }
        Quantity::Scale.check(&format!("{at}.scale"), s.scale)?;
        if s.scale == 1.0 {
            return Err(CostError::field(
                format!("{at}.scale"),
                "is 1, the size of the layer's own times",
                "remove this sample (the layer's forward, backward_input, ... are the times at \
                 scale 1)",
            ));
        }
        if let Some(k) = samples[..j].iter().position(|o| o.scale == s.scale) {
            return Err(CostError::field(
                format!("{at}.scale"),
                format!("repeats samples[{k}].scale ({})", s.scale),
                "give each microbatch size once",
            ));
        }
    }
    Ok(())
}

/// Piecewise-linear interpolation of `points` (sorted by scale, at least two) at `x`, with the
/// extrapolation rules of the module docs, for time index `t`.
fn interpolate(points: &[(f64, [f64; 4])], x: f64, t: usize) -> f64 {
    let n = points.len();
    let line = |a: usize, b: usize| {
        let ((xa, ya), (xb, yb)) = ((points[a].0, points[a].1[t]), (points[b].0, points[b].1[t]));
        ya + (yb - ya) * (x - xa) / (xb - xa)
    };
    let (first, last) = (points[0], points[n - 1]);
    if x <= first.0 {
        line(0, 1).clamp(0.0, first.1[t])
    } else if x >= last.0 {
        line(n - 2, n - 1).max(last.1[t] * x / last.0)
    } else {
        let i = points.partition_point(|p| p.0 <= x);
        line(i - 1, i)
    }
}

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
        if !self.samples.is_empty() {
            return self.interpolated(factor);
        }
        let f = self.fixed.unwrap_or(FixedCost {
            forward: 0.0,
            backward_input: 0.0,
            backward_weight: 0.0,
        });
        let fixed_backward = (f.backward_input + f.backward_weight).min(self.backward);
        let times = [
            affine(self.forward, f.forward, factor),
            affine(self.backward_input, f.backward_input, factor),
            affine(self.backward_weight, f.backward_weight, factor),
            affine(self.backward, fixed_backward, factor),
        ];
        // The fixed part is absolute: scaling the result again stays consistent.
        self.with_times(times, factor, self.fixed)
    }

    /// This layer with `times` (F, I, W, B), its per-sample bytes (and selective part) scaled by
    /// `factor`, fixed part `fixed`, and no samples.
    fn with_times(&self, times: [f64; 4], factor: f64, fixed: Option<FixedCost>) -> LayerCost {
        let [forward, backward_input, backward_weight, backward] = times;
        LayerCost {
            name: self.name.clone(),
            forward,
            backward_input,
            backward_weight,
            backward,
            activation_bytes: self.activation_bytes * factor,
            released_at_input: self.released_at_input * factor,
            parameter_bytes: self.parameter_bytes,
            output_bytes: self.output_bytes * factor,
            selective_bytes: self.selective_bytes * factor,
            selective_time: self.selective_time * factor,
            fixed,
            samples: Vec::new(),
        }
    }

    /// [`LayerCost::scaled`] for a layer with [`SizeSample`]s: times interpolated between the samples
    /// and the layer's own times (scale 1), bytes scaled linearly. The result carries no samples or
    /// fixed part (they describe sizes relative to this layer's, not to the result's).
    fn interpolated(&self, factor: f64) -> LayerCost {
        let own = SizeSample {
            scale: 1.0,
            forward: self.forward,
            backward_input: self.backward_input,
            backward_weight: self.backward_weight,
            backward: self.backward,
        };
        let mut points: Vec<(f64, [f64; 4])> = std::iter::once(own)
            .chain(self.samples.iter().copied())
            .map(|s| (s.scale, s.times()))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let at = |t: usize| interpolate(&points, factor, t);
        self.with_times([at(0), at(1), at(2), at(3)], factor, None)
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

    fn sample(scale: f64, t: f64) -> SizeSample {
        SizeSample {
            scale,
            forward: t,
            backward_input: 2.0 * t,
            backward_weight: 3.0 * t,
            backward: 5.0 * t,
        }
    }

    /// A layer measured at b0 (time 4 for F) and at 1/4 (time 2) and 4x (time 20) of it.
    fn sampled() -> LayerCost {
        let mut l = LayerCost::new("s", 4.0, 8.0, 12.0);
        l.backward = 20.0;
        l.activation_bytes = 100.0;
        l.fixed = Some(FixedCost {
            forward: 3.9,
            backward_input: 0.0,
            backward_weight: 0.0,
        });
        // Out of order on purpose: the file need not sort them.
        l.samples = vec![sample(4.0, 20.0), sample(0.25, 2.0)];
        l
    }

    #[test]
    fn samples_are_hit_exactly_and_interpolated_between() {
        let l = sampled();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
        for (x, f) in [(0.25, 2.0), (1.0, 4.0), (4.0, 20.0)] {
            let s = l.scaled(x);
            assert!(close(s.forward, f), "F at {x}: {}", s.forward);
            assert!(close(s.backward_input, 2.0 * f) || x == 1.0);
            assert!(close(s.backward, 5.0 * f) || x == 1.0);
        }
        // Between 1 (4) and 4 (20): at 2.5 halfway, 12. Between 0.25 (2) and 1 (4): at 0.625, 3.
        assert!(close(l.scaled(2.5).forward, 12.0));
        assert!(close(l.scaled(0.625).forward, 3.0));
        // The samples win over the fixed part (which alone would give 3.9 + 0.1 * 2.5).
        assert!(l.scaled(2.5).forward > 4.0);
        // Bytes stay linear; the result carries no samples.
        assert_eq!(l.scaled(2.0).activation_bytes, 200.0);
        assert!(l.scaled(2.0).samples.is_empty());
    }

    #[test]
    fn outside_the_samples_the_nearest_two_extrapolate_with_floors() {
        let l = sampled();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
        // Above: the line through (1, 4) and (4, 20) has slope 16/3; at 8: 20 + 4 * 16/3.
        assert!(close(l.scaled(8.0).forward, 20.0 + 4.0 * 16.0 / 3.0));
        // Below: the line through (0.25, 2) and (1, 4) at 0.125 is 1.666..; at 0 it would be 1.33,
        // and it never goes below 0 or above the smallest sample's time.
        assert!(close(l.scaled(0.125).forward, 2.0 - 0.125 * 8.0 / 3.0));
        let mut flat = l.clone();
        flat.samples = vec![sample(0.25, 5.0), sample(4.0, 3.0)];
        // A time that fell with more rows (noise): below the smallest stays at most its time, above
        // the largest grows at least proportionally.
        assert!(flat.scaled(0.1).forward <= 5.0);
        assert!(close(flat.scaled(8.0).forward, 3.0 * 2.0));
    }

    #[test]
    fn samples_are_checked() {
        let mut l = sampled();
        l.check("layers[1]").unwrap();
        l.samples.push(sample(1.0, 4.0));
        let e = l.check("layers[1]").unwrap_err().to_string();
        assert!(
            e.contains("layers[1].samples[2].scale") && e.contains("is 1"),
            "{e}"
        );
        l.samples[2] = sample(4.0, 1.0);
        let e = l.check("layers[1]").unwrap_err().to_string();
        assert!(
            e.contains("samples[2].scale") && e.contains("repeats samples[0]"),
            "{e}"
        );
        l.samples[2] = sample(-2.0, 1.0);
        assert!(l
            .check("x")
            .unwrap_err()
            .to_string()
            .contains("x.samples[2].scale"));
        l.samples[2] = SizeSample {
            backward_weight: f64::NAN,
            ..sample(2.0, 1.0)
        };
        let e = l.check("x").unwrap_err().to_string();
        assert!(e.contains("x.samples[2].backward_weight"), "{e}");
    }
}
