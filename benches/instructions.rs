//! The deterministic regression suite: instructions (and estimated cycles) of the hot paths,
//! counted by callgrind, one single-threaded run per case (`benches/support/callgrind.rs`).
//!
//! ```sh
//! cargo bench --bench instructions                                # all cases, saved as `base`
//! cargo bench --bench instructions -- --save-baseline main
//! cargo bench --bench instructions -- --baseline main             # REGRESSION lines, exit 1
//! cargo bench --bench instructions -- sim/                        # a filter, as criterion's
//! ```
//!
//! Each case prints two `pipefill-bench` lines, `instructions/<case>/Ir` (instructions executed)
//! and `instructions/<case>/cycles` (callgrind's estimate with fixed caches), both `better=lower`.
//! The counts do not depend on the machine's load, so a shared CI runner can gate on them
//! (`docs/benchmarks-ci.md`). Needs valgrind (`apt-get install valgrind`).

use std::hint::black_box;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;

use pipefill::checkpoint::{file, store, RankState, StageState};
use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::ModelSpec;
use pipefill_host::auto::{solve, AutoRequest, MemoryLimit};
use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::partition::{optimal_with_budget, Layout, Problem};
use pipefill_host::runtime::{Executor, Stage, Tensor};
use pipefill_host::schedule::lower::lower;
use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{families, Params, Placement, Schedule};
use pipefill_host::sim::{lower_bound, simulate};
use pipefill_kernels::Activation;

#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

#[path = "support/empty_stage.rs"]
mod empty_stage;

use support::callgrind::{self, pipefill_measured, CYCLES_THRESHOLD, IR_THRESHOLD};

/// The work a case counts, built by its setup (which is not counted). An error fails the case, so
/// that work cut short is never reported as a smaller count.
type Work = Box<dyn FnMut() -> Result<(), String>>;

/// One case: its name (the figures are `instructions/<name>/Ir` and `.../cycles`), what the counts
/// are divided by (actions, for a per-action figure) and its setup.
struct Case {
    name: String,
    per: u64,
    unit_suffix: &'static str,
    setup: Box<dyn Fn() -> Result<Work, String> + Send + Sync>,
}

impl Case {
    fn new(name: String, setup: impl Fn() -> Result<Work, String> + Send + Sync + 'static) -> Self {
        Case {
            name,
            per: 1,
            unit_suffix: "",
            setup: Box::new(setup),
        }
    }
}

/// The large interleaved case for generation, validation and lowering: P = 64, M = 1024, V = 4
/// (524,288 actions, the size of the `schedule` bench).
const SCHEDULE: (usize, usize, usize) = (64, 1024, 4);
/// The simulator's two sizes: 65,536 and 1,048,576 actions of interleaved 1F1B.
const SIM_SMALL: (usize, usize, usize) = (32, 256, 4);
const SIM_LARGE: (usize, usize, usize) = (64, 2048, 4);

/// Interleaved 1F1B with `(P, M, V)`, checked to have `2 P V M` actions.
fn interleaved((p, m, v): (usize, usize, usize)) -> Result<Schedule, String> {
    let s = families::generate("interleaved-1f1b", &Params::new(p, m).with_chunks(v))
        .map_err(|e| e.to_string())?;
    if s.action_count() != 2 * p * v * m {
        return Err(format!(
            "interleaved-1f1b P={p} M={m} V={v} has {} actions, the case's name says {}",
            s.action_count(),
            2 * p * v * m
        ));
    }
    Ok(s)
}

fn id((p, m, v): (usize, usize, usize)) -> String {
    format!("interleaved-1f1b_P{p}_M{m}_V{v}_{}actions", 2 * p * v * m)
}

/// Uniform stage costs with a link that costs something, as the `sim` bench uses.
fn costs(s: &Schedule) -> CostModel {
    let v = s.chunks as f64;
    CostModel::uniform(
        StageCost::uniform(1.0 / v, 0.5 / v, 0.5 / v),
        s.stages(),
        LinkCost {
            latency: 0.01,
            bandwidth: 1e9,
        },
    )
}

