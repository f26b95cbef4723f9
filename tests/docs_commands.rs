//! Every `pipefill` command the README and the guides show runs as written.
//!
//! The commands are read from the Markdown itself, so a changed flag, default or output breaks this
//! test, not a reader:
//! - in `sh` blocks, each `pipefill ...` or `cargo run --release -- ...` line (continuations joined,
//!   the trailing `# comment` dropped) must exit 0, in a fresh folder per block (the commands of one
//!   block share it, as a reader running them one after another would);
//! - in `text` blocks, each `$ pipefill ...` line is a transcript: the lines after it, up to the next
//!   `$` or the block's end, are its exact output: stdout, or stderr (and exit 2) when they start
//!   with `error:`.
//!
//! Every folder starts with what the docs tell a reader to make first: `costs.json` (the guide's
//! `pipefill profile` command), `model.toml` (the example in docs/formats.md) and the files a comment
//! spells out (`# dead.csv: "0F0,0B0" / "1F0,1B0"`: one quoted string per line).
//!
//! Left out, and listed when the test runs: lines with placeholders (`NAME`, `[--flag]`, `a|b`),
//! `bench` (minutes of solving, or a GPU). Lines that need a GPU (`--backend cuda`, and the GPU
//! guide's `profile --backend cuda` and `bench overlap`) must succeed where a GPU is usable and
//! otherwise exit 2 naming CUDA (with `PIPEFILL_REQUIRE_GPU=1`: succeed). One documented story
//! needs a kill: a line whose comment says `killed at step N` is stopped once its checkpoint
//! folder holds a checkpoint at or after step N rounded down to `--checkpoint-every`, as the
//! reader's run was.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::pipefill_in;

/// The documents whose commands are run.
const DOCS: [&str; 4] = ["README.md", "docs/cli.md", "docs/formats.md", "docs/gpu.md"];

/// One command shown in a document.
#[derive(Debug, Clone)]
struct Shown {
    /// `file:line`, for messages.
    at: String,
    /// The arguments after `pipefill`.
    args: Vec<String>,
    /// The comment after `#`, if any.
    comment: String,
    /// For a transcript, the output shown under it.
    output: Option<String>,
}

/// A fenced block's commands.
type Block = Vec<Shown>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `args` of a shell line, if it runs pipefill; the comment split off.
fn command(line: &str) -> Option<(Vec<String>, String)> {
    let (code, comment) = match line.find(" #") {
        Some(i) => (&line[..i], line[i + 2..].trim().to_string()),
        None => (line, String::new()),
    };
    let code = code.trim();
    let rest = code
        .strip_prefix("cargo run --release -- ")
        .or_else(|| code.strip_prefix("pipefill "))?;
    Some((
        rest.split_whitespace().map(str::to_string).collect(),
        comment,
    ))
}

/// The blocks of `doc` that show pipefill commands.
fn blocks(doc: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(root().join(doc)).expect("read the document");
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((_, line)) = lines.next() {
        let Some(lang) = line.strip_prefix("```") else {
            continue;
        };
        let transcript = lang.trim() == "text";
        let shell = matches!(lang.trim(), "" | "sh" | "bash");
        let mut body: Vec<(usize, String)> = Vec::new();
        // A line ending in `\` continues on the next one; the joined line is numbered by its first.
        let mut pending: Option<(usize, String)> = None;
        for (n, l) in lines.by_ref() {
            if l.starts_with("```") {
                break;
            }
            let (first, mut joined) = pending.take().unwrap_or((n + 1, String::new()));
            match l.trim_end().strip_suffix('\\') {
                Some(head) => {
                    joined.push_str(head.trim());
                    joined.push(' ');
                    pending = Some((first, joined));
                }
                None if joined.is_empty() => body.push((first, l.to_string())),
                None => {
                    joined.push_str(l.trim());
                    body.push((first, joined));
                }
            }
        }
        let mut block = Vec::new();
        for (i, (n, l)) in body.iter().enumerate() {
            let at = format!("{doc}:{n}");
            if transcript {
                let Some(cmd) = l.strip_prefix("$ ") else {
                    continue;
                };
                let Some((args, comment)) = command(cmd) else {
                    continue;
                };
                let shown: Vec<&str> = body[i + 1..]
                    .iter()
                    .map(|(_, o)| o.as_str())
                    .take_while(|o| !o.starts_with("$ "))
                    .collect();
                block.push(Shown {
                    at,
                    args,
                    comment,
                    output: Some(shown.join("\n")),
                });
            } else if shell {
                if let Some((args, comment)) = command(l) {
                    block.push(Shown {
                        at,
                        args,
                        comment,
                        output: None,
                    });
                }
            }
        }
        if !block.is_empty() {
            out.push(block);
        }
    }
    out
}

