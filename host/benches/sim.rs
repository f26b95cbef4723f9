//! Simulator throughput: actions per second at three sizes up to P = 64, M = 4096, V = 4 (criterion
//! reports elements/s = actions/s).
//!
//! For each size, three measurements in the same run:
//! - `scan`: the baseline, one pass that reads every item of the schedule (the least any simulator must do);
//! - `simulate`: the full simulation (timeline with every span and transfer, memory, critical path, bound);
//! - `simulate-spans`: `simulate_with(.., SimOptions::SPANS)`, the timeline's spans without transfers
//!   or critical path;
//! - `summarize`: the same simulation without recording the timeline (what a plan search uses).
//!
//! Time is the benchmark thread's CPU time (from `/proc/thread-self/schedstat`, user + kernel, so page
//! faults of the timeline's memory count), not wall time: the machines this is run on are shared, and
//! wall time there measures the neighbours. Where the file cannot be read, wall time is used.
//!
//! `cargo bench -p pipefill-host --bench sim`; as every bench, it takes criterion's baseline flags and
//! prints one `pipefill-bench` line per figure (docs/benchmarks.md, "Benchmarks as a regression run").

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_host::sim::{simulate, simulate_with, summarize, SimOptions};

#[allow(dead_code)]
#[path = "../../benches/support/mod.rs"]
mod support;

/// `(family, P, M, V)`.
const SIZES: &[(&str, usize, usize, usize)] = &[
    ("interleaved-1f1b", 8, 64, 2),
    ("interleaved-zb", 16, 512, 4),
    ("interleaved-1f1b", 64, 4096, 4),
];

/// This thread's CPU time in nanoseconds, if the kernel reports it.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Runs `f` `iters` times and returns the CPU time it took (wall time as a fallback).
fn timed<R>(iters: u64, mut f: impl FnMut() -> R) -> Duration {
    let cpu0 = thread_cpu_ns();
    let wall0 = Instant::now();
    for _ in 0..iters {
        black_box(f());
    }
    match (cpu0, thread_cpu_ns()) {
        (Some(a), Some(b)) if b > a => Duration::from_nanos(b - a),
        _ => wall0.elapsed(),
    }
}

/// The baseline: read every item once.
fn scan(s: &Schedule) -> usize {
    s.actions
        .iter()
        .flatten()
        .flat_map(|i| i.actions())
        .map(|a| a.stage ^ a.microbatch)
        .sum()
}

fn bench_simulate(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim");
    group.sample_size(10);
    for &(name, p, m, v) in SIZES {
        let params = Params {
            ranks: p,
            microbatches: m,
            chunks: Some(v),
            group_size: None,
        };
        let schedule = match families::generate(name, &params) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("skipping {name} P={p} M={m} V={v}: {e}");
                continue;
            }
        };
        let costs = CostModel::uniform(
            StageCost::uniform(1.0 / v as f64, 0.5 / v as f64, 0.5 / v as f64),
            schedule.stages(),
            LinkCost {
                latency: 0.01,
                bandwidth: 1e9,
            },
        );
        let actions = schedule.action_count() as u64;
        let id = format!("{name}_P{p}_M{m}_V{v}_{actions}actions");
        group.throughput(Throughput::Elements(actions));
        group.bench_with_input(BenchmarkId::new("scan", &id), &schedule, |b, s| {
            b.iter_custom(|n| timed(n, || scan(s)))
        });
        group.bench_with_input(BenchmarkId::new("simulate", &id), &schedule, |b, s| {
            b.iter_custom(|n| timed(n, || simulate(s, &costs).map(|r| r.timeline.makespan())))
        });
        group.bench_with_input(
            BenchmarkId::new("simulate-spans", &id),
            &schedule,
            |b, s| {
                b.iter_custom(|n| {
                    timed(n, || {
                        simulate_with(s, &costs, SimOptions::SPANS).map(|r| r.timeline.makespan())
                    })
                })
            },
        );
        group.bench_with_input(BenchmarkId::new("summarize", &id), &schedule, |b, s| {
            b.iter_custom(|n| timed(n, || summarize(s, &costs).map(|r| r.makespan)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_simulate);

fn main() -> ExitCode {
    // Thread CPU time: two quick runs under load 10 on 2 cores differed by at most 14% (docs/measurements.md).
    let run = support::Run::start("sim").criterion_threshold(0.20);
    benches();
    Criterion::default().configure_from_args().final_summary();
    run.finish_criterion()
}
