//! The valid inputs the fuzz tests damage: files of every format each reader takes.

use pipefill_host::cost::{CostFile, LayerCost, LinkCost};
use pipefill_host::schedule::{families, format, lower, Params};

/// Schedule files of several families and shapes in every format: text grid, JSON, and CSV in
/// both PyTorch forms (compute only, and with transfers).
pub fn schedule_files() -> Vec<Vec<u8>> {
    let shapes = [
        ("1f1b", 2, 4),
        ("interleaved-1f1b", 2, 4),
        ("zbv", 2, 4),
        ("dualpipev", 2, 4),
        ("gpipe", 3, 2),
    ];
    let mut out = Vec::new();
    for (family, p, m) in shapes {
        let s = families::generate(family, &Params::new(p, m)).expect("a valid schedule");
        let lowered = lower::lower(&s).expect("lowers");
        for f in [
            format::to_text(&s),
            format::to_json(&s),
            format::to_csv(&s),
            format::to_csv(&lowered),
        ] {
            out.push(f.into_bytes());
        }
    }
    out
}

/// A per-layer cost file with every optional part, and a per-stage one (two stages).
pub fn cost_files() -> Vec<Vec<u8>> {
    let layers = (0..4)
        .map(|i| LayerCost::new(format!("layer{i}"), 1.0 + i as f64, 0.5, 0.25))
        .collect();
    let file = CostFile {
        layers,
        transfer: LinkCost::default(),
        overlap_share: 0.5,
        meta: serde_json::json!({"activation_dtype": "f32"}),
    };
    let stages = r#"{
  "stages": [
    {"forward": 1.0, "backward_input": 1.0, "backward_weight": 1.0, "activation_bytes": 100, "parameter_bytes": 10},
    {"forward": 2.0, "backward": 3.5, "activation_bytes": 1e6, "parameter_bytes": 4096}
  ],
  "transfer": {"latency": 0.001, "bandwidth": 1e9},
  "overlap_share": 0.25
}"#;
    vec![file.to_json().into_bytes(), stages.as_bytes().to_vec()]
}

/// Texts of the `--cost` flag.
pub fn cost_flags() -> Vec<Vec<u8>> {
    ["F=1,I=1,W=1", "F=2ms,B=3ms,W=1ms,A=10MB", "F=1.5,B=3"]
        .map(|s| s.as_bytes().to_vec())
        .to_vec()
}

/// Model files: `(extension, text)`, TOML and JSON.
pub fn model_files() -> Vec<(&'static str, String)> {
    let toml = "input = 16\nloss = \"mse\"\nbatch = 8\n\n[[layers]]\nwidth = 32\n\
                activation = \"gelu\"\n\n[[layers]]\nwidth = 4\n";
    let json = r#"{"input": 16, "loss": "ce", "batch": 8, "layers": [{"width": 32, "activation": "relu"}, {"width": 4}]}"#;
    vec![("toml", toml.into()), ("json", json.into())]
}
