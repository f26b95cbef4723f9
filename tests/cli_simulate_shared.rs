//! `pipefill simulate --shared-device` and `--overlap-share` end to end (simulate and plan): the
//! shared-device closed form, the serial sum at share 1, and refusals with exit code 2.

use serde_json::Value;

mod common;
use common::pipefill;

fn results(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["simulate"];
    all.extend(args);
    all.extend(["--format", "json"]);
    let (code, out, err) = pipefill(&all);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    v["results"].as_array().unwrap().clone()
}

#[test]
fn shared_device_closed_form_and_serial_sum() {
    // 1F1B, P = 2, M = 2, F = 1, B = 2, share 1/2: 10.5 (host/tests/sim_shared.rs derives it);
    // per-rank 9; the serial sum 12.
    let base = ["--schedule", "1f1b", "--ranks", "2", "--microbatches", "2"];
    let shared = results(&[&base[..], &["--shared-device", "--overlap-share", "0.5"]].concat());
    assert_eq!(shared[0]["makespan"], 10.5);
    assert_eq!(shared[0]["device"], "shared");
    assert_eq!(shared[0]["serial_sum"], 12.0);
    assert_eq!(shared[0]["overlap_share"], 0.5);
    let alone = results(&base);
    assert_eq!(alone[0]["makespan"], 9.0);
    assert_eq!(alone[0]["device"], "per-rank");
    let serial = results(&[&base[..], &["--shared-device", "--overlap-share", "1"]].concat());
    assert_eq!(serial[0]["makespan"], 12.0);
}

#[test]
fn overlap_share_is_checked() {
    for bad in ["1.5", "-0.1", "NaN", "x"] {
        let flag = format!("--overlap-share={bad}");
        let (code, _, err) = pipefill(&[
            "simulate",
            "--schedule",
            "1f1b",
            "--ranks",
            "2",
            "--microbatches",
            "2",
            &flag,
        ]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(
            err.contains("--overlap-share") && err.contains("between 0 and 1"),
            "{err}"
        );
    }
}

#[test]
fn overlap_share_moves_dualpipev() {
    // DualPipeV's pairs take max(f, b) + share * min(f, b): more share, longer step.
    let run = |share: &str| {
        results(&[
            "--schedule",
            "dualpipev",
            "--ranks",
            "4",
            "--microbatches",
            "8",
            "--overlap-share",
            share,
        ])[0]["makespan"]
            .as_f64()
            .unwrap()
    };
    assert!(run("0") < run("0.5") && run("0.5") < run("1"));
}

#[test]
fn plan_takes_the_overlap_share() {
    let dir = std::env::temp_dir().join(format!("pipefill-cli-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("costs.json");
    let layer = r#"{"name": "l", "forward": 1, "backward_input": 1, "backward_weight": 1, "activation_bytes": 0, "parameter_bytes": 0}"#;
    let layers = [layer; 8].join(",");
    std::fs::write(&path, format!(r#"{{"layers": [{layers}]}}"#)).unwrap();
    let p = path.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--costs",
            p,
            "--ranks",
            "4",
            "--global-batch",
            "8",
            "--cost-batch",
            "1",
            "--families",
            "dualpipev",
            "--format",
            "json",
        ];
        args.extend(extra);
        let (code, out, err) = pipefill(&args);
        (code, out, err)
    };
    let (code, out, err) = run(&["--overlap-share", "0.75"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["overlap_share"], 0.75);
    let (code, _, err) = run(&["--overlap-share", "2"]);
    assert_eq!(code, 2);
    assert!(err.contains("--overlap-share"), "{err}");
}
