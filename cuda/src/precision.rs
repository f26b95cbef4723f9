//! [`Precision`]: which kernels the device layers run their three products with.

use std::fmt;
use std::str::FromStr;

use pipefill_kernels::tc;

/// The arithmetic of a device layer's GEMMs (`X W`, `dZ W^T`, `X^T dZ`); accumulation is `f32` in all.
///
/// Parameters, gradients and optimizer state stay `f32` in every precision. With [`Precision::Bf16`] a
/// layer's GEMM operands are BF16 (weights rounded once per optimizer step, into a BF16 copy). How the
/// activations are *stored* is a separate choice, `--activations`
/// ([`LinearStage::activations`](pipefill_model::layers::LinearStage::activations)): with `f32` storage a BF16
/// layer rounds its `f32` operands with a conversion kernel just before each product and widens the
/// BF16 results back (exactly) after it; with BF16 storage the stash and the tensors between layers are
/// BF16 buffers, which the BF16 kernels read and write as they are (no conversion, half the memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Tensor cores with TF32 inputs (10-bit mantissa, rounded in the kernel), `f32` buffers (default).
    #[default]
    Tf32,
    /// Exact `f32` on the SIMT cores (the tiled SIMT kernels).
    Fp32,
    /// Tensor cores with BF16 inputs (8-bit mantissa).
    Bf16,
}

impl Precision {
    /// Every precision, the default first.
    pub const ALL: [Precision; 3] = [Precision::Tf32, Precision::Fp32, Precision::Bf16];

    /// The tensor-core kernels' precision, `None` for the SIMT `f32` kernels.
    pub fn tensor_core(self) -> Option<tc::Precision> {
        match self {
            Precision::Tf32 => Some(tc::Precision::Tf32),
            Precision::Fp32 => None,
            Precision::Bf16 => Some(tc::Precision::Bf16),
        }
    }

    /// The name used in flags and files: `tf32`, `fp32`, `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Tf32 => "tf32",
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A precision name that is not one of `tf32`, `fp32`, `bf16`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision `{given}`: expected tf32, fp32 or bf16")]
pub struct UnknownPrecision {
    /// What was given.
    pub given: String,
}

impl FromStr for Precision {
    type Err = UnknownPrecision;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownPrecision {
                given: s.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::Precision;

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>(), Ok(p));
        }
        assert_eq!(Precision::default(), Precision::Tf32);
        let e = "fp16".parse::<Precision>().unwrap_err();
        assert_eq!(e.given, "fp16");
        assert_eq!(Precision::Fp32.tensor_core(), None);
    }
}
