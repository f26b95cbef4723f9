//! Evidence for the partitioner and the planner: predicted and measured step time of each balancer
//! and of the full plan, on a model with a heavy first and a heavy last layer (like an embedding and
//! an LM head), as ratios to the best, all measured in the same run.
//!
//! ```sh
//! cargo bench --bench partition                      # P = 4, 1f1b, M = 8
//! PIPEFILL_BENCH_STEPS=9 cargo bench --bench partition
//! cargo bench --bench partition -- --quick         # 2 measured steps, 3 profile repeats
//! ```
//!
//! As every bench, it takes criterion's flags (`--save-baseline NAME`, `--baseline NAME`, `--quick`,
//! a filter) and prints one `pipefill-bench` line per figure, `partition/<row>/predicted` and
//! `.../measured` (docs/benchmarks.md, "Benchmarks as a regression run").
//!
//! For each of `uniform`, `parameters`, `time-greedy`, `optimal` (with the same schedule, `1f1b`, and
//! `M = 8`) and the best plan of `pipefill plan` (its own family, V and refined partition; once with
//! `M = 8`, the microbatch size the costs were profiled at, then over every `M` with times scaled
//! linearly (`all M, lin`: the fixed part dropped), by the affine model (`all M, aff`: the fixed
//! part fitted from a second profile at an eighth of the rows) and interpolated between samples
//! (`all M, smp`: every layer also profiled at every power of two up to the batch), as
//! `pipefill profile` does by default):
//!
//! - **predicted**: the simulator's step time from the profiled costs;
//! - **measured**: the median step time of real training steps on CPU threads. When there are more
//!   ranks than cores, the step runs in exclusive mode (one layer call at a time) and the timeline is
//!   rebuilt by the simulator from the measured per-action durations (replay mode, as
//!   `pipefill train --replay`), so time sharing does not distort it.

use std::ops::Range;
use std::process::ExitCode;

use pipefill::cli::profile::{profile_model, Backend, Measure};
use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LossKind, Optimizer};
use pipefill::model::{LayerSpec, ModelSpec, Teacher};
use pipefill_host::cost::{CostFile, CostModel};
use pipefill_host::partition::{Layout, Method, Problem};
use pipefill_host::plan::{plan, PlanRequest};
use pipefill_host::profile::ProfileOptions;
use pipefill_host::runtime::Executor;
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_host::sim::simulate;
use pipefill_kernels::Activation;

const RANKS: usize = 4;
const MICROBATCHES: usize = 8;
const BATCH: usize = 128;

#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

use support::stats::Spread;

/// Input 512 -> "embedding" 1536 -> 1536 x 512 -> eight 512 x 512 blocks -> "head" 512 x 1536:
/// the first, second and last layers each cost about three blocks.
fn model() -> ModelSpec {
    let act = Activation::Gelu;
    let layer = |width, activation| LayerSpec { width, activation };
    let mut layers = vec![layer(1536, act)];
    layers.extend((0..9).map(|_| layer(512, act)));
    layers.push(layer(1536, Activation::Identity));
    ModelSpec {
        input: 512,
        layers,
        loss: LossKind::Mse,
        batch: BATCH,
    }
}

fn ranges(counts: &[usize]) -> Vec<Range<usize>> {
    let mut start = 0;
    counts
        .iter()
        .map(|&n| {
            start += n;
            start - n..start
        })
        .collect()
}

/// Median measured step seconds of `steps` steps after one warm-up step (the upper middle one for
/// an even count), and their spread.
fn measure(
    spec: &ModelSpec,
    schedule: &Schedule,
    counts: &[usize],
    predicted_cost: &CostModel,
    steps: usize,
    replay: bool,
) -> (f64, Option<Spread>) {
    let stages = spec
        .build_stages(
            &ranges(counts),
            Optimizer::sgd(1e-3),
            GemmBackend::Matrixmultiply,
            0,
        )
        .expect("stages");
    let mut ex = Executor::new(schedule.clone(), stages).expect("executor");
    ex.set_exclusive(replay);
    let teacher = Teacher::new(spec, 0);
    let mut times = Vec::new();
    for step in 0..=steps {
        let (x, t) = teacher.batch(step as u64, spec.batch, schedule.microbatches);
        let r = ex.step(x, &t, &spec.loss).expect("step");
        ex.optimizer_step().expect("optimizer step");
        if step == 0 {
            continue;
        }
        let secs = if replay {
            let cost = predicted_cost.with_durations(&r.action_seconds);
            simulate(schedule, &cost)
                .expect("replay")
                .timeline
                .makespan()
        } else {
            r.seconds
        };
        times.push(secs);
    }
    let spread = Spread::of(&times);
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], spread)
}

