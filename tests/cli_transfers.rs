//! `pipefill schedule --with-transfers`, PyTorch's CSV forms through the commands, and `simulate`
//! refusing exactly what `schedule --validate` refuses.

mod common;

use common::{pipefill, pipefill_in, scratch};

fn data(name: &str) -> String {
    format!("{}/host/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn with_transfers_prints_the_lowered_schedule() {
    let (code, out, err) = pipefill(&[
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--microbatches",
        "1",
        "--format",
        "csv",
        "--with-transfers",
    ]);
    assert_eq!(code, 0, "{err}");
    // PyTorch 2.15's compute+comms form: each send retired by its wait, each stage's gradients
    // finished by a reduction and its wait.
    assert_eq!(
        out,
        "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n\
         1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_SEND_B0,1WAIT_REDUCE_GRAD\n"
    );
    // The lowered file validates and simulates like the compute-only one.
    let dir = scratch("transfers");
    let low = dir.join("low.csv");
    std::fs::write(&low, &out).unwrap();
    let low = low.to_string_lossy().into_owned();
    let (code, out, err) = pipefill(&["schedule", "--validate", &low]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("OK"), "{out}");
    let sim = |file: &str| {
        let (code, out, err) = pipefill(&[
            "simulate",
            "--schedule-file",
            file,
            "--comm-latency",
            "0.5",
            "--format",
            "json",
        ]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["results"][0]["makespan"].as_f64().unwrap()
    };
    let plain = dir.join("plain.csv");
    std::fs::write(&plain, "0F0,0B0\n1F0,1B0\n").unwrap();
    assert_eq!(sim(&low), sim(&plain.to_string_lossy()));
    assert_eq!(sim(&low), 7.0);
}

#[test]
fn pytorch_files_validate_lower_and_simulate() {
    for name in [
        "pytorch_gpipe_p2_m2_compute_only.csv",
        "pytorch_gpipe_p2_m2_compute_comms.csv",
        "pytorch_1f1b_p2_m3_compute_only.csv",
    ] {
        let file = data(name);
        let (code, out, err) = pipefill(&[
            "schedule",
            "--validate",
            &file,
            "--with-transfers",
            "--format",
            "csv",
        ]);
        assert_eq!(code, 0, "{name}: {err}");
        assert!(
            out.contains("REDUCE_GRAD") && out.contains("0SEND_F0"),
            "{name}: {out}"
        );
        let (code, _, err) = pipefill(&["simulate", "--schedule-file", &file]);
        assert_eq!(code, 0, "{name}: {err}");
    }
}

#[test]
fn simulate_refuses_exactly_what_validate_refuses() {
    let dir = scratch("same-refusals");
    let broken = [
        ("wrong_rank.csv", "0F0,1B0,0B0\n1F0\n"),
        ("duplicate.csv", "0F0,0F0,0B0\n1F0,1B0\n"),
        ("missing.csv", "0F0,0B0\n1F0\n"),
        ("deadlock.csv", "0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n"),
        (
            "late_recv.csv",
            "0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1RECV_F0,1B0,1SEND_B0\n",
        ),
        ("early_reduce.csv", "0F0,0REDUCE_GRAD,0B0\n1F0,1B0\n"),
        ("bad.json", "{\"name\": \"x\", \"ranks\": 1}"),
    ];
    let mut refused = 0;
    for (name, text) in broken {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let path = path.to_string_lossy().into_owned();
        let (vcode, _, verr) = pipefill(&["schedule", "--validate", &path]);
        let (scode, _, serr) = pipefill(&["simulate", "--schedule-file", &path]);
        assert_eq!((vcode, scode), (2, 2), "{name}:\n{verr}\n{serr}");
        // The same first line of the validator's message, after each command's own prefix.
        // After `error: FLAG `PATH`: `, both print the validator's message.
        let core = |e: &str| {
            e.split_once("`: ")
                .map(|(_, m)| m.to_string())
                .unwrap_or_default()
        };
        let (v, s) = (core(&verr), core(&serr));
        assert!(
            !v.is_empty() && (s.ends_with(&v) || v.ends_with(&s)),
            "{name}:\nvalidate: {verr}\nsimulate: {serr}"
        );
        refused += 1;
    }
    assert_eq!(refused, broken.len());
}

#[test]
fn train_runs_pytorch_files_as_written() {
    let dir = scratch("train-pytorch");
    let losses = |name: &str| {
        let file = data(name);
        let (code, out, err) = pipefill_in(
            Some(&dir),
            &[
                "train",
                "--schedule-file",
                &file,
                "--steps",
                "2",
                "--batch",
                "48",
                "--format",
                "json",
            ],
        );
        assert_eq!(code, 0, "{name}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["schedule"], name.trim_end_matches(".csv"), "{name}");
        v["losses"].clone()
    };
    // The compute+comms file (receives placed by PyTorch's lowering) trains as its compute-only form.
    let comms = losses("pytorch_gpipe_p2_m2_compute_comms.csv");
    assert_eq!(comms, losses("pytorch_gpipe_p2_m2_compute_only.csv"));
    assert_eq!(comms.as_array().map(Vec::len), Some(2));
}

#[test]
fn validate_with_transfers_prints_only_the_schedule_on_stdout() {
    let dir = scratch("validate-stdout");
    let (code, csv, err) = pipefill(&[
        "schedule",
        "--schedule",
        "zbv",
        "--ranks",
        "2",
        "--microbatches",
        "4",
        "--format",
        "csv",
    ]);
    assert_eq!(code, 0, "{err}");
    let src = dir.join("zbv.csv");
    std::fs::write(&src, csv).unwrap();
    let src = src.to_string_lossy().into_owned();
    for fmt in ["csv", "json", "text"] {
        let (code, out, err) = pipefill(&[
            "schedule",
            "--validate",
            &src,
            "--with-transfers",
            "--format",
            fmt,
        ]);
        assert_eq!(code, 0, "{fmt}: {err}");
        assert!(
            err.starts_with("OK"),
            "{fmt}: the report goes to stderr: {err}"
        );
        let back = dir.join(format!("lowered.{fmt}"));
        std::fs::write(&back, &out).unwrap();
        let (code, _, err) = pipefill(&["schedule", "--validate", back.to_str().unwrap()]);
        assert_eq!(
            code, 0,
            "{fmt}: stdout does not read back as a schedule: {err}\n{out}"
        );
    }
    // --out takes the lowered schedule; without --with-transfers it and --format are refused.
    let out = dir.join("out.csv");
    let (code, stdout, err) = pipefill(&[
        "schedule",
        "--validate",
        &src,
        "--with-transfers",
        "--format",
        "csv",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.is_empty() && std::fs::read_to_string(&out).unwrap().contains("SEND_F"));
    for extra in [["--out", "x.csv"], ["--format", "json"]] {
        let (code, stdout, err) =
            pipefill(&[&["schedule", "--validate", &src][..], &extra[..]].concat());
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(
            err.contains("--with-transfers") && stdout.is_empty(),
            "{extra:?}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
