//! Fuzzing every reader of outside input at the library level: damaged copies of valid schedule
//! files (text grid, JSON, CSV in both PyTorch forms), cost files (per layer and per stage), the
//! `--cost` flag, model files (TOML and JSON), checkpoint manifests and rank files. For each case
//! the reader must not panic, must return `Ok` or its typed error, must say what is wrong in one
//! line of bounded length, and must finish within a time bound; what it accepts must go on to
//! validate or simulate without a panic or a hang.
//!
//! Seeded and sized from the environment (`tests/fuzz/mod.rs`): `PIPEFILL_FUZZ_SEED`,
//! `PIPEFILL_FUZZ_CASES` (cases per reader). A longer run:
//! `PIPEFILL_FUZZ_CASES=100000 cargo test --release --test fuzz_readers`.

mod fuzz;

use fuzz::valid;

use std::fmt::Display;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use pipefill::checkpoint::{self, file, Manifest, ModelShape, RankFile, FORMAT, FORMAT_VERSION};
use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LossKind, Optimizer};
use pipefill::model::{stage_ranges, ModelSpec};
use pipefill_host::cost::{
    parse_cost_flag, CostFile, CostInput, CostModel, LayerCost, LinkCost, StageCost,
};
use pipefill_host::plan::best_partition;
use pipefill_host::schedule::{families, format, validate::validate, Params};
use pipefill_host::sim::simulate;
use pipefill_kernels::Activation;

/// Cases per reader when `PIPEFILL_FUZZ_CASES` is not set: a few seconds each in CI.
const DEFAULT_CASES: usize = 10_000;

/// The longest error message a reader may give (it excerpts long tokens).
const MAX_ERROR: usize = 600;

/// The longest one case may take before it counts as a hang.
const CASE_LIMIT: Duration = Duration::from_secs(10);

/// What one case's reader returned: accepted, or refused with this message.
type Verdict = Result<(), String>;

