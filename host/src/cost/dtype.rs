//! The storage type of activations, as a cost file records it: `meta.activation_dtype`, `"f32"` (the
//! default when absent) or `"bf16"` (activations stored as BF16 by the tensor-core kernels: half the bytes
//! held and sent).
//!
//! A cost file's `activation_bytes`, `released_at_input` and `output_bytes` are in that type;
//! `parameter_bytes` are always `f32` (the weights the optimizer updates). [`CostFile::with_activation_dtype`]
//! rescales a file's activation sizes to another type (the math may stay `f32`: only storage changes).
//!
//! ```
//! use pipefill_host::cost::{ActivationDtype, CostFile};
//! let f = CostFile::parse(r#"{"layers": [{"name": "a", "forward": 1, "backward": 2,
//!     "activation_bytes": 64, "output_bytes": 16, "parameter_bytes": 8}]}"#).unwrap();
//! assert_eq!(f.activation_dtype(), ActivationDtype::F32);
//! let half = f.with_activation_dtype(ActivationDtype::Bf16);
//! assert_eq!((half.layers[0].activation_bytes, half.layers[0].output_bytes), (32.0, 8.0));
//! assert_eq!(half.layers[0].parameter_bytes, 8.0);
//! assert_eq!(CostFile::parse(&half.to_json()).unwrap().activation_dtype(), ActivationDtype::Bf16);
//! ```

use std::fmt;

use serde_json::Value;

use super::{CostError, CostFile};

/// The key under `meta` that holds the activation type.
pub const META_KEY: &str = "activation_dtype";

/// How activations (layer inputs, pre-activations, gradients of activations) are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ActivationDtype {
    /// 4 bytes per value.
    #[default]
    F32,
    /// 2 bytes per value (BF16: `f32` range, 8-bit mantissa).
    Bf16,
}

impl ActivationDtype {
    /// Every type, for listing in messages.
    pub const ALL: [ActivationDtype; 2] = [ActivationDtype::F32, ActivationDtype::Bf16];

    /// Bytes per value.
    pub const fn bytes(self) -> u64 {
        match self {
            ActivationDtype::F32 => 4,
            ActivationDtype::Bf16 => 2,
        }
    }

    /// The name in cost files and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            ActivationDtype::F32 => "f32",
            ActivationDtype::Bf16 => "bf16",
        }
    }

    /// The type named `text` (`"f32"` or `"bf16"`).
    pub fn from_name(text: &str) -> Option<ActivationDtype> {
        Self::ALL.into_iter().find(|d| d.name() == text)
    }
}

impl fmt::Display for ActivationDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Checks `meta.activation_dtype` when present (a string naming a type).
pub(crate) fn check_meta(meta: &Value) -> Result<(), CostError> {
    match meta.get(META_KEY) {
        None => Ok(()),
        Some(Value::String(s)) if ActivationDtype::from_name(s).is_some() => Ok(()),
        Some(other) => Err(CostError::field(
            format!("meta.{META_KEY}"),
            format!("is {other}"),
            "write \"f32\" or \"bf16\" (the type the activation byte counts are in), or leave it out for f32",
        )),
    }
}

impl CostFile {
    /// The type this file's activation sizes are in (`meta.activation_dtype`; `f32` when absent).
    pub fn activation_dtype(&self) -> ActivationDtype {
        self.meta
            .get(META_KEY)
            .and_then(Value::as_str)
            .and_then(ActivationDtype::from_name)
            .unwrap_or_default()
    }

    /// The same costs with activations stored as `dtype`: `activation_bytes`, `released_at_input`,
    /// `selective_bytes` and `output_bytes` of every layer scaled by the ratio of the two types'
    /// sizes, and `meta` recording `dtype`. Times are kept (measure again to see the kernels' own
    /// speed in that type, and whether a layer still rebuilds a selective part in it: the built-in
    /// layers do so in `f32` only, and `profile --activations bf16` writes no selective part).
    pub fn with_activation_dtype(mut self, dtype: ActivationDtype) -> CostFile {
        let ratio = dtype.bytes() as f64 / self.activation_dtype().bytes() as f64;
        for layer in &mut self.layers {
            layer.activation_bytes *= ratio;
            layer.released_at_input *= ratio;
            layer.selective_bytes *= ratio;
            layer.output_bytes *= ratio;
        }
        if !self.meta.is_object() {
            self.meta = Value::Object(serde_json::Map::new());
        }
        if let Some(m) = self.meta.as_object_mut() {
            m.insert(META_KEY.into(), Value::String(dtype.name().into()));
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = r#"{"layers": [{"name": "a", "forward": 1, "backward": 2,
        "activation_bytes": 40, "released_at_input": 8, "output_bytes": 12, "parameter_bytes": 4,
        "selective_bytes": 16, "selective_time": 0.5}]"#;

    #[test]
    fn absent_means_f32_and_a_bad_name_is_refused_by_path() {
        let f = CostFile::parse(&format!("{ONE}}}")).unwrap();
        assert_eq!(f.activation_dtype(), ActivationDtype::F32);
        let e = CostFile::parse(&format!(
            "{ONE}, \"meta\": {{\"activation_dtype\": \"fp8\"}}}}"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("meta.activation_dtype") && e.contains("bf16"),
            "{e}"
        );
        let e = CostFile::parse(&format!("{ONE}, \"meta\": {{\"activation_dtype\": 2}}}}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("meta.activation_dtype"), "{e}");
    }

    #[test]
    fn rescaling_halves_and_restores_the_activation_bytes_only() {
        let f = CostFile::parse(&format!("{ONE}, \"meta\": \"a note\"}}")).unwrap();
        let half = f.clone().with_activation_dtype(ActivationDtype::Bf16);
        let l = &half.layers[0];
        assert_eq!(
            (
                l.activation_bytes,
                l.released_at_input,
                l.output_bytes,
                l.parameter_bytes,
                l.selective_bytes
            ),
            (20.0, 4.0, 6.0, 4.0, 8.0)
        );
        assert_eq!((l.forward, l.backward), (1.0, 2.0));
        let back = half.with_activation_dtype(ActivationDtype::F32);
        assert_eq!(back.layers, f.layers);
        assert_eq!(back.activation_dtype(), ActivationDtype::F32);
    }
}