/// `auto`'s request: four ranks, uneven stages, at most two microbatches in flight, a fixed work
/// budget and seed. The budget is counted in work units, not measured in time
/// (`AutoRequest::time_budget`), and it binds here: the seeds miss the bound under this limit, so
/// the improvement phase spends all of it (`pipefill schedule --schedule auto` with these costs
/// simulates 479 candidates at 0.05, 2,059 at 0.2). No free overlap (`overlap_share` 1): with it
/// the pairing pass proves this case optimal early and the budget no longer binds.
fn auto_request() -> AutoRequest {
    let mut costs = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
    costs.stages[0] = StageCost::uniform(1.5, 1.2, 1.1);
    costs.stages[3] = StageCost::uniform(1.4, 1.6, 1.3);
    costs.overlap_share = 1.0;
    AutoRequest::new(4, 12, costs)
        .with_limit(MemoryLimit::InFlight(2.0))
        .with_budget(0.05, 7)
}

/// 256 layers with uneven times (a heavy first and last layer), into 8 ranks x 2 chunks.
fn partition_problem() -> Problem {
    let times: Vec<u64> = (0..256u64)
        .map(|l| match l {
            0 | 255 => 30_000,
            _ => 10_000 + (l * 7919) % 5_000,
        })
        .collect();
    Problem::from_times(&times)
}

/// The layers' case: one stage of two 256 x 256 GELU layers, 32 rows.
const ROWS: usize = 32;
const WIDTH: usize = 256;

fn layer_stage() -> Result<(LinearStage, Tensor), String> {
    let spec = ModelSpec::uniform(3, WIDTH, WIDTH, Activation::Gelu, LossKind::Mse, ROWS)
        .map_err(|e| e.to_string())?;
    let mut stages = spec
        .build_stages(
            &[0..1, 1..3],
            Optimizer::sgd(0.01),
            GemmBackend::default(),
            1,
        )
        .map_err(|e| e.to_string())?;
    let stage = stages.pop().ok_or("no stage built")?;
    let x: Vec<f32> = (0..ROWS * WIDTH)
        .map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5)
        .collect();
    Ok((
        stage,
        Tensor::matrix(ROWS, WIDTH, x).map_err(|e| e.to_string())?,
    ))
}

/// The checkpoint's rank: two stages of four 256 x 256 layers (AdamW state included).
fn checkpoint_rank() -> Result<RankState, String> {
    let spec = ModelSpec::uniform(8, WIDTH, WIDTH, Activation::Gelu, LossKind::Mse, ROWS)
        .map_err(|e| e.to_string())?;
    let stages = spec
        .build_stages(
            &[0..4, 4..8],
            Optimizer::adamw(1e-3),
            GemmBackend::default(),
            1,
        )
        .map_err(|e| e.to_string())?;
    let mut stages: Vec<StageState> = stages
        .iter()
        .enumerate()
        .map(|(i, s)| StageState::of(i, s))
        .collect();
    // AdamW's moments as after a step (a fresh stage has none yet).
    let moments = |v: &[f32]| {
        [
            v.iter().map(|x| 0.1 * x).collect(),
            v.iter().map(|x| x * x).collect(),
        ]
    };
    for l in stages.iter_mut().flat_map(|s| s.layers.iter_mut()) {
        l.weight_moments = moments(&l.weight);
        l.bias_moments = moments(&l.bias);
    }
    Ok(RankState {
        rank: 0,
        step: 3,
        stages,
    })
}

/// A folder for the checkpoint cases, the same length in every run (the path's length would
/// change the count).
fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("pipefill-instructions-{:010}", std::process::id()))
}

/// Boxes the counted work; its result is passed through `black_box`, its error made a string.
fn work<T, E: std::fmt::Display>(
    mut f: impl FnMut() -> Result<T, E> + 'static,
) -> Result<Work, String> {
    Ok(Box::new(move || {
        black_box(f()).map(|_| ()).map_err(|e| e.to_string())
    }))
}

/// The executor's step: 1F1B on one rank, `M = 64`, empty stages.
const EXECUTOR_M: usize = 64;

