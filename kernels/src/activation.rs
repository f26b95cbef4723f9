//! The activation functions a linear layer can fuse into its epilogue, with their derivatives.

#[cfg(not(target_arch = "nvptx64"))]
use core::fmt;
#[cfg(not(target_arch = "nvptx64"))]
use core::str::FromStr;

use crate::math::sigmoid_pair;

/// `sqrt(2/pi)`, the scale inside the tanh form of GELU.
const GELU_K: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh form of GELU.
const GELU_C: f32 = 0.044_715;

/// An elementwise activation `y = act(z)`, fused into the linear layer's epilogue on both the CPU and the GPU.
///
/// The forward pass keeps the pre-activation `z` (when backward needs it) and the backward pass multiplies the
/// incoming gradient by [`Activation::derivative`] at `z`: `dZ = dY * act'(Z)`.
///
/// | variant | `act(z)` | `act'(z)` |
/// | --- | --- | --- |
/// | `Identity` | `z` | `1` |
/// | `Relu` | `max(z, 0)` (NaN stays NaN) | `1` if `z > 0`, else `0` (also at `0`, as PyTorch) |
/// | `Gelu` | `z/2 (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))` | its exact derivative |
/// | `Silu` | `z sigmoid(z)` | `s (1 + z (1 - s))`, `s = sigmoid(z)` |
///
/// GELU is the tanh approximation (PyTorch's `approximate="tanh"`). It is evaluated through the identity
/// `(1 + tanh(u))/2 = sigmoid(2u)`, which is exact in real arithmetic and avoids the cancellation of
/// `1 + tanh(u)` for very negative `z`.
///
/// The `u32` code ([`Activation::code`]) is what the GPU entry points take as their activation argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum Activation {
    /// `y = z`.
    #[default]
    Identity = 0,
    /// `y = max(z, 0)`.
    Relu = 1,
    /// GELU, tanh form.
    Gelu = 2,
    /// SiLU (swish): `y = z sigmoid(z)`.
    Silu = 3,
}

impl Activation {
    /// Every activation, in code order.
    pub const ALL: [Activation; 4] = [
        Activation::Identity,
        Activation::Relu,
        Activation::Gelu,
        Activation::Silu,
    ];

    /// The stable numeric code passed to the GPU kernels (`0..=3`).
    #[inline]
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The activation with this code, or `None` for an unknown code.
    #[inline]
    pub const fn from_code(code: u32) -> Option<Activation> {
        match code {
            0 => Some(Activation::Identity),
            1 => Some(Activation::Relu),
            2 => Some(Activation::Gelu),
            3 => Some(Activation::Silu),
            _ => None,
        }
    }

    /// The lower-case name used on the command line and in model files: `identity`, `relu`, `gelu`, `silu`.
    pub const fn name(self) -> &'static str {
        match self {
            Activation::Identity => "identity",
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::Silu => "silu",
        }
    }

    /// `act(z)`.
    #[inline]
    pub fn forward(self, z: f32) -> f32 {
        match self {
            Activation::Identity => z,
            Activation::Relu => {
                if z < 0.0 {
                    0.0
                } else {
                    z
                }
            }
            Activation::Gelu => z * sigmoid_pair(2.0 * gelu_inner(z)).0,
            Activation::Silu => z * sigmoid_pair(z).0,
        }
    }

    /// `act'(z)`, the derivative at the pre-activation `z`.
    #[inline]
    pub fn derivative(self, z: f32) -> f32 {
        match self {
            Activation::Identity => 1.0,
            Activation::Relu => {
                if z > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            Activation::Gelu => {
                // y = z s(2u), u = K (z + C z^3):  y' = s + z s (1 - s) 2 K (1 + 3 C z^2).
                let (s, one_minus_s) = sigmoid_pair(2.0 * gelu_inner(z));
                let du = GELU_K * (1.0 + 3.0 * GELU_C * z * z);
                s + z * s * one_minus_s * 2.0 * du
            }
            Activation::Silu => {
                let (s, one_minus_s) = sigmoid_pair(z);
                s * (1.0 + z * one_minus_s)
            }
        }
    }
}

/// `u = sqrt(2/pi) (z + 0.044715 z^3)`, the argument of tanh in GELU.
#[inline]
fn gelu_inner(z: f32) -> f32 {
    GELU_K * (z + GELU_C * z * z * z)
}

#[cfg(not(target_arch = "nvptx64"))]
impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(not(target_arch = "nvptx64"))]
/// The error of parsing an [`Activation`] from an unknown name; its message lists the valid names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownActivation;

#[cfg(not(target_arch = "nvptx64"))]
impl fmt::Display for UnknownActivation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown activation: expected one of identity, relu, gelu, silu")
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl core::error::Error for UnknownActivation {}

#[cfg(not(target_arch = "nvptx64"))]
impl FromStr for Activation {
    type Err = UnknownActivation;

    /// Parses a name as printed by [`Activation::name`] (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Activation::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(s))
            .ok_or(UnknownActivation)
    }
}
