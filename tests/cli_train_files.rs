//! `pipefill train --schedule-file`: any schedule that validates trains, whatever its name or
//! order, with the default `--plan auto`; a file that cannot run is refused with exit code 2.

mod common;

use std::path::Path;

use common::{pipefill_in, scratch};

/// A small model, two steps, JSON out.
const SMALL: [&str; 10] = [
    "--steps", "2", "--layers", "4", "--hidden", "16", "--batch", "32", "--format", "json",
];

/// `pipefill train --schedule-file FILE` (plus the small model) in `dir`: exit code, parsed JSON
/// (or null), stderr.
fn train_file(dir: &Path, file: &str, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let mut args = vec!["train", "--schedule-file", file, "--svg", "t.svg"];
    args.extend_from_slice(&SMALL);
    args.extend_from_slice(extra);
    let (code, out, err) = pipefill_in(Some(dir), &args);
    let v = serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
    (code, v, err)
}

/// `pipefill schedule --schedule zb-h1 --ranks 2 --microbatches 4 --format FORMAT --out FILE`.
fn write_schedule(dir: &Path, format: &str, file: &str) {
    let (code, _, err) = pipefill_in(
        Some(dir),
        &[
            "schedule",
            "--schedule",
            "zb-h1",
            "--ranks",
            "2",
            "--microbatches",
            "4",
            "--format",
            format,
            "--out",
            file,
        ],
    );
    assert_eq!(code, 0, "{err}");
}

/// The trained run used the file's schedule: its name, `P`, `M`, and a split of the 4 layers.
fn assert_trained(v: &serde_json::Value, name: &str) {
    assert_eq!(v["schedule"], name, "{v}");
    assert_eq!(
        (v["ranks"].as_u64(), v["microbatches"].as_u64()),
        (Some(2), Some(4))
    );
    assert_eq!(v["plan"], "auto");
    assert_eq!(v["candidates"].as_array().map(Vec::len), Some(1));
    let counts: Vec<u64> = serde_json::from_value(v["layers_per_stage"].clone()).unwrap();
    assert_eq!(
        (counts.len(), counts.iter().sum::<u64>()),
        (2, 4),
        "{counts:?}"
    );
    // The CPU runtime's overlap share comes from the profile's cost file.
    assert_eq!(v["overlap_share"], 1.0);
    assert_eq!(v["losses"].as_array().map(Vec::len), Some(2));
}

#[test]
fn a_csv_named_after_its_file_trains_with_the_default_plan() {
    let dir = scratch("train-files-csv");
    write_schedule(&dir, "csv", "mine.csv");
    let (code, v, err) = train_file(&dir, "mine.csv", &[]);
    assert_eq!(code, 0, "{err}");
    assert_trained(&v, "mine");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_json_with_its_own_name_trains() {
    let dir = scratch("train-files-json");
    write_schedule(&dir, "json", "written.json");
    let text = std::fs::read_to_string(dir.join("written.json")).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["name"] = "my-pipeline".into();
    std::fs::write(dir.join("renamed.json"), doc.to_string()).unwrap();
    let (code, v, err) = train_file(&dir, "renamed.json", &[]);
    assert_eq!(code, 0, "{err}");
    assert_trained(&v, "my-pipeline");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_hand_edited_order_trains_as_written() {
    let dir = scratch("train-files-edited");
    write_schedule(&dir, "csv", "zb.csv");
    let text = std::fs::read_to_string(dir.join("zb.csv")).unwrap();
    // Rank 0 runs its third forward before the first weight gradient: still valid (W(0,0) needs
    // only I(0,0)), but no longer zb-h1's order.
    assert!(text.contains("0W0,0F2"), "{text}");
    let edited = text.replacen("0W0,0F2", "0F2,0W0", 1);
    std::fs::write(dir.join("edited.csv"), &edited).unwrap();
    let (code, v, err) = train_file(&dir, "edited.csv", &[]);
    assert_eq!(code, 0, "{err}");
    assert_trained(&v, "edited");
    // And with equal layer counts.
    let (code, v, err) = train_file(&dir, "edited.csv", &["--plan", "uniform"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["layers_per_stage"], serde_json::json!([2, 2]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_broken_file_is_refused_with_exit_2() {
    let dir = scratch("train-files-broken");
    write_schedule(&dir, "csv", "zb.csv");
    let text = std::fs::read_to_string(dir.join("zb.csv")).unwrap();
    let cases = [
        // A weight gradient before its input gradient: cannot run.
        ("swapped.csv", text.replacen("0I0,0W0", "0W0,0I0", 1)),
        // An action is missing.
        ("missing.csv", text.replacen(",0W3", "", 1)),
        // Not an action at all.
        ("garbled.csv", text.replacen("0F0", "0X0", 1)),
    ];
    for (name, body) in cases {
        assert_ne!(body, text, "{name} must differ from the written file");
        std::fs::write(dir.join(name), body).unwrap();
        let (code, _, err) = train_file(&dir, name, &[]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(
            err.contains(&format!("--schedule-file `{name}`")),
            "{name}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