struct Row {
    name: String,
    detail: String,
    predicted: f64,
    measured: f64,
    spread: Option<Spread>,
}

/// The rows' names, as the figures are named (`partition/<row>/predicted`, `.../measured`).
const ROWS: &[&str] = &[
    "uniform",
    "parameters",
    "time-greedy",
    "optimal",
    "plan M=8",
    "all M, lin",
    "all M, aff",
    "all M, smp",
];

/// Relative change that counts as a regression: the step times here are measured under load on a
/// shared machine and the predictions come from a fresh profile (spread in docs/measurements.md).
const THRESHOLD: f64 = 0.25;

/// `PIPEFILL_BENCH_STEPS` (a positive integer), else 5, or 2 with `--quick`.
fn steps_from_env(quick: bool) -> Result<usize, String> {
    match std::env::var("PIPEFILL_BENCH_STEPS") {
        Err(_) => Ok(if quick { 2 } else { 5 }),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "PIPEFILL_BENCH_STEPS={v:?} is not a positive integer: set it like PIPEFILL_BENCH_STEPS=9, or unset it"
            )),
        },
    }
}

/// Profiled at the microbatch size, at an eighth of it for the fixed part, and at every power of
/// two up to the batch for the samples (as `pipefill profile` does by default).
fn profile(spec: &ModelSpec, quick: bool) -> CostFile {
    let rows = BATCH / MICROBATCHES;
    let sizes: Vec<usize> = (0..8).map(|k| 1 << k).filter(|&s| s <= BATCH).collect();
    let how = Measure {
        backend: Backend::Cpu,
        rows,
        fit_rows: Some(rows / 8),
        sizes,
        gemm: GemmBackend::Matrixmultiply,
        options: ProfileOptions {
            warmup: 2,
            repeats: if quick { 3 } else { 9 },
            ..ProfileOptions::default()
        },
        seed: 0,
        precision: Default::default(),
        activations: Default::default(),
    };
    profile_model(spec, &how).expect("profile")
}

/// One row per balancer, all with `1f1b` and `M = 8`.
fn method_rows(spec: &ModelSpec, costs: &CostFile, steps: usize, replay: bool) -> Vec<Row> {
    let problem = Problem::from_layers(&costs.layers, &costs.transfer).expect("problem");
    let layout = Layout::one_stage_per_rank(RANKS);
    let schedule = families::generate("1f1b", &Params::new(RANKS, MICROBATCHES)).expect("1f1b");
    let mut out = Vec::new();
    for method in [
        Method::Uniform,
        Method::Parameters,
        Method::TimeGreedy,
        Method::Optimal,
    ] {
        let part = method.apply(&problem, &layout, None).expect("partition");
        let counts = part.layers_per_stage();
        let cost = costs.model(&counts).expect("cost model");
        let predicted = simulate(&schedule, &cost).expect("sim").timeline.makespan();
        let (measured, spread) = measure(spec, &schedule, &counts, &cost, steps, replay);
        out.push(Row {
            name: method.name().to_string(),
            detail: format!("1f1b M={MICROBATCHES} {counts:?}"),
            predicted,
            measured,
            spread,
        });
    }
    out
}