/// Why a shown command is not run, if it is not.
fn left_out(s: &Shown) -> Option<&'static str> {
    let placeholder = s.args.iter().any(|a| {
        a.contains('[')
            || a.contains('|')
            || a.contains("...")
            || (!a.is_empty() && a.chars().all(|c| c.is_ascii_uppercase()))
    });
    if placeholder {
        Some("placeholders")
    } else if s.args.first().is_some_and(|a| a == "bench") {
        Some("bench: minutes of solving, or a GPU")
    } else {
        None
    }
}

/// Whether the command needs a GPU to succeed.
fn needs_gpu(s: &Shown) -> bool {
    let joined = s.args.join(" ");
    joined.contains("--backend cuda")
        || (s.at.starts_with("docs/gpu.md") && joined == "bench overlap")
}

/// The files a comment spells out: `# NAME: "row" / "row"`.
fn spelled_files(comment: &str) -> Vec<(String, String)> {
    let Some((name, rows)) = comment.split_once(": ") else {
        return Vec::new();
    };
    if name.contains(' ') || !name.contains('.') || !rows.starts_with('"') {
        return Vec::new();
    }
    let lines: Vec<&str> = rows
        .split(" / ")
        .map(|r| r.trim().trim_matches('"'))
        .collect();
    vec![(name.to_string(), format!("{}\n", lines.join("\n")))]
}

/// `model.toml`: the example model of docs/formats.md.
fn model_toml() -> String {
    let text = std::fs::read_to_string(root().join("docs/formats.md")).expect("read formats.md");
    let start = text
        .find("```toml\n")
        .expect("formats.md shows a model.toml")
        + 8;
    let end = start + text[start..].find("```").expect("its block ends");
    text[start..end].to_string()
}

