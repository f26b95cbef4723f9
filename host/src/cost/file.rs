//! The cost file: per-layer (or per-stage) costs in JSON, every field checked.
//!
//! ```json
//! {
//!   "layers": [
//!     {"name": "embed", "forward": 0.0012, "backward_input": 0.0011, "backward_weight": 0.0013,
//!      "activation_bytes": 4194304, "parameter_bytes": 65536000, "output_bytes": 1048576},
//!     {"name": "block0", "forward": 0.002, "backward": 0.004,
//!      "activation_bytes": 8388608, "parameter_bytes": 12582912}
//!   ],
//!   "transfer": {"latency": 0.00002, "bandwidth": 2.5e10},
//!   "overlap_share": 0.1,
//!   "meta": {"backend": "cpu"}
//! }
//! ```
//!
//! Per entry (times in seconds, sizes in bytes, all finite and `>= 0`):
//!
//! | key | required | meaning |
//! | --- | --- | --- |
//! | `name` | yes for `layers`, optional for `stages` | a label |
//! | `forward` | yes | F |
//! | `backward_input`, `backward_weight`, `backward` | see below | I, W, B |
//! | `activation_bytes` | yes | held per microbatch from F until W/B ends |
//! | `parameter_bytes` | yes | weights (and anything else held for the whole step) |
//! | `released_at_input` | no (0) | part of `activation_bytes` freed when I ends |
//! | `output_bytes` | no (0) | the output per microbatch (crosses the boundary after this layer) |
//! | `recompute` | no (`"none"`), `stages` only | `"none"`, `"full"` or `"selective"`: full recomputation keeps only the stage's input from F to its backward and runs F again before I/B; selective drops `selective_bytes` after F and rebuilds them before I/B in `selective_time` (only for a stage with `selective_bytes > 0`) (module [`recompute`](super::recompute)) |
//! | `selective_bytes`, `selective_time` | no (0) | the part of the stash the stage (or, for `layers`, the layer, counted where the layer before it is in the same stage) can drop after F and rebuild cheaply before I/B, and the rebuild's time; at most `activation_bytes` |
//! | `input_bytes` | no, `stages` only | the stage's input per microbatch (what `full` keeps); default: the previous stage's `output_bytes` (0 for the first) |
//! | `fixed` | no, `layers` only | `{"forward": s, "backward_input": s, "backward_weight": s}`: the part of each time that does not grow with the microbatch size (all three required, each at most the op's time) |
//! | `samples` | no, `layers` only | `[{"scale": b / b0, "forward": s, "backward_input": s, "backward_weight": s, "backward": s}, ...]`: the layer's times measured at other microbatch sizes (`backward` optional, default `I + W`; scales positive, distinct, not 1) |
//!
//! `fixed` makes `plan` scale times to other microbatch sizes by the affine model
//! `time(b) = fixed + (time - fixed) * b / b0` instead of linearly (module
//! [`scaling`](super::scaling)); `pipefill profile` fits it from two microbatch sizes. Without it, times
//! scale linearly, as before. `samples` (written by `pipefill profile --sizes`) take precedence: times
//! are then interpolated between the measured sizes.
//!
//! Backward: `backward_input` and `backward_weight`, or `backward` alone (then `I = W = B/2`), or
//! `backward` with one of the two (see [`super::resolve_backward`]).
//!
//! Top level: `layers` (or, instead, `stages`: one entry per stage, already partitioned); `transfer`
//! (optional, default free: `latency` in seconds and `bandwidth` in bytes per second, both required
//! when `transfer` is given; `"bandwidth": null` means unlimited); `overlap_share` (optional, default 0,
//! in `0..=1`: the part of the shorter half of an overlapped F/B pair that does not overlap); `meta`
//! (optional, anything: where and how the costs were measured; its `activation_dtype`, when present, must
//! be `"f32"` or `"bf16"` and says what type the activation byte counts are in, see [`super::dtype`]).
//! Any other key is refused, so a
//! misspelled field (`foward`) is an error rather than silently missing.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::check::{Fields, Quantity};
use super::{
    resolve_backward, CostError, CostModel, FixedCost, LayerCost, LinkCost, Recompute, SizeSample,
    StageCost,
};