fn executor_schedule() -> Result<Schedule, String> {
    families::generate("1f1b", &Params::new(1, EXECUTOR_M)).map_err(|e| e.to_string())
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let sched = SCHEDULE;
    cases.push(Case::new(
        format!("schedule/generate/{}", id(sched)),
        move || {
            interleaved(sched)?;
            work(move || interleaved(black_box(sched)).map(|s| s.action_count()))
        },
    ));
    cases.push(Case::new(
        format!("schedule/validate/{}", id(sched)),
        move || {
            let s = interleaved(sched)?;
            work(move || validate(black_box(&s)).map(|r| r.makespan_slots))
        },
    ));
    cases.push(Case::new(
        format!("schedule/lower/{}", id(sched)),
        move || {
            let s = interleaved(sched)?;
            work(move || lower(black_box(&s)).map(|l| l.action_count()))
        },
    ));
    for size in [SIM_SMALL, SIM_LARGE] {
        cases.push(Case::new(format!("sim/simulate/{}", id(size)), move || {
            let s = interleaved(size)?;
            let c = costs(&s);
            work(move || simulate(black_box(&s), &c).map(|r| r.timeline.makespan()))
        }));
    }
    cases.push(Case::new(
        format!("sim/lower_bound/{}", id(SIM_LARGE)),
        || {
            let s = interleaved(SIM_LARGE)?;
            let c = costs(&s);
            work(move || Ok::<_, String>(lower_bound(black_box(&s), &c)))
        },
    ));
    cases.push(Case::new(
        "auto/P4_M12_V1_inflight2_budget0.05_seed7".into(),
        || {
            let req = auto_request();
            work(move || solve(black_box(&req)).map(|a| a.solver.value))
        },
    ));
    cases.push(Case::new("partition/optimal_L256_P8_V2".into(), || {
        let problem = partition_problem();
        let layout = Layout {
            ranks: 8,
            chunks: 2,
            placement: Placement::Looped,
        };
        work(move || {
            optimal_with_budget(black_box(&problem), &layout, None, 200_000).map(|p| p.bottleneck)
        })
    }));
    let mut executor = Case::new(
        format!("executor/step_1f1b_P1_M{EXECUTOR_M}_per_action"),
        || {
            let schedule = executor_schedule()?;
            let stages = (0..schedule.stages()).map(|_| empty_stage::Empty).collect();
            let mut ex = Executor::new(schedule, stages).map_err(|e| e.to_string())?;
            let targets = vec![Tensor::empty(); EXECUTOR_M];
            // One step first, so that the counted one is a steady-state step.
            ex.step(
                vec![Tensor::empty(); EXECUTOR_M],
                &targets,
                &empty_stage::zero_loss,
            )
            .map_err(|e| e.to_string())?;
            work(move || {
                let inputs = vec![Tensor::empty(); EXECUTOR_M];
                ex.step(inputs, &targets, &empty_stage::zero_loss)
            })
        },
    );
    executor.per = executor_schedule().map_or(1, |s| s.action_count() as u64);
    executor.unit_suffix = "/action";
    cases.push(executor);
    cases.push(Case::new(
        format!("layers/forward/gelu_2x{WIDTH}x{WIDTH}_rows{ROWS}"),
        || {
            let (mut stage, x) = layer_stage()?;
            let mut input = Some(x);
            work(move || {
                let x = input.take().ok_or("the forward case runs once")?;
                stage.forward(x).map_err(|e| e.to_string())
            })
        },
    ));
    cases.push(Case::new(
        format!("layers/backward/gelu_2x{WIDTH}x{WIDTH}_rows{ROWS}"),
        || {
            let (mut stage, x) = layer_stage()?;
            let (y, stash) = stage.forward(x.clone()).map_err(|e| e.to_string())?;
            let dy = Tensor::matrix(ROWS, WIDTH, y.data().iter().map(|v| v * 0.5).collect())
                .map_err(|e| e.to_string())?;
            let mut inputs = Some((stash, dy));
            work(move || {
                let (mut stash, dy) = inputs.take().ok_or("the backward case runs once")?;
                black_box(stage.backward_input(&mut stash, dy)).map_err(|e| e.to_string())?;
                stage.backward_weight(stash).map_err(|e| e.to_string())
            })
        },
    ));
    cases.push(Case::new(
        "checkpoint/write_rank/2x4x256x256_adamw".into(),
        || {
            let state = checkpoint_rank()?;
            let dir = scratch_dir();
            work(move || store::write_rank(&dir, &state))
        },
    ));
    cases.push(Case::new(
        "checkpoint/read_rank/2x4x256x256_adamw".into(),
        || {
            let state = checkpoint_rank()?;
            let dir = scratch_dir();
            store::write_rank(&dir, &state).map_err(|e| e.to_string())?;
            let path = store::step_dir(&dir, state.step).join(store::rank_file_name(state.rank));
            work(move || {
                let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                file::decode(&bytes, &path)
                    .map(|s| s.stages.len())
                    .map_err(|e| e.to_string())
            })
        },
    ));
    cases
}

