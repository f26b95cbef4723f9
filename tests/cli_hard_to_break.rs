//! Inputs a hostile or careless user types, each refused cleanly (exit 2, one line naming the field,
//! nothing written) or handled: numbers whose arithmetic would overflow, counts that would wrap
//! or allocate without bound, output paths that are not regular files, byte-order marks.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{assert_refused, pipefill, scratch, small_train};

const LAYERS: &str = r#"{"layers": [
  {"name": "L0", "forward": 1, "backward_input": 1, "backward_weight": 1, "activation_bytes": 10, "parameter_bytes": 10},
  {"name": "L1", "forward": 1, "backward_input": 1, "backward_weight": 1, "activation_bytes": 10, "parameter_bytes": 10},
  {"name": "L2", "forward": 1, "backward_input": 1, "backward_weight": 1, "activation_bytes": 10, "parameter_bytes": 10},
  {"name": "L3", "forward": 1, "backward_input": 1, "backward_weight": 1, "activation_bytes": 10, "parameter_bytes": 10}]}"#;

/// `simulate` of a small 1F1B case; tests append its costs and flags.
const SIM: [&str; 7] = [
    "simulate",
    "--schedule",
    "1f1b",
    "--ranks",
    "2",
    "--microbatches",
    "2",
];

/// `schedule --schedule auto` at two ranks and two microbatches, then `extra`.
fn auto<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let base = [
        "schedule",
        "--schedule",
        "auto",
        "--ranks",
        "2",
        "--microbatches",
        "2",
    ];
    [&base[..], extra].concat()
}

/// `plan` on the cost file `costs` at two ranks and a global batch of 8, then `extra`.
fn plan<'a>(costs: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let base = [
        "plan",
        "--costs",
        costs,
        "--ranks",
        "2",
        "--global-batch",
        "8",
        "--cost-batch",
        "1",
    ];
    [&base[..], extra].concat()
}