/// The keys an entry (layer or stage) may have.
const ENTRY_KEYS: &[&str] = &[
    "name",
    "forward",
    "backward_input",
    "backward_weight",
    "backward",
    "activation_bytes",
    "released_at_input",
    "parameter_bytes",
    "output_bytes",
    "fixed",
    "samples",
    "input_bytes",
    "recompute",
    "selective_bytes",
    "selective_time",
];

/// The keys the top level may have.
const TOP_KEYS: &[&str] = &["layers", "stages", "transfer", "overlap_share", "meta"];

/// A per-layer cost file: what `pipefill profile` writes and `partition`, `plan` and `simulate` read.
///
/// ```
/// use pipefill_host::cost::CostFile;
/// let f = CostFile::parse(r#"{"layers": [
///     {"name": "a", "forward": 1, "backward": 2, "activation_bytes": 0, "parameter_bytes": 0}],
///     "transfer": {"latency": 0.5, "bandwidth": null}}"#).unwrap();
/// assert_eq!(f.layers[0].backward_input, 1.0);
/// assert_eq!(f.transfer.bandwidth, f64::INFINITY);
/// let e = CostFile::parse(r#"{"layers": [{"name": "a", "forward": -1}]}"#).unwrap_err();
/// assert!(e.to_string().contains("layers[0].forward"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostFile {
    /// The layers, in model order.
    pub layers: Vec<LayerCost>,
    /// The link between ranks.
    pub transfer: LinkCost,
    /// Non-overlapped share of an overlapped F/B pair.
    pub overlap_share: f64,
    /// Free-form description of where the costs come from (kept, not interpreted).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub meta: Value,
}

/// What a cost file holds: per-layer costs (to be partitioned) or per-stage costs (ready to simulate).
#[derive(Debug, Clone, PartialEq)]
pub enum CostInput {
    /// `"layers": [...]`.
    Layers(CostFile),
    /// `"stages": [...]`: one cost per stage, in stage order.
    Stages(CostModel),
}

impl CostFile {
    /// Parses and checks a per-layer cost file (`"layers"` required).
    pub fn parse(text: &str) -> Result<CostFile, CostError> {
        match CostInput::parse(text)? {
            CostInput::Layers(f) => Ok(f),
            CostInput::Stages(_) => Err(CostError::field(
                "stages",
                "this command needs per-layer costs",
                "write the costs under \"layers\" (one entry per layer) instead of \"stages\"",
            )),
        }
    }

    /// Reads and checks a per-layer cost file from disk.
    pub fn load(path: &Path) -> Result<CostFile, CostError> {
        CostFile::parse(&read(path)?)
    }

    /// The file as pretty JSON (the schema [`CostFile::parse`] reads; unlimited bandwidth as `null`).
    pub fn to_json(&self) -> String {
        // Serialising plain numbers, strings and a `Value` cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

impl CostInput {
    /// Parses and checks a cost file with either `"layers"` or `"stages"`.
    pub fn parse(text: &str) -> Result<CostInput, CostError> {
        let text = crate::input::without_bom(text);
        if let Err((line, column, key)) = crate::input::duplicate_key(text) {
            return Err(CostError::Syntax {
                line,
                column,
                reason: format!(
                    "the key `{}` appears twice in one object (JSON keeps only the last); keep one",
                    crate::input::excerpt(&key)
                ),
            });
        }
        let root: Value = serde_json::from_str(text).map_err(|e| CostError::Syntax {
            line: e.line(),
            column: e.column(),
            reason: crate::input::json_reason(&e),
        })?;
        let top = Fields::object(&root, "", "a JSON object with \"layers\" and \"transfer\"")?;
        top.only(TOP_KEYS)?;
        let transfer = parse_transfer(&top)?;
        let overlap_share = top.number("overlap_share", Quantity::Share)?.unwrap_or(0.0);
        match (top.has("layers"), top.has("stages")) {
            (true, true) => Err(CostError::field(
                "stages",
                "is given together with \"layers\"",
                "give either per-layer costs (\"layers\") or per-stage costs (\"stages\"), not both",
            )),
            (false, true) => {
                let entries = top.array("stages", "one object per stage")?;
                let mut stages = entries
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let path = format!("stages[{i}]");
                        let (_, s) = parse_entry(v, &path, false)?;
                        refuse_fixed(v, &path)?;
                        refuse_samples(v, &path)?;
                        Ok(s)
                    })
                    .collect::<Result<Vec<_>, CostError>>()?;
                // A stage's input is, unless given, what the stage before it sends.
                for i in 1..stages.len() {
                    if entries[i].get("input_bytes").is_none() {
                        stages[i].input_bytes = stages[i - 1].output_bytes;
                    }
                }
                Ok(CostInput::Stages(CostModel {
                    stages,
                    link: transfer,
                    overlap_share,
                }))
            }
            _ => {
                let entries = top.array("layers", "one object per layer, in model order")?;
                let layers = entries
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let path = format!("layers[{i}]");
                        refuse_per_stage(v, &path)?;
                        let (name, s) = parse_entry(v, &path, true)?;
                        let mut layer = layer_from(name.unwrap_or_default(), &s);
                        layer.fixed = parse_fixed(v, &path)?;
                        layer.samples = parse_samples(v, &path)?;
                        layer.check(&path)?;
                        Ok(layer)
                    })
                    .collect::<Result<Vec<_>, CostError>>()?;
                let meta = top.get("meta").cloned().unwrap_or(Value::Null);
                super::dtype::check_meta(&meta)?;
                Ok(CostInput::Layers(CostFile {
                    layers,
                    transfer,
                    overlap_share,
                    meta,
                }))
            }
        }
    }

    /// Reads and checks a cost file from disk.
    pub fn load(path: &Path) -> Result<CostInput, CostError> {
        CostInput::parse(&read(path)?)
    }
}