/// Runs `cases` damaged copies of the `valid` inputs (round-robin) through `read` on a worker
/// thread. Fails, naming the seed and the case, on a panic, an error message of more than one
/// line or more than [`MAX_ERROR`] bytes, or a case that takes longer than [`CASE_LIMIT`].
/// `text`: whether the reader takes text (damage keeps it UTF-8).
fn campaign<F>(reader: &'static str, valid: Vec<Vec<u8>>, text: bool, read: F)
where
    F: Fn(&[u8]) -> Verdict + Send + 'static,
{
    let (seed, cases) = fuzz::settings(reader, DEFAULT_CASES);
    // The valid inputs themselves must be accepted, or the damage tests nothing.
    for (i, v) in valid.iter().enumerate() {
        if let Err(e) = read(v) {
            panic!("{reader}: valid input {i} refused: {e}");
        }
    }
    let (done, progress) = mpsc::channel::<usize>();
    let work = cases.clone();
    let worker = std::thread::spawn(move || {
        let (mut accepted, mut refused) = (0usize, 0usize);
        if std::env::var_os("PIPEFILL_FUZZ_SHOW").is_some() {
            for case in work.clone() {
                let mut rng = fuzz::rng(seed, reader, case);
                let input = fuzz::mutate(&mut rng, &valid[case % valid.len()], text);
                eprintln!("{reader} case {case}: {}", String::from_utf8_lossy(&input));
            }
        }
        for case in work {
            let mut rng = fuzz::rng(seed, reader, case);
            let input = fuzz::mutate(&mut rng, &valid[case % valid.len()], text);
            let replay = format!(
                "{reader} case {case} (PIPEFILL_FUZZ_SEED={seed}), input {:?}",
                excerpt(&input)
            );
            let verdict = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(&input)))
                .unwrap_or_else(|_| panic!("{replay}: the reader panicked"));
            match verdict {
                Ok(()) => accepted += 1,
                Err(e) => {
                    refused += 1;
                    check_message(&e)
                        .unwrap_or_else(|why| panic!("{replay}: {why}: {}", excerpt(e.as_bytes())));
                }
            }
            if done.send(case).is_err() {
                break;
            }
        }
        (accepted, refused)
    });
    let mut last = None;
    loop {
        match progress.recv_timeout(CASE_LIMIT) {
            Ok(case) => last = Some(case),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let case = last.map_or(cases.start, |c| c + 1);
                panic!(
                    "{reader} case {case} (PIPEFILL_FUZZ_SEED={seed}) ran over {CASE_LIMIT:?}: a hang"
                );
            }
        }
    }
    match worker.join() {
        Ok((accepted, refused)) => {
            eprintln!(
                "{reader}: {} cases, {accepted} accepted, {refused} refused",
                cases.len()
            )
        }
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Whether `e` is an error message as a user should see it: one line of at most [`MAX_ERROR`]
/// bytes, not blank. The one exception is a schedule's rank lists around a misplaced action (the
/// validator's grid, and a deadlock's waiting ranks): lines that follow the message, each one
/// bounded, at most [`GRID_LINES`] of them.
fn check_message(e: &str) -> Result<(), String> {
    let mut lines = e.split('\n');
    let first = lines.next().unwrap_or_default();
    if first.trim().is_empty() {
        return Err("an empty first line".into());
    }
    let grid = |l: &str| {
        ["position", "rank ", "  rank "]
            .iter()
            .any(|p| l.starts_with(p))
    };
    let mut count = 1;
    for line in std::iter::once(first).chain(lines.by_ref()) {
        if line.contains('\r') {
            return Err("a carriage return".into());
        }
        if line.len() > MAX_ERROR {
            return Err(format!("a line of {} bytes", line.len()));
        }
        if count > 1 && !grid(line) {
            return Err(format!("line {count} is not a schedule grid line"));
        }
        count += 1;
    }
    if count - 1 > GRID_LINES {
        return Err(format!("{} lines", count - 1));
    }
    Ok(())
}

/// The most lines a schedule validation error may show (its message, then its grid).
const GRID_LINES: usize = 24;

/// The start of `input`, for a failure message.
fn excerpt(input: &[u8]) -> String {
    let s = String::from_utf8_lossy(&input[..input.len().min(400)]).into_owned();
    format!("{s}... ({} bytes)", input.len())
}

/// A reader's error as its message.
fn said<E: Display>(e: E) -> String {
    e.to_string()
}

/// Text of damaged input (the mutator keeps text readers' input UTF-8).
fn text(input: &[u8]) -> &str {
    std::str::from_utf8(input).expect("text readers get UTF-8")
}

/// A schedule that was read: validated, then simulated with unit costs (what `simulate
/// --schedule-file` does), so that whatever passes the reader is run too.
fn validate_and_simulate(s: &pipefill_host::schedule::Schedule) -> Verdict {
    validate(s).map_err(said)?;
    let costs = CostModel::uniform(
        StageCost::uniform(1.0, 1.0, 1.0),
        s.stages(),
        LinkCost::default(),
    );
    simulate(s, &costs).map_err(said)?;
    Ok(())
}

#[test]
fn damaged_schedule_files_never_panic_hang_or_ramble() {
    campaign("schedule file", valid::schedule_files(), true, |input| {
        let s = format::read(text(input), "fuzz").map_err(said)?;
        validate_and_simulate(&s)
    });
}

#[test]
fn damaged_cost_files_never_panic_hang_or_ramble() {
    let schedule = families::generate("1f1b", &Params::new(2, 4)).expect("1f1b");
    campaign("cost file", valid::cost_files(), true, move |input| {
        // What the commands do with an accepted file: plan a partition, or simulate the stages.
        match CostInput::parse(text(input)).map_err(said)? {
            CostInput::Layers(f) if f.layers.len() >= schedule.stages() => {
                let plan = best_partition(&f, &schedule, None).map_err(said)?;
                simulate(&plan.schedule, &plan.cost).map_err(said)?;
            }
            CostInput::Layers(_) => {}
            CostInput::Stages(m) if m.stages.len() == schedule.stages() => {
                simulate(&schedule, &m).map_err(said)?;
            }
            CostInput::Stages(_) => {}
        }
        Ok(())
    });
}

#[test]
fn damaged_cost_flags_never_panic_hang_or_ramble() {
    campaign("--cost flag", valid::cost_flags(), true, |input| {
        let stage = parse_cost_flag(text(input)).map_err(said)?;
        let costs = CostModel::uniform(stage, 2, LinkCost::default());
        let s = families::generate("1f1b", &Params::new(2, 2)).map_err(said)?;
        simulate(&s, &costs).map_err(said)?;
        Ok(())
    });
}

#[test]
fn damaged_model_files_never_panic_hang_or_ramble() {
    // The first byte picks the file's extension.
    let valid = valid::model_files()
        .into_iter()
        .map(|(ext, text)| [&ext.as_bytes()[..1], text.as_bytes()].concat())
        .collect();
    campaign("model file", valid, true, |input| {
        // The first byte picks the file's extension; damage to it picks an unknown one.
        let (kind, body) = input
            .split_first()
            .map_or((b'?', &[][..]), |(k, b)| (*k, b));
        let name = match kind {
            b't' => "model.toml",
            b'j' => "model.json",
            _ => "model.txt",
        };
        let body = String::from_utf8_lossy(body);
        ModelSpec::from_text(&body, Path::new(name), 8).map_err(|e| e.0)?;
        Ok(())
    });
}

/// A real checkpoint of a small model in memory: its manifest's text and its rank files' bytes.
fn checkpoint_files() -> (String, Vec<Vec<u8>>) {
    let spec = ModelSpec::uniform(4, 8, 3, Activation::Gelu, LossKind::Mse, 8).expect("a model");
    let schedule = families::generate("interleaved-1f1b", &Params::new(2, 2)).expect("schedule");
    let layers = (0..4)
        .map(|i| LayerCost::new(format!("l{i}"), 1.0, 1.0, 1.0))
        .collect();
    let costs = CostFile {
        layers,
        transfer: LinkCost::default(),
        overlap_share: 0.0,
        meta: serde_json::Value::Null,
    };
    let plan = best_partition(&costs, &schedule, None).expect("a plan");
    let optimizer = Optimizer::adamw(1e-3);
    let stages = spec
        .build_stages(
            &stage_ranges(&plan.layers_per_stage),
            optimizer,
            GemmBackend::default(),
            7,
        )
        .expect("stages");
    let ranks: Vec<Vec<u8>> = checkpoint::rank_states(3, &schedule, &stages)
        .iter()
        .map(file::encode)
        .collect();
    let files = ranks
        .iter()
        .enumerate()
        .map(|(rank, bytes)| RankFile {
            rank,
            file: checkpoint::store::rank_file_name(rank),
            bytes: bytes.len() as u64,
            checksum: file::fnv1a(bytes),
        })
        .collect();
    let manifest = Manifest {
        format: FORMAT.into(),
        version: FORMAT_VERSION,
        step: 3,
        seed: 7,
        model: ModelShape::of(&spec),
        optimizer: optimizer.name().into(),
        lr: checkpoint::learning_rate(&optimizer),
        activations: "f32".into(),
        plan,
        files,
    };
    let text = serde_json::to_string_pretty(&manifest).expect("a manifest");
    (text, ranks)
}

#[test]
fn damaged_checkpoint_manifests_never_panic_hang_or_ramble() {
    let (manifest, _) = checkpoint_files();
    campaign(
        "checkpoint manifest",
        vec![manifest.into_bytes()],
        true,
        |input| {
            let path = Path::new("ck/step-00000003/manifest.json");
            let m = Manifest::parse(text(input), path).map_err(said)?;
            // What a resume does next with the plan it read.
            validate_and_simulate(&m.plan.schedule)?;
            simulate(&m.plan.schedule, &m.plan.cost).map_err(said)?;
            Ok(())
        },
    );
}

#[test]
fn damaged_rank_files_never_panic_hang_or_ramble() {
    let (_, ranks) = checkpoint_files();
    campaign("rank file", ranks, false, |input| {
        // Half the cases carry a checksum that fits the damage, so decoding goes past it.
        let mut bytes = input.to_vec();
        if bytes.len() >= 16 && bytes.len() % 2 == 0 {
            let body = bytes.len() - 8;
            let sum = file::fnv1a(&bytes[..body]);
            bytes[body..].copy_from_slice(&sum.to_le_bytes());
        }
        file::decode(&bytes, Path::new("ck/step-00000003/rank-0.bin")).map_err(said)?;
        Ok(())
    });
}

#[test]
fn the_damage_is_reproducible_from_the_seed() {
    let valid = b"{\"a\": [1, 2.5, -3e10], \"b\": \"x\"}\nline two\n";
    let damage = |seed| {
        (0..50)
            .map(|case| fuzz::mutate(&mut fuzz::rng(seed, "r", case), valid, true))
            .collect::<Vec<_>>()
    };
    assert_eq!(damage(1), damage(1));
    assert_ne!(damage(1), damage(2));
    // Damage happens: most cases differ from the valid input.
    let changed = damage(3).iter().filter(|d| d[..] != valid[..]).count();
    assert!(changed >= 40, "only {changed} of 50 cases damaged");
}
