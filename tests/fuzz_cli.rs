//! Fuzzing every reader through the `pipefill` binary: damaged schedule files, cost files,
//! `--cost` texts, model files, checkpoint manifests and rank files, each given to the commands
//! that read it. Every run must exit 0 or 2 (never 1, a panic's 101 or a signal), within a time
//! limit; a refusal says what is wrong in one line and writes nothing.
//!
//! Seeded and sized like `fuzz_readers` (`tests/fuzz/mod.rs`): `PIPEFILL_FUZZ_SEED`,
//! `PIPEFILL_FUZZ_CASES` (runs per reader; the default is small, each run is a process). A damage
//! campaign: `PIPEFILL_FUZZ_SEED=7 PIPEFILL_FUZZ_CASES=300 cargo test --release --test fuzz_cli
//! -- --nocapture` prints the exit codes seen per reader.

mod common;
mod fuzz;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{pipefill_in, scratch, SMALL_TRAIN};
use fuzz::valid;
use rand::Rng;

/// Runs per reader when `PIPEFILL_FUZZ_CASES` is not set.
const DEFAULT_CASES: usize = 20;

/// The longest one run may take.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// The longest line a refusal may print.
const MAX_LINE: usize = 800;

/// A reader as the command line reaches it.
struct Reader {
    name: &'static str,
    /// Valid inputs: the file name each is written under, and its bytes.
    valid: Vec<(String, Vec<u8>)>,
    /// Whether the reader takes text (damage keeps it UTF-8).
    text: bool,
    /// Commands that read the damaged input: given the file's name (for a flag, its text).
    commands: Vec<fn(&str) -> Vec<String>>,
}

/// `parts` as owned strings.
fn owned(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// The small training run of the CLI tests, then `extra`.
fn small_train(extra: &[&str]) -> Vec<String> {
    owned(&[&SMALL_TRAIN[..], extra].concat())
}

fn readers(checkpoint: &Path) -> Vec<Reader> {
    let files = |stem: &str, ext: &[&str], inputs: Vec<Vec<u8>>| -> Vec<(String, Vec<u8>)> {
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, v)| (format!("{stem}{i}.{}", ext[i % ext.len()]), v))
            .collect()
    };
    let ck = |file: &str| -> Vec<(String, Vec<u8>)> {
        let path = checkpoint.join("step-00000002").join(file);
        vec![(
            file.to_string(),
            fs::read(&path).expect("the checkpoint's file"),
        )]
    };
    let simulate: fn(&str) -> Vec<String> = |f| {
        let sim = [
            "simulate",
            "--costs",
            f,
            "--schedule",
            "1f1b",
            "--ranks",
            "2",
        ];
        owned(&[&sim[..], &["--microbatches", "4", "--svg", "out/s.svg"]].concat())
    };
    let resume: fn(&str) -> Vec<String> =
        |_| small_train(&["--steps", "3", "--resume", "ck", "--svg", "out/t.svg"]);
    vec![
        Reader {
            name: "schedule file",
            valid: files(
                "sched",
                &["txt", "json", "csv", "csv"],
                valid::schedule_files(),
            ),
            text: true,
            commands: vec![
                |f| owned(&["schedule", "--validate", f]),
                |f| {
                    let sim = ["simulate", "--schedule-file", f, "--cost", "F=1,I=1,W=1"];
                    owned(&[&sim[..], &["--svg", "out/s.svg"]].concat())
                },
                |f| {
                    // The small run without `--ranks` and `--microbatches`: the file sets them.
                    let train = ["train", "--layers", "4", "--hidden", "32", "--batch", "32"];
                    let rest = ["--plan", "uniform", "--steps", "1", "--svg", "out/t.svg"];
                    owned(&[&train[..], &["--schedule-file", f], &rest[..]].concat())
                },
            ],
        },
        Reader {
            name: "cost file (stages)",
            valid: files("stages", &["json"], valid::cost_files().split_off(1)),
            text: true,
            commands: vec![simulate],
        },
        Reader {
            name: "cost file (layers)",
            valid: files("layers", &["json"], valid::cost_files()[..1].to_vec()),
            text: true,
            commands: vec![
                simulate,
                |f| {
                    owned(&[
                        "partition",
                        "--costs",
                        f,
                        "--stages",
                        "2",
                        "--format",
                        "json",
                    ])
                },
                |f| {
                    let plan = ["plan", "--costs", f, "--ranks", "2", "--global-batch", "8"];
                    owned(&[&plan[..], &["--cost-batch", "1", "--svg", "out/p.svg"]].concat())
                },
            ],
        },
        Reader {
            name: "--cost flag",
            valid: files("flag", &["txt"], valid::cost_flags()),
            text: true,
            commands: vec![|text| {
                let sim = ["simulate", "--schedule", "1f1b", "--ranks", "2"];
                let cost = format!("--cost={text}");
                owned(
                    &[
                        &sim[..],
                        &["--microbatches", "2", &cost, "--svg", "out/s.svg"],
                    ]
                    .concat(),
                )
            }],
        },
        Reader {
            name: "model file",
            valid: valid::model_files()
                .into_iter()
                .map(|(ext, text)| (format!("model.{ext}"), text.into_bytes()))
                .collect(),
            text: true,
            commands: vec![|f| {
                let train = ["train", "--model", f, "--ranks", "2", "--microbatches", "2"];
                let rest = ["--steps", "1", "--plan", "uniform", "--svg", "out/t.svg"];
                owned(&[&train[..], &rest[..]].concat())
            }],
        },
        Reader {
            name: "checkpoint manifest",
            valid: ck("manifest.json"),
            text: true,
            commands: vec![resume],
        },
        Reader {
            name: "rank file",
            valid: [ck("rank-0.bin"), ck("rank-1.bin")].concat(),
            text: false,
            commands: vec![resume],
        },
    ]
}