fn file(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn numbers_that_would_overflow_are_refused_quickly_naming_the_field() {
    let dir = scratch("huge");
    let huge = file(
        &dir,
        "huge.json",
        &LAYERS.replacen("\"forward\": 1", "\"forward\": 1e308", 1),
    );
    let started = Instant::now();
    assert_refused([
        (
            [&SIM[..], &["--cost", "F=1e308,I=1,W=1"]].concat(),
            "too large",
        ),
        (
            [
                &SIM[..],
                &["--cost", "F=1,I=1,W=1", "--comm-latency", "1e308"],
            ]
            .concat(),
            "too large",
        ),
        (
            [&SIM[..], &["--costs", &huge]].concat(),
            "layers[0].forward",
        ),
        (auto(&["--costs", &huge]), "too large"),
        (plan(&huge, &[]), "too large"),
    ]);
    // Before, the bound's loop never ended on these.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn counts_that_would_wrap_or_allocate_without_bound_are_refused() {
    let dir = scratch("counts");
    let costs = file(&dir, "costs.json", LAYERS);
    let max = u64::MAX.to_string();
    assert_refused([
        (small_train(&["--steps", &max]), "--steps"),
        (small_train(&["--steps", "200000000"]), "--steps"),
        (
            [
                &SIM[..],
                &["--costs", &costs, "--layers-per-stage", &format!("{max},5")],
            ]
            .concat(),
            "partition covers more than",
        ),
        (
            vec!["profile", "--repeats", &max, "--out", "x.json"],
            "--repeats",
        ),
        (
            vec!["profile", "--warmup", &max, "--out", "x.json"],
            "--warmup",
        ),
    ]);
    assert!(!Path::new("x.json").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn output_paths_are_checked_before_any_work() {
    let dir = scratch("outputs");
    let (code, out, err) = pipefill(&small_train(&[
        "--svg",
        "/no/such/dir/x.svg",
        "--steps",
        "3",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--svg") && err.contains("/no/such/dir/x.svg"),
        "{err}"
    );
    assert!(out.is_empty(), "trained before refusing: {out}");
    let folder = dir.to_str().unwrap();
    assert_refused([
        (
            vec![
                "schedule",
                "--schedule",
                "1f1b",
                "--ranks",
                "2",
                "--microbatches",
                "2",
                "--out",
                folder,
            ],
            "is a folder",
        ),
        (small_train(&["--trace", folder]), "is a folder"),
    ]);
    std::fs::remove_dir_all(&dir).ok();
}

#[cfg(unix)]
#[test]
fn a_symlinked_output_stays_a_link_and_its_file_is_written() {
    let dir = scratch("link");
    let real = dir.join("real.txt");
    let link = dir.join("link.txt");
    std::fs::write(&real, "old").unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (code, _, err) = pipefill(&[
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--microbatches",
        "2",
        "--out",
        link.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(
        std::fs::read_to_string(&real).unwrap().contains("1F"),
        "the file the link names"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn files_with_a_byte_order_mark_read_like_files_without() {
    let dir = scratch("bom");
    let (code, csv, err) = pipefill(&[
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--microbatches",
        "2",
        "--format",
        "csv",
    ]);
    assert_eq!(code, 0, "{err}");
    let sched = file(&dir, "s.csv", &format!("\u{feff}{csv}"));
    let (code, _, err) = pipefill(&["schedule", "--validate", &sched]);
    assert_eq!(code, 0, "a schedule CSV with a BOM: {err}");
    let costs = file(&dir, "c.json", &format!("\u{feff}{LAYERS}"));
    let (code, _, err) = pipefill(&[&SIM[..], &["--costs", &costs]].concat());
    assert_eq!(code, 0, "a cost file with a BOM: {err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_families_error_names_auto() {
    let dir = scratch("families");
    let costs = file(&dir, "c.json", LAYERS);
    assert_refused([(plan(&costs, &["--families", "nope"]), "auto")]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn duplicate_keys_and_huge_tokens_get_short_clear_errors() {
    let dir = scratch("dupkeys");
    let dup = LAYERS.replacen("\"forward\": 1,", "\"forward\": 1, \"forward\": 2,", 1);
    let costs = file(&dir, "dup.json", &dup);
    assert_refused([(
        [&SIM[..], &["--costs", &costs]].concat(),
        "the key `forward` appears twice",
    )]);
    // A damaged 1 MB cell: the error quotes its start, not all of it.
    let cell = "7".repeat(1 << 20);
    let sched = file(&dir, "big.csv", &format!("0F0,{cell}F\n"));
    let (code, out, err) = pipefill(&["schedule", "--validate", &sched]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.len() < 1000, "an error of {} bytes", err.len());
    assert!(err.contains("bytes)"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `pipefill ARGS` must refuse with one short line containing every needle.
fn refused_in_one_short_line(args: &[&str], needles: &[&str]) {
    let (code, _, err) = pipefill(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.len() < 700, "{args:?}: an error of {} bytes", err.len());
    for n in needles {
        assert!(err.contains(n), "{args:?}: expected `{n}` in: {err}");
    }
}

#[test]
fn huge_numbers_are_shown_in_scientific_notation() {
    // 1e308 used to be written out in its 309 digits.
    refused_in_one_short_line(
        &[&SIM[..], &["--cost", "F=1e308,I=1,W=1"]].concat(),
        &["1e308 s", "more than 1e12"],
    );
}

#[test]
fn what_the_fuzzer_found_is_refused_in_one_short_line() {
    let dir = scratch("fuzz-found");
    let long = "a".repeat(100_000);
    // A TOML parser's error spans lines with a picture of the spot; a long float was quoted whole.
    let model = file(
        &dir,
        "m.toml",
        "input = 16
batch = 1e308
[[layers]]
width = 4
",
    );
    let train = ["train", "--ranks", "1", "--steps", "1", "--model", &model];
    refused_in_one_short_line(&train, &["m.toml", "at line 2 column 9", "expected usize"]);
    // A line break inside a `--cost` value broke the error's line.
    let sim = [
        &SIM[..],
        &[
            "--cost",
            "F=1,I=1,W=1
extra = 1",
        ],
    ]
    .concat();
    refused_in_one_short_line(&sim, &["cannot read `1\\nextra = 1` as a time"]);
    // A long string where a cost file wants a number, a long rank label in a text grid, a long
    // key: quoted whole before.
    let costs = file(
        &dir,
        "c.json",
        &LAYERS.replacen("\"forward\": 1,", &format!("\"forward\": \"{long}\","), 1),
    );
    refused_in_one_short_line(
        &[&SIM[..], &["--costs", &costs]].concat(),
        &["(100000 bytes)"],
    );
    let grid = file(&dir, "g.txt", &format!("# name=x ranks=1 chunks=1 microbatches=1 placement=looped\nslot 0 1\nrank {long} 0F0 0B0\n"));
    refused_in_one_short_line(
        &["schedule", "--validate", &grid],
        &["found `rank aaa", "bytes)"],
    );
    let costs = file(
        &dir,
        "k.json",
        &LAYERS.replacen(
            "\"forward\": 1,",
            &format!("\"forward\": 1, \"{long}\\r\": 1,"),
            1,
        ),
    );
    refused_in_one_short_line(
        &[&SIM[..], &["--costs", &costs]].concat(),
        &["is not a known field"],
    );
    // A JSON schedule whose message nests another reader's: its first line, the spot quoted.
    let json = file(
        &dir,
        "s.json",
        &format!("{{\"name\": \"{long}\", \"ranks\": \"x\"}}"),
    );
    refused_in_one_short_line(
        &["schedule", "--validate", &json],
        &["schedule JSON", "at line 1"],
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_memory_limit_takes_every_byte_size_form() {
    let dir = scratch("sizes");
    let costs = file(&dir, "c.json", LAYERS);
    for size in ["40GB", "40GiB", "4e10", "2000000000", "1TB"] {
        for args in [
            plan(&costs, &["--memory-limit", size]),
            vec![
                "partition",
                "--costs",
                &costs,
                "--stages",
                "2",
                "--schedule",
                "1f1b",
                "--microbatches",
                "4",
                "--memory-limit",
                size,
            ],
            vec![
                "simulate",
                "--schedule",
                "auto",
                "--ranks",
                "2",
                "--microbatches",
                "2",
                "--costs",
                &costs,
                "--memory-limit",
                size,
            ],
        ] {
            let (code, _, err) = pipefill(&args);
            assert_eq!(code, 0, "{args:?}: {err}");
        }
    }
    assert_refused([(
        vec![
            "partition",
            "--costs",
            &costs,
            "--stages",
            "2",
            "--memory-limit",
            "40apples",
        ],
        "40GB",
    )]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn absurd_budgets_and_worker_counts_are_refused_or_end_quickly() {
    let dir = scratch("budgets");
    let costs = file(&dir, "c.json", LAYERS);
    assert_refused([(
        auto(&["--cost", "F=1,I=1,W=1", "--time-budget", "1e9"]),
        "--time-budget",
    )]);
    let started = Instant::now();
    let max = u64::MAX.to_string();
    let (code, _, err) = pipefill(&[
        "plan",
        "--costs",
        &costs,
        "--workers",
        &max,
        "--global-batch",
        "8",
        "--cost-batch",
        "1",
    ]);
    assert!(code == 0 || code == 2, "exit {code}: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    std::fs::remove_dir_all(&dir).ok();
}