/// A fresh folder holding what the docs tell a reader to make first.
fn folder(tag: &str, costs: &Path) -> PathBuf {
    let dir = common::scratch(&format!("docs-{tag}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("clear the folder");
    }
    std::fs::create_dir_all(dir.join("docs")).expect("make the folder");
    std::fs::copy(costs, dir.join("costs.json")).expect("copy costs.json");
    std::fs::write(dir.join("model.toml"), model_toml()).expect("write model.toml");
    dir
}

/// Runs `args` in `dir`, killing it once `dir/<checkpoint>` holds a checkpoint at or after `step`.
fn run_until_checkpoint(dir: &Path, args: &[String], step: usize) -> Result<(), String> {
    let bin = std::env::var_os("PIPEFILL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pipefill")));
    let folder = args
        .iter()
        .position(|a| a == "--checkpoint")
        .and_then(|i| args.get(i + 1))
        .ok_or("no --checkpoint folder to watch")?;
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let reached = std::fs::read_dir(dir.join(folder)).ok().is_some_and(|rd| {
            rd.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("step-")
                    .and_then(|n| n.parse::<usize>().ok())
                    .is_some_and(|n| n >= step && e.path().join("manifest.json").exists())
            })
        });
        if reached {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(());
        }
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!(
                "ended ({status}) before a checkpoint at step {step}"
            ));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("no checkpoint within 600 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The step a `killed at step N` comment stops at, rounded down to `--checkpoint-every`.
fn kill_step(s: &Shown) -> Option<usize> {
    let n: usize = s
        .comment
        .split("killed at step ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let every: usize = s
        .args
        .iter()
        .position(|a| a == "--checkpoint-every")
        .and_then(|i| s.args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    Some(n / every * every)
}

/// Runs one shown command in `dir`; `Err` says what differs from the docs.
fn check(dir: &Path, s: &Shown) -> Result<(), String> {
    for (name, body) in spelled_files(&s.comment) {
        std::fs::write(dir.join(name), body).map_err(|e| e.to_string())?;
    }
    if let Some(step) = kill_step(s) {
        return run_until_checkpoint(dir, &s.args, step);
    }
    let args: Vec<&str> = s.args.iter().map(String::as_str).collect();
    let (code, out, err) = pipefill_in(Some(dir), &args);
    let first_err = err.lines().next().unwrap_or("").to_string();
    if needs_gpu(s) {
        let require = std::env::var("PIPEFILL_REQUIRE_GPU").is_ok_and(|v| v == "1");
        return match code {
            0 => Ok(()),
            2 if !require && err.contains("CUDA") => Ok(()),
            _ => Err(format!(
                "exit {code} (a GPU line: 0, or 2 naming CUDA): {first_err}"
            )),
        };
    }
    match &s.output {
        Some(shown) if shown.starts_with("error:") => {
            if code != 2 {
                return Err(format!("exit {code}, the docs show an error (exit 2)"));
            }
            differs(shown, &err)
        }
        Some(shown) => {
            if code != 0 {
                return Err(format!("exit {code}: {first_err}"));
            }
            differs(shown, &out)
        }
        None if code == 0 => Ok(()),
        None => Err(format!("exit {code}: {first_err}")),
    }
}

/// `Err` naming the first line where `got` differs from the `shown` output.
fn differs(shown: &str, got: &str) -> Result<(), String> {
    let want: Vec<&str> = shown.trim_end().lines().map(str::trim_end).collect();
    let have: Vec<&str> = got.trim_end().lines().map(str::trim_end).collect();
    if want == have {
        return Ok(());
    }
    let i = want
        .iter()
        .zip(&have)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(have.len()));
    Err(format!(
        "output differs from the docs at its line {}:\n  docs: {:?}\n  got:  {:?}",
        i + 1,
        want.get(i).unwrap_or(&"(nothing)"),
        have.get(i).unwrap_or(&"(nothing)")
    ))
}

#[test]
fn every_documented_command_runs_as_written() {
    // costs.json as the CLI guide makes it (its first `profile ... --out costs.json` line).
    let all: Vec<(usize, Block)> = DOCS.iter().flat_map(|d| blocks(d)).enumerate().collect();
    let profile = all
        .iter()
        .flat_map(|(_, b)| b)
        .find(|s| {
            s.args.first().is_some_and(|a| a == "profile")
                && s.args.iter().any(|a| a == "costs.json")
                && !needs_gpu(s)
        })
        .expect("the docs show how to make costs.json");
    let base = common::scratch("docs-costs");
    std::fs::write(base.join("model.toml"), model_toml()).expect("write model.toml");
    let args: Vec<&str> = profile.args.iter().map(String::as_str).collect();
    let (code, _, err) = pipefill_in(Some(&base), &args);
    assert_eq!(code, 0, "{}: {err}", profile.at);
    let costs = base.join("costs.json");

    let mut ran = 0;
    let mut failures = Vec::new();
    for (i, block) in &all {
        let dir = folder(&i.to_string(), &costs);
        for s in block {
            if let Some(why) = left_out(s) {
                println!("left out ({why}): {} pipefill {}", s.at, s.args.join(" "));
                continue;
            }
            ran += 1;
            let started = Instant::now();
            let result = check(&dir, s);
            println!(
                "{:6.1} s  {} pipefill {}",
                started.elapsed().as_secs_f64(),
                s.at,
                s.args.join(" ")
            );
            if let Err(e) = result {
                failures.push(format!("{}: pipefill {}\n  {e}", s.at, s.args.join(" ")));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&base);
    println!("{ran} documented commands run");
    assert!(
        ran >= 30,
        "only {ran} documented commands found: is the parsing right?"
    );
    assert!(
        failures.is_empty(),
        "{} of {ran} documented commands fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