/// Copies the folder `from` to `to` (files and folders only).
fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create a folder");
    for e in fs::read_dir(from).expect("read a folder").flatten() {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            fs::copy(e.path(), &target).expect("copy a file");
        }
    }
}

/// What one run did.
struct Run {
    code: Option<i32>,
    stderr: String,
    seconds: f64,
}

/// Runs `pipefill ARGS` in `dir`; kills it after [`RUN_LIMIT`] (`code` is then `None`).
fn run(dir: &Path, args: &[String]) -> Run {
    let start = Instant::now();
    let err = dir.join("stderr.txt");
    // `PIPEFILL_BIN` when set (as `common::pipefill_in`): another build's binary, e.g. to compare.
    let bin = std::env::var_os("PIPEFILL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pipefill")));
    let mut child = Command::new(bin)
        .current_dir(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(fs::File::create(&err).expect("a stderr file"))
        .spawn()
        .expect("start pipefill");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for pipefill") {
            break Some(s);
        }
        if start.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stderr = String::from_utf8_lossy(&fs::read(&err).unwrap_or_default()).into_owned();
    let _ = fs::remove_file(&err);
    Run {
        code: status.and_then(|s| s.code()),
        stderr,
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// What is wrong with a run, if anything: an exit code other than 0 or 2, a signal, a hang, a
/// refusal without one short `error:` line first (a schedule's grid may follow), or files written
/// on refusal.
fn fault(r: &Run, out: &Path) -> Option<String> {
    let Some(code) = r.code else {
        return Some(format!("killed by a signal or after {RUN_LIMIT:?}"));
    };
    if code != 0 && code != 2 {
        return Some(format!("exit code {code}"));
    }
    if code == 2 {
        let first = r.stderr.lines().next().unwrap_or_default();
        if !first.starts_with("error: ") || first.len() > MAX_LINE {
            return Some(format!(
                "the refusal's first line is `{}`",
                &first[..first.len().min(MAX_LINE)]
            ));
        }
        let grid = |l: &str| {
            ["position", "rank ", "  rank "]
                .iter()
                .any(|p| l.starts_with(p))
        };
        if let Some(l) = r
            .stderr
            .lines()
            .skip(1)
            .find(|l| !grid(l) || l.len() > MAX_LINE)
        {
            return Some(format!("a second line `{}`", &l[..l.len().min(MAX_LINE)]));
        }
        let written: Vec<PathBuf> = fs::read_dir(out)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        if !written.is_empty() {
            return Some(format!("wrote {written:?} while refusing"));
        }
    }
    None
}

#[test]
fn damaged_files_through_every_command_exit_0_or_2_quickly_and_write_nothing_on_refusal() {
    let (seed, cases) = fuzz::settings("fuzz_cli", DEFAULT_CASES);
    let root = scratch("fuzz-cli");
    // A real checkpoint to damage: steps 1 and 2 of the small run.
    let save = small_train(&[
        "--steps",
        "2",
        "--checkpoint",
        "ck",
        "--checkpoint-every",
        "1",
    ]);
    let save: Vec<&str> = save.iter().map(String::as_str).collect();
    let (code, _, err) = pipefill_in(Some(&root), &[&save[..], &["--svg", "t.svg"]].concat());
    assert_eq!(code, 0, "the checkpoint run failed: {err}");
    let pristine = root.join("ck");
    let mut faults = Vec::new();
    let mut summary = Vec::new();
    for reader in readers(&pristine) {
        // The valid inputs pass (each through one of the commands), or the damage tests nothing.
        for (i, (name, bytes)) in reader.valid.iter().enumerate() {
            let command = reader.commands[i % reader.commands.len()];
            let dir = root.join(format!("valid-{i}"));
            fs::create_dir_all(dir.join("out")).expect("a case folder");
            let args = if reader.name == "--cost flag" {
                command(&String::from_utf8_lossy(bytes))
            } else if reader.name.starts_with("checkpoint") || reader.name == "rank file" {
                copy_dir(&pristine, &dir.join("ck"));
                command(name)
            } else {
                fs::write(dir.join(name), bytes).expect("write the valid file");
                command(name)
            };
            let r = run(&dir, &args);
            assert_eq!(
                r.code,
                Some(0),
                "{} valid {i}: {args:?}: {}",
                reader.name,
                r.stderr
            );
            fs::remove_dir_all(&dir).ok();
        }
        let mut codes: BTreeMap<String, usize> = BTreeMap::new();
        let mut slowest = 0.0f64;
        for case in cases.clone() {
            let mut rng = fuzz::rng(seed, reader.name, case);
            let (name, bytes) = &reader.valid[rng.random_range(0..reader.valid.len())];
            let command = reader.commands[rng.random_range(0..reader.commands.len())];
            let damaged = fuzz::mutate(&mut rng, bytes, reader.text);
            let dir = root.join(format!("case-{case}"));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(dir.join("out")).expect("a case folder");
            let args = if reader.name == "--cost flag" {
                // A flag's text: as one argument (a NUL cannot be passed; it ends the text), at
                // most 60,000 characters (the kernel refuses an argument of 128 KiB).
                let text: String = String::from_utf8_lossy(&damaged)
                    .replace('\0', "")
                    .chars()
                    .take(60_000)
                    .collect();
                command(&text)
            } else if reader.name.starts_with("checkpoint") || reader.name == "rank file" {
                copy_dir(&pristine, &dir.join("ck"));
                fs::write(dir.join("ck/step-00000002").join(name), &damaged).expect("damage");
                command(name)
            } else {
                fs::write(dir.join(name), &damaged).expect("write the damaged file");
                command(name)
            };
            let r = run(&dir, &args);
            slowest = slowest.max(r.seconds);
            let code = r
                .code
                .map_or("signal/timeout".to_string(), |c| c.to_string());
            *codes.entry(code).or_default() += 1;
            if let Some(f) = fault(&r, &dir.join("out")) {
                let kept = root.join(format!("fault-{}-{case}", reader.name.replace(' ', "-")));
                let _ = fs::rename(&dir, &kept);
                faults.push(format!(
                    "{} case {case} (PIPEFILL_FUZZ_SEED={seed}): {f}; args {args:?}; input kept in {}; stderr: {}",
                    reader.name,
                    kept.display(),
                    r.stderr.chars().take(600).collect::<String>()
                ));
            } else {
                let _ = fs::remove_dir_all(&dir);
            }
        }
        summary.push(format!(
            "{}: {} runs, exit codes {codes:?}, slowest {slowest:.2} s",
            reader.name,
            cases.len()
        ));
    }
    for s in &summary {
        eprintln!("{s}");
    }
    assert!(
        faults.is_empty(),
        "{} faults:\n{}",
        faults.len(),
        faults.join("\n")
    );
    fs::remove_dir_all(&root).ok();
}