/// The child: build case `name`'s inputs, then run its work once inside the counted function.
fn child(name: &str) -> ExitCode {
    let Some(case) = cases().into_iter().find(|c| c.name == name) else {
        eprintln!("error: bench instructions: no case named `{name}`");
        return ExitCode::from(2);
    };
    let result = (case.setup)();
    let status = match result {
        Ok(mut w) => match pipefill_measured(&mut *w) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: bench instructions: case {name}: {e}");
                ExitCode::from(2)
            }
        },
        Err(e) => {
            eprintln!("error: bench instructions: case {name}: {e}");
            ExitCode::from(2)
        }
    };
    let _ = std::fs::remove_dir_all(scratch_dir());
    status
}

fn main() -> ExitCode {
    if let Ok(name) = std::env::var(callgrind::CASE_VAR) {
        return child(&name);
    }
    let mut run = support::Run::start("instructions");
    let all = cases();
    let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
    if !run.should_measure(run.args.filter(), &names) {
        return ExitCode::SUCCESS;
    }
    let selected: Vec<&Case> = all
        .iter()
        .filter(|c| run.args.selects(run.args.filter(), &c.name))
        .collect();
    let valgrind = match callgrind::find_valgrind() {
        Ok(v) => v,
        Err(e) if std::env::var(callgrind::REQUIRE_VAR).as_deref() != Ok("1") => {
            println!(
                "skipped: instructions: {e} (set {}=1 to fail instead)",
                callgrind::REQUIRE_VAR
            );
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: bench instructions: {e}");
            return ExitCode::from(2);
        }
    };
    let prepared = std::env::current_exe()
        .map_err(|e| format!("cannot find this binary: {e}"))
        .and_then(|exe| Ok((exe, callgrind::jobs()?)));
    let (exe, jobs) = match prepared {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: bench instructions: {e}");
            return ExitCode::from(2);
        }
    };
    let dir = std::env::temp_dir().join(format!("pipefill-callgrind-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!(
            "error: bench instructions: cannot create {}: {e}",
            dir.display()
        );
        return ExitCode::from(2);
    }
    // Cases run `jobs` at a time; figures are printed in case order as each finishes.
    let results: Vec<Mutex<Option<Result<callgrind::Counts, String>>>> =
        selected.iter().map(|_| Mutex::new(None)).collect();
    let next = Mutex::new(0usize);
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(selected.len()) {
            scope.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some(case) = selected.get(i) else { break };
                let r = callgrind::count(&valgrind, &exe, &case.name, &dir);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    let mut failed = false;
    for (case, result) in selected.iter().zip(results) {
        match result.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(Ok(counts)) => {
                let per = case.per as f64;
                let name = format!("instructions/{}", case.name);
                let ir = counts.ir() as f64 / per;
                run.lower(
                    &format!("{name}/Ir"),
                    ir,
                    &format!("Ir{}", case.unit_suffix),
                    IR_THRESHOLD,
                );
                if let Some(cycles) = counts.estimated_cycles() {
                    run.lower(
                        &format!("{name}/cycles"),
                        cycles as f64 / per,
                        &format!("cycles{}", case.unit_suffix),
                        CYCLES_THRESHOLD,
                    );
                }
            }
            Some(Err(e)) => {
                eprintln!("error: bench instructions: {e}");
                failed = true;
            }
            None => {
                eprintln!("error: bench instructions: case {} did not run", case.name);
                failed = true;
            }
        }
    }
    let status = run.finish();
    if failed {
        ExitCode::from(2)
    } else {
        status
    }
}
