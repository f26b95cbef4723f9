//! Tests of the cost file reader: every field checked by path, round trips.

use super::*;

const GOOD: &str = r#"{"layers": [
    {"name": "a", "forward": 1, "backward_input": 1, "backward_weight": 2,
     "activation_bytes": 10, "parameter_bytes": 5, "output_bytes": 3, "released_at_input": 4},
    {"name": "b", "forward": 2, "backward": 4, "activation_bytes": 0, "parameter_bytes": 0}],
    "transfer": {"latency": 0.5, "bandwidth": 100}}"#;

fn err(text: &str) -> String {
    CostInput::parse(text).unwrap_err().to_string()
}

#[test]
fn reads_layers() {
    let f = CostFile::parse(GOOD).unwrap();
    assert_eq!(f.layers.len(), 2);
    assert_eq!(f.layers[0].backward, 3.0);
    assert_eq!(f.layers[1].backward_weight, 2.0);
    assert_eq!(
        f.transfer,
        LinkCost {
            latency: 0.5,
            bandwidth: 100.0
        }
    );
    let again = CostFile::parse(&f.to_json()).unwrap();
    assert_eq!(again, f);
}

#[test]
fn reads_stages() {
    let CostInput::Stages(m) = CostInput::parse(
        r#"{"stages": [{"forward": 1, "backward": 2, "activation_bytes": 1, "parameter_bytes": 0}],
            "overlap_share": 0.25}"#,
    )
    .unwrap() else {
        panic!("expected stages")
    };
    assert_eq!(m.stages[0].backward_input, 1.0);
    assert_eq!(m.overlap_share, 0.25);
    assert_eq!(m.link, LinkCost::default());
}

const FIXED_LAYER: &str = r#"{"name": "a", "forward": 2, "backward_input": 1, "backward_weight": 1,
    "activation_bytes": 0, "parameter_bytes": 0"#;