/// The plan four times: with M fixed to the profiled microbatch size (costs exact for it), and
/// over every M with costs scaled linearly (fixed part and samples dropped), by the affine model
/// (samples dropped) and interpolated between the sampled sizes.
fn plan_rows(spec: &ModelSpec, costs: &CostFile, steps: usize, replay: bool) -> Vec<Row> {
    let rows = BATCH / MICROBATCHES;
    let mut linear = costs.clone();
    linear.layers.iter_mut().for_each(|l| {
        l.fixed = None;
        l.samples.clear();
    });
    let mut affine = costs.clone();
    affine.layers.iter_mut().for_each(|l| l.samples.clear());
    let mut out = Vec::new();
    for (label, file, counts) in [
        ("plan M=8", costs, vec![MICROBATCHES]),
        ("all M, lin", &linear, vec![]),
        ("all M, aff", &affine, vec![]),
        ("all M, smp", costs, vec![]),
    ] {
        let mut req = PlanRequest::new(file.clone(), rows as f64, RANKS, BATCH);
        req.max_microbatches = 32;
        req.microbatch_counts = counts;
        let report = plan(&req).expect("plan");
        let best = report.best().expect("a plan");
        let (measured, spread) = measure(
            spec,
            &best.schedule,
            &best.layers_per_stage,
            &best.cost,
            steps,
            replay,
        );
        out.push(Row {
            name: label.into(),
            detail: format!(
                "{} V={} M={} {} {:?}",
                best.family, best.chunks, best.microbatches, best.partition, best.layers_per_stage
            ),
            predicted: best.step_time,
            measured,
            spread,
        });
    }
    out
}

fn print_table(spec: &ModelSpec, costs: &CostFile, rows_out: &[Row], steps: usize, replay: bool) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let best_pred = rows_out
        .iter()
        .map(|r| r.predicted)
        .fold(f64::INFINITY, f64::min);
    let best_meas = rows_out
        .iter()
        .map(|r| r.measured)
        .fold(f64::INFINITY, f64::min);
    println!(
        "P={RANKS} batch={BATCH} rows, {} layers (heavy first and last), {cores} cores, {} , median of {steps} steps",
        spec.layers.len(),
        if replay { "replay mode (ranks > cores)" } else { "threads" }
    );
    println!(
        "profiled F+I+W per layer (ms, microbatch of {} rows):",
        BATCH / MICROBATCHES
    );
    println!(
        "  {:?}",
        costs
            .layers
            .iter()
            .map(|l| (l.total() * 1e4).round() / 10.0)
            .collect::<Vec<_>>()
    );
    println!(
        "{:<12} {:>14} {:>8} {:>14} {:>8}  schedule and layers per stage",
        "method", "predicted (s)", "/best", "measured (s)", "/best"
    );
    for r in rows_out {
        println!(
            "{:<12} {:>14.6} {:>8.3} {:>14.6} {:>8.3}  {}",
            r.name,
            r.predicted,
            r.predicted / best_pred,
            r.measured,
            r.measured / best_meas,
            r.detail
        );
    }
    println!("measured steps:");
    for r in rows_out {
        if let Some(sp) = &r.spread {
            println!("  {:<12} {}", r.name, sp.describe(1e3, "ms"));
        }
    }
}

fn main() -> ExitCode {
    let mut run = support::Run::start("partition");
    let names: Vec<String> = ROWS.iter().map(|r| row_name(r)).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    if !run.should_measure(run.args.filter(), &names) {
        return ExitCode::SUCCESS;
    }
    let steps = match steps_from_env(run.quick()) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("error: bench partition: {e}");
            return ExitCode::from(2);
        }
    };
    pipefill::alloc::keep_freed_memory();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let replay = RANKS > cores;
    let spec = model();
    let costs = profile(&spec, run.quick());
    let mut rows_out = method_rows(&spec, &costs, steps, replay);
    rows_out.extend(plan_rows(&spec, &costs, steps, replay));
    print_table(&spec, &costs, &rows_out, steps, replay);
    for r in &rows_out {
        let name = row_name(&r.name);
        run.lower(&format!("{name}/predicted"), r.predicted, "s", THRESHOLD);
        run.lower(&format!("{name}/measured"), r.measured, "s", THRESHOLD);
    }
    run.finish()
}

/// `partition/<row>` with the row's spaces, commas and `=` made `_`-safe, e.g. `partition/all_M_lin`.
fn row_name(row: &str) -> String {
    let slug: String = row
        .chars()
        .filter(|&c| c != ',')
        .map(|c| if c == ' ' || c == '=' { '_' } else { c })
        .collect();
    format!("partition/{slug}")
}