/// Reads a file to a string, naming the path in the error.
fn read(path: &Path) -> Result<String, CostError> {
    std::fs::read_to_string(path).map_err(|e| CostError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// `transfer`: absent means free; present needs `latency` and `bandwidth` (null = unlimited).
fn parse_transfer(top: &Fields<'_>) -> Result<LinkCost, CostError> {
    let Some(v) = top.get("transfer") else {
        return Ok(LinkCost::default());
    };
    let t = Fields::object(
        v,
        "transfer",
        "an object {\"latency\": seconds, \"bandwidth\": bytes per second}",
    )?;
    t.only(&["latency", "bandwidth"])?;
    let latency = t.required("latency", Quantity::Seconds)?;
    let bandwidth = match t.get("bandwidth") {
        Some(Value::Null) => f64::INFINITY,
        _ => t.required("bandwidth", Quantity::BytesPerSecond)?,
    };
    Ok(LinkCost { latency, bandwidth })
}

/// One layer or stage entry; `name` is required when `need_name`.
fn parse_entry(
    v: &Value,
    path: &str,
    need_name: bool,
) -> Result<(Option<String>, StageCost), CostError> {
    let e = Fields::object(
        v,
        path,
        "an object with name, forward, backward_input, backward_weight, activation_bytes, parameter_bytes",
    )?;
    e.only(ENTRY_KEYS)?;
    let name = e.string("name")?;
    if need_name && name.is_none() {
        return Err(CostError::field(
            e.path_of("name"),
            "is missing",
            "add \"name\": a label for the layer, e.g. \"block3\"",
        ));
    }
    let forward = e.required("forward", Quantity::Seconds)?;
    let (backward_input, backward_weight, backward) = resolve_backward(
        path,
        e.number("backward_input", Quantity::Seconds)?,
        e.number("backward_weight", Quantity::Seconds)?,
        e.number("backward", Quantity::Seconds)?,
    )?;
    let stage = StageCost {
        forward,
        backward_input,
        backward_weight,
        backward,
        activation_bytes: e.required("activation_bytes", Quantity::Bytes)?,
        released_at_input: e
            .number("released_at_input", Quantity::Bytes)?
            .unwrap_or(0.0),
        parameter_bytes: e.required("parameter_bytes", Quantity::Bytes)?,
        output_bytes: e.number("output_bytes", Quantity::Bytes)?.unwrap_or(0.0),
        input_bytes: e.number("input_bytes", Quantity::Bytes)?.unwrap_or(0.0),
        selective_bytes: e.number("selective_bytes", Quantity::Bytes)?.unwrap_or(0.0),
        selective_time: e
            .number("selective_time", Quantity::Seconds)?
            .unwrap_or(0.0),
        recompute: match e.string("recompute")? {
            None => Recompute::None,
            Some(m) => m.parse().map_err(|reason: String| {
                CostError::field(
                    e.path_of("recompute"),
                    reason,
                    "write \"none\", \"full\" or \"selective\"",
                )
            })?,
        },
    };
    stage.check(path)?;
    Ok((name, stage))
}

/// The optional `fixed` object of a layer entry (its numbers; [`LayerCost::check`] bounds them).
fn parse_fixed(v: &Value, path: &str) -> Result<Option<FixedCost>, CostError> {
    let Some(fixed) = v.get("fixed") else {
        return Ok(None);
    };
    let path = format!("{path}.fixed");
    let f = Fields::object(
        fixed,
        &path,
        "an object {\"forward\": s, \"backward_input\": s, \"backward_weight\": s}",
    )?;
    f.only(&["forward", "backward_input", "backward_weight"])?;
    Ok(Some(FixedCost {
        forward: f.required("forward", Quantity::Seconds)?,
        backward_input: f.required("backward_input", Quantity::Seconds)?,
        backward_weight: f.required("backward_weight", Quantity::Seconds)?,
    }))
}

/// The optional `samples` array of a layer entry (its numbers; [`LayerCost::check`] checks the
/// scales against each other).
fn parse_samples(v: &Value, path: &str) -> Result<Vec<SizeSample>, CostError> {
    let Some(samples) = v.get("samples") else {
        return Ok(Vec::new());
    };
    let Some(entries) = samples.as_array() else {
        return Err(CostError::field(
            format!("{path}.samples"),
            format!("is {}", super::check::kind(samples)),
            "give an array of {\"scale\": b / b0, \"forward\": s, \"backward_input\": s, \
             \"backward_weight\": s, \"backward\": s}",
        ));
    };
    entries
        .iter()
        .enumerate()
        .map(|(j, e)| {
            let at = format!("{path}.samples[{j}]");
            let f = Fields::object(
                e,
                &at,
                "an object {\"scale\": b / b0, \"forward\": s, \"backward_input\": s, \
                 \"backward_weight\": s, \"backward\": s}",
            )?;
            f.only(&[
                "scale",
                "forward",
                "backward_input",
                "backward_weight",
                "backward",
            ])?;
            let backward_input = f.required("backward_input", Quantity::Seconds)?;
            let backward_weight = f.required("backward_weight", Quantity::Seconds)?;
            Ok(SizeSample {
                scale: f.required("scale", Quantity::Scale)?,
                forward: f.required("forward", Quantity::Seconds)?,
                backward_input,
                backward_weight,
                backward: f
                    .number("backward", Quantity::Seconds)?
                    .unwrap_or(backward_input + backward_weight),
            })
        })
        .collect()
}

/// Per-stage entries are simulated as given, never rescaled: `samples` there would be ignored.
fn refuse_samples(v: &Value, path: &str) -> Result<(), CostError> {
    if v.get("samples").is_some() {
        return Err(CostError::field(
            format!("{path}.samples"),
            "is only read for per-layer costs",
            "remove \"samples\" from \"stages\" entries (per-stage costs are simulated as given), or give \"layers\"",
        ));
    }
    Ok(())
}

/// `recompute` and `input_bytes` describe a stage, not a layer: on a layer they would be ignored.
fn refuse_per_stage(v: &Value, path: &str) -> Result<(), CostError> {
    for key in ["recompute", "input_bytes"] {
        if v.get(key).is_some() {
            return Err(CostError::field(
                format!("{path}.{key}"),
                "is only read for per-stage costs",
                "give recomputation per stage (\"stages\" entries) or for every stage with --recompute",
            ));
        }
    }
    Ok(())
}

/// Per-stage entries are simulated as given, never rescaled: a `fixed` there would be ignored.
fn refuse_fixed(v: &Value, path: &str) -> Result<(), CostError> {
    if v.get("fixed").is_some() {
        return Err(CostError::field(
            format!("{path}.fixed"),
            "is only read for per-layer costs",
            "remove \"fixed\" from \"stages\" entries (per-stage costs are simulated as given), or give \"layers\"",
        ));
    }
    Ok(())
}

/// A [`LayerCost`] with the fields of a checked entry.
fn layer_from(name: String, s: &StageCost) -> LayerCost {
    LayerCost {
        name,
        forward: s.forward,
        backward_input: s.backward_input,
        backward_weight: s.backward_weight,
        backward: s.backward,
        activation_bytes: s.activation_bytes,
        released_at_input: s.released_at_input,
        parameter_bytes: s.parameter_bytes,
        output_bytes: s.output_bytes,
        selective_bytes: s.selective_bytes,
        selective_time: s.selective_time,
        fixed: None,
        samples: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