fn with_fixed(fixed: &str) -> String {
    format!(r#"{{"layers": [{FIXED_LAYER}, "fixed": {fixed}}}]}}"#)
}

#[test]
fn reads_the_fixed_part_and_writes_it_back() {
    let f = CostFile::parse(&with_fixed(
        r#"{"forward": 0.5, "backward_input": 0, "backward_weight": 1}"#,
    ))
    .unwrap();
    assert_eq!(
        f.layers[0].fixed,
        Some(FixedCost {
            forward: 0.5,
            backward_input: 0.0,
            backward_weight: 1.0
        })
    );
    assert_eq!(CostFile::parse(&f.to_json()).unwrap(), f);
    // Absent: unknown (linear scaling), and not written.
    let plain = CostFile::parse(GOOD).unwrap();
    assert!(plain.layers.iter().all(|l| l.fixed.is_none()));
    assert!(!plain.to_json().contains("fixed"));
}

#[test]
fn the_fixed_part_is_checked() {
    let cases = [
        (
            with_fixed(r#"{"forward": -0.5, "backward_input": 0, "backward_weight": 0}"#),
            "layers[0].fixed.forward",
            "negative",
        ),
        (
            with_fixed(r#"{"forward": 0, "backward_weight": 0}"#),
            "layers[0].fixed.backward_input",
            "missing",
        ),
        (
            with_fixed(r#"{"forward": 0, "backward_input": 0, "backward_weight": 1.5}"#),
            "layers[0].fixed.backward_weight",
            "larger",
        ),
        (
            with_fixed(r#"{"forward": 0, "backward_input": 0, "backward_weight": null}"#),
            "layers[0].fixed.backward_weight",
            "null",
        ),
        (
            with_fixed(r#"{"forward": 0, "backward_input": 0, "backward_weight": 0, "per_row": 1}"#),
            "layers[0].fixed.per_row",
            "",
        ),
        (with_fixed("0.5"), "layers[0].fixed", "expected an object"),
        (
            r#"{"stages": [{"forward": 1, "backward": 1, "activation_bytes": 0, "parameter_bytes": 0,
                "fixed": {"forward": 0, "backward_input": 0, "backward_weight": 0}}]}"#
                .to_string(),
            "stages[0].fixed",
            "per-layer",
        ),
    ];
    for (text, field, what) in cases {
        let e = err(&text);
        assert!(
            e.contains(field) && e.contains(what) && e.contains("Fix:"),
            "`{text}` gave `{e}`; wanted {field} / {what}"
        );
    }
}

#[test]
fn every_layer_field_is_checked() {
    let cases = [
        (
            r#"{"layers": [{"name": "a", "forward": -1, "backward": 1, "activation_bytes": 0, "parameter_bytes": 0}]}"#,
            "layers[0].forward",
            "negative",
        ),
        (
            r#"{"layers": [{"name": "a", "forward": "1", "backward": 1, "activation_bytes": 0, "parameter_bytes": 0}]}"#,
            "layers[0].forward",
            "string",
        ),
        (
            r#"{"layers": [{"name": "a", "backward": 1, "activation_bytes": 0, "parameter_bytes": 0}]}"#,
            "layers[0].forward",
            "missing",
        ),
        (
            r#"{"layers": [{"name": "a", "forward": 1, "backward": 1, "parameter_bytes": 0}]}"#,
            "layers[0].activation_bytes",
            "missing",
        ),
        (
            r#"{"layers": [{"name": "a", "forward": 1, "backward": 1, "activation_bytes": 0}]}"#,
            "layers[0].parameter_bytes",
            "missing",
        ),
        (
            r#"{"layers": [{"forward": 1, "backward": 1, "activation_bytes": 0, "parameter_bytes": 0}]}"#,
            "layers[0].name",
            "missing",
        ),
        (
            r#"{"layers": [{"name": "a", "foward": 1}]}"#,
            "layers[0].foward",
            "did you mean `forward`",
        ),
        (
            r#"{"layers": [{"name": "a", "forward": 1, "backward_input": 1, "activation_bytes": 0, "parameter_bytes": 0}]}"#,
            "layers[0].backward_weight",
            "missing",
        ),
        (r#"{"layers": []}"#, "layers", "empty"),
    ];
    for (text, field, what) in cases {
        let e = err(text);
        assert!(
            e.contains(field) && e.contains(what),
            "`{text}` gave `{e}`; wanted {field} / {what}"
        );
        assert!(e.contains("Fix:"), "no fix in `{e}`");
    }
}

#[test]
fn every_top_level_field_is_checked() {
    let cases = [
        (r#"{"layers": 3}"#, "layers", "expected an array"),
        (r#"{"layers": [3]}"#, "layers[0]", "expected an object"),
        (
            r#"{"transfer": {"latency": 0, "bandwidth": 1}}"#,
            "layers",
            "missing",
        ),
        (
            r#"{"layers": [{"name": "a", "forward": 1, "backward": 1, "activation_bytes": 0, "parameter_bytes": 0}], "transfer": {"latency": 0, "bandwidth": 0}}"#,
            "transfer.bandwidth",
            "positive",
        ),
        (
            r#"{"layers": [{"name": "a", "forward": 1, "backward": 1, "activation_bytes": 0, "parameter_bytes": 0}], "transfer": {"bandwidth": 1}}"#,
            "transfer.latency",
            "missing",
        ),
        (
            r#"{"layers": [{"name": "a", "forward": 1, "backward": 1, "activation_bytes": 0, "parameter_bytes": 0}], "overlap_share": 2}"#,
            "overlap_share",
            "between 0 and 1",
        ),
        (
            r#"{"stages": [{"forward": 1, "backward": 1, "activation_bytes": 0, "parameter_bytes": 0, "output_bytes": null}]}"#,
            "stages[0].output_bytes",
            "null",
        ),
        (
            r#"{"layers": [{"name": "a", "forward": 1e400}]}"#,
            "line 1",
            "JSON",
        ),
        (r#"[1]"#, "(top level)", "expected an object"),
    ];
    for (text, field, what) in cases {
        let e = err(text);
        assert!(
            e.contains(field) && e.contains(what),
            "`{text}` gave `{e}`; wanted {field} / {what}"
        );
        assert!(e.contains("Fix:"), "no fix in `{e}`");
    }
}

fn with_samples(samples: &str) -> String {
    format!(r#"{{"layers": [{FIXED_LAYER}, "samples": {samples}}}]}}"#)
}

#[test]
fn reads_samples_and_writes_them_back() {
    let f = CostFile::parse(&with_samples(
        r#"[{"scale": 4, "forward": 6, "backward_input": 3, "backward_weight": 3.5},
            {"scale": 0.25, "forward": 1, "backward_input": 0.5, "backward_weight": 0.5,
             "backward": 0.9}]"#,
    ))
    .unwrap();
    let s = &f.layers[0].samples;
    assert_eq!(s.len(), 2);
    assert_eq!(
        (s[0].scale, s[0].backward),
        (4.0, 6.5),
        "B defaults to I + W"
    );
    assert_eq!((s[1].scale, s[1].backward), (0.25, 0.9));
    assert_eq!(CostFile::parse(&f.to_json()).unwrap(), f);
    assert_eq!(f.layers[0].scaled(4.0).forward, 6.0);
    assert!(!CostFile::parse(GOOD).unwrap().to_json().contains("samples"));
}

#[test]
fn samples_are_checked_naming_the_field() {
    let cases = [
        (with_samples("{}"), "layers[0].samples", "array"),
        (
            with_samples(
                r#"[{"scale": 0, "forward": 1, "backward_input": 1, "backward_weight": 1}]"#,
            ),
            "layers[0].samples[0].scale",
            "positive",
        ),
        (
            with_samples(r#"[{"scale": 2, "forward": 1, "backward_input": 1}]"#),
            "layers[0].samples[0].backward_weight",
            "missing",
        ),
        (
            with_samples(
                r#"[{"scale": 2, "froward": 1, "backward_input": 1, "backward_weight": 1}]"#,
            ),
            "froward",
            "forward",
        ),
        (
            with_samples(
                r#"[{"scale": 2, "forward": 1, "backward_input": 1, "backward_weight": 1},
                    {"scale": 2, "forward": 1, "backward_input": 1, "backward_weight": 1}]"#,
            ),
            "layers[0].samples[1].scale",
            "repeats",
        ),
        (
            r#"{"stages": [{"forward": 1, "backward": 2, "activation_bytes": 1,
                "parameter_bytes": 0, "samples": []}]}"#
                .to_string(),
            "stages[0].samples",
            "per-layer",
        ),
    ];
    for (text, field, word) in cases {
        let e = CostInput::parse(&text).unwrap_err().to_string();
        assert!(e.contains(field) && e.contains(word), "{field}/{word}: {e}");
    }
}
