//! `pipefill schedule` end to end: the built binary, its output, its files and its exit codes.

use std::path::PathBuf;
use std::process::{Command, Output};

fn pipefill(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipefill"))
        .args(args)
        .output()
        .expect("the pipefill binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh folder for one test's files.
fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pipefill-cli-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Exit code 2 and exactly one `error:` line first on stderr, containing every `needle`.
fn assert_usage_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
}

#[test]
fn list_shows_every_family_with_placement_and_split() {
    let o = pipefill(&["schedule", "--list"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for name in [
        "gpipe",
        "1f1b",
        "interleaved-1f1b",
        "looped-bfs",
        "zb-h1",
        "zb-h2",
        "interleaved-zb",
        "zbv",
        "dualpipev",
    ] {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from:\n{out}"));
        assert!(line.contains("looped") || line.contains("vshape"), "{line}");
    }
    assert!(out.lines().next().unwrap().contains("I/W split"));
}

#[test]
fn generate_text_grid_has_one_row_per_rank() {
    let o = pipefill(&[
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "4",
        "--microbatches",
        "8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("# name=1f1b ranks=4 chunks=1 microbatches=8 placement=looped"));
    assert_eq!(out.lines().filter(|l| l.starts_with("rank ")).count(), 4);
    // Rank 3 starts after the three forwards upstream of it: three idle slots.
    let rank3 = out.lines().find(|l| l.starts_with("rank 3")).unwrap();
    assert!(
        rank3.split_whitespace().skip(2).take(3).all(|c| c == "."),
        "{rank3}"
    );
}

#[test]
fn json_and_csv_files_validate_and_round_trip() {
    let dir = scratch("roundtrip");
    for (fmt, file) in [("json", "s.json"), ("csv", "s.csv")] {
        let path = dir.join(file);
        let p = path.to_str().unwrap();
        let o = pipefill(&[
            "schedule",
            "--schedule",
            "interleaved-1f1b",
            "--ranks",
            "4",
            "--microbatches",
            "8",
            "--chunks",
            "2",
            "--format",
            fmt,
            "--out",
            p,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stdout(&o).is_empty());
        let v = pipefill(&["schedule", "--validate", p]);
        assert!(v.status.success(), "{}", stderr(&v));
        let out = stdout(&v);
        assert!(out.starts_with("OK "), "{out}");
        assert!(out.contains("P=4 V=2 M=8"), "{out}");
        for (r, peak) in [11, 9, 7, 5].iter().enumerate() {
            assert!(out.contains(&format!("rank {r}: {peak}")), "{out}");
        }
    }
    // The folder holds exactly the two outputs: no temporary files left behind.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_flags_are_one_error_with_exit_code_2() {
    let gen = |extra: &[&str]| {
        let mut a = vec!["schedule"];
        a.extend_from_slice(extra);
        pipefill(&a)
    };
    assert_usage_error(
        &gen(&["--schedule", "nope", "--ranks", "2", "--microbatches", "2"]),
        &["unknown schedule family `nope`", "--list"],
    );
    assert_usage_error(
        &gen(&["--schedule", "gpipe", "--ranks", "0", "--microbatches", "2"]),
        &["ranks (P) must be at least 1", "--ranks"],
    );
    assert_usage_error(
        &gen(&[
            "--schedule",
            "1f1b",
            "--ranks",
            "2",
            "--microbatches",
            "2",
            "--chunks",
            "2",
        ]),
        &["use V = 1"],
    );
    assert_eq!(gen(&["--ranks", "2"]).status.code(), Some(2));
    assert_eq!(
        gen(&["--list", "--validate", "x.json"]).status.code(),
        Some(2)
    );
}

#[test]
fn bad_files_are_refused_with_the_place_and_exit_code_2() {
    let dir = scratch("badfiles");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let cases: Vec<(String, Vec<&str>)> = vec![
        (
            write("wrong_rank.csv", "0F0,0B0,1F0\n1B0\n"),
            vec!["rank 0, position 2", "`1F0`", "rank 1", "[1F0]"],
        ),
        (
            write("dup.csv", "0F0,0B0,0B0\n1F0,1B0\n"),
            vec!["position 2", "duplicate"],
        ),
        (
            write("bad_cell.csv", "0F0,0X0\n"),
            vec!["row 1 (rank 0), cell 2", "0X0"],
        ),
        (
            write("missing.json", r#"{"name":"x","ranks":1}"#),
            vec!["missing field `chunks`"],
        ),
        (
            write(
                "typo.json",
                r#"{"name":"x","ranks":1,"chunks":1,"microbatches":1,"placement":"looped","action":[]}"#,
            ),
            vec!["unknown field `action`"],
        ),
        (
            write("deadlock.csv", "0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n"),
            vec!["deadlock", "rank 0 at position 1", "waits for `1B0`"],
        ),
        (write("empty.csv", "\n\n"), vec!["empty"]),
    ];
    for (path, needles) in &cases {
        assert_usage_error(&pipefill(&["schedule", "--validate", path]), needles);
    }
    assert_usage_error(
        &pipefill(&[
            "schedule",
            "--validate",
            dir.join("absent.json").to_str().unwrap(),
        ]),
        &["--validate", "cannot read it"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn out_to_a_missing_folder_fails_cleanly() {
    let dir = scratch("outfail");
    let target = dir.join("no/such/folder/s.json");
    let o = pipefill(&[
        "schedule",
        "--schedule",
        "gpipe",
        "--ranks",
        "2",
        "--microbatches",
        "2",
        "--format",
        "json",
        "--out",
        target.to_str().unwrap(),
    ]);
    assert_usage_error(&o, &["--out"]);
    assert!(!target.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
