//! Criterion benches of the runtime.
//!
//! - `executor_overhead`: host time per action with empty layers (no math, empty tensors), for a
//!   1-rank and a 2-rank 1F1B step and a 2-rank ZB-H1 step with `M = 64`. Throughput is in actions,
//!   so criterion prints actions per second; the time per action is the executor's overhead
//!   (thread start, channels, stash bookkeeping, timing), the figure the issue asks to keep < 2 us.
//!   `executor_variants`: the same steps with the stages boxed as `BoxedStage` (type-erased stashes,
//!   virtual calls) and with a no-op step hook (`step_with`), against the plain generic path.
//! - `stream_executor`: the same per-action host time for the one-thread stream executor on the
//!   CPU twin of the CUDA device (`CpuStreams`: the step enqueues every action, the stream workers
//!   run them, one synchronisation), empty layers, a 2-rank 1F1B and ZB-H1 step with `M = 16`.
//! - `gemm`: `matrixmultiply` against `gemm` (single-threaded) on the built-in layer's three
//!   products at the default shapes (32 rows, 256 x 256), to pick the default backend.
//!
//! ```sh
//! cargo bench --bench runtime
//! ```
//!
//! As every bench, it takes criterion's baseline flags and prints one `pipefill-bench` line per
//! figure (docs/benchmarks.md, "Benchmarks as a regression run").

use std::process::ExitCode;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use pipefill::layers::gemm::{matmul, GemmBackend, MatRef};
use pipefill_host::runtime::{BoxedStage, Executor, StepEvent, Tensor};
use pipefill_host::schedule::{families, Params};

#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

#[path = "support/empty_stage.rs"]
mod empty_stage;

use empty_stage::{zero_loss, Empty};

fn executor_overhead(c: &mut Criterion) {
    pipefill::alloc::keep_freed_memory();
    let mut g = c.benchmark_group("executor_overhead");
    let m = 64;
    for (family, ranks) in [("1f1b", 1), ("1f1b", 2), ("zb-h1", 2)] {
        let Ok(schedule) = families::generate(family, &Params::new(ranks, m)) else {
            continue;
        };
        let actions = schedule.action_count();
        let stages = (0..schedule.stages()).map(|_| Empty).collect();
        let Ok(mut ex) = Executor::new(schedule, stages) else {
            continue;
        };
        let targets = vec![Tensor::empty(); m];
        g.throughput(Throughput::Elements(actions as u64));
        g.bench_function(BenchmarkId::new(family, format!("P{ranks}-M{m}")), |b| {
            b.iter(|| {
                let inputs = vec![Tensor::empty(); m];
                ex.step(inputs, &targets, &zero_loss)
            })
        });
    }
    g.finish();
}

/// The plain path against boxed stages and a no-op hook, on the steps of `executor_overhead`.
fn executor_variants(c: &mut Criterion) {
    pipefill::alloc::keep_freed_memory();
    let mut g = c.benchmark_group("executor_variants");
    let m = 64;
    let targets = vec![Tensor::empty(); m];
    for (family, ranks) in [("1f1b", 1), ("zb-h1", 2)] {
        let Ok(schedule) = families::generate(family, &Params::new(ranks, m)) else {
            continue;
        };
        g.throughput(Throughput::Elements(schedule.action_count() as u64));
        let id = |how: &str| BenchmarkId::new(format!("{family} {how}"), format!("P{ranks}-M{m}"));
        let plain = (0..schedule.stages()).map(|_| Empty).collect();
        if let Ok(mut ex) = Executor::new(schedule.clone(), plain) {
            g.bench_function(id("plain"), |b| {
                b.iter(|| ex.step(vec![Tensor::empty(); m], &targets, &zero_loss))
            });
            g.bench_function(id("hook"), |b| {
                b.iter(|| {
                    let hook = |e: StepEvent| {
                        std::hint::black_box(e);
                    };
                    ex.step_with(vec![Tensor::empty(); m], &targets, &zero_loss, hook)
                })
            });
        }
        let boxed: Vec<BoxedStage> = (0..schedule.stages())
            .map(|_| Box::new(Empty) as BoxedStage)
            .collect();
        if let Ok(mut ex) = Executor::new(schedule, boxed) {
            g.bench_function(id("boxed"), |b| {
                b.iter(|| ex.step(vec![Tensor::empty(); m], &targets, &zero_loss))
            });
        }
    }
    g.finish();
}

fn gemm_backends(c: &mut Criterion) {
    pipefill::alloc::keep_freed_memory();
    let mut g = c.benchmark_group("gemm");
    let (rows, d) = (32, 256);
    let x = vec![0.5f32; rows * d];
    let w = vec![0.25f32; d * d];
    let mut y = vec![0.0f32; rows * d];
    let mut dw = vec![0.0f32; d * d];
    g.throughput(Throughput::Elements((2 * rows * d * d) as u64));
    for &backend in GemmBackend::ALL {
        g.bench_function(BenchmarkId::new("forward XW", backend), |b| {
            b.iter(|| {
                matmul(
                    backend,
                    MatRef::new(&x, rows, d),
                    MatRef::new(&w, d, d),
                    &mut y,
                    0.0,
                )
            })
        });
        g.bench_function(BenchmarkId::new("input dZ W^T", backend), |b| {
            b.iter(|| {
                matmul(
                    backend,
                    MatRef::new(&x, rows, d),
                    MatRef::new(&w, d, d).t(),
                    &mut y,
                    0.0,
                )
            })
        });
        g.bench_function(BenchmarkId::new("weight X^T dZ", backend), |b| {
            b.iter(|| {
                matmul(
                    backend,
                    MatRef::new(&x, rows, d).t(),
                    MatRef::new(&x, rows, d),
                    &mut dw,
                    1.0,
                )
            })
        });
    }
    g.finish();
}

/// The stream executor on `CpuStreams` with empty layers: host time per action of a whole step.
fn stream_executor(c: &mut Criterion) {
    use pipefill_host::runtime::streams::{CpuStreams, Pending, StreamExecutor};
    pipefill::alloc::keep_freed_memory();
    let mut g = c.benchmark_group("stream_executor");
    let m = 16;
    for family in ["1f1b", "zb-h1"] {
        let Ok(schedule) = families::generate(family, &Params::new(2, m)) else {
            continue;
        };
        g.throughput(Throughput::Elements(schedule.action_count() as u64));
        let device = CpuStreams::new();
        let stages = (0..schedule.stages())
            .map(|_| device.stage(Empty))
            .collect();
        let loss = device.loss(zero_loss);
        let Ok(mut ex) = StreamExecutor::new(schedule, stages, device) else {
            continue;
        };
        let empty = || {
            (0..m)
                .map(|_| Pending::ready(Tensor::empty()))
                .collect::<Vec<_>>()
        };
        let targets = empty();
        g.bench_function(BenchmarkId::new(family, format!("P2-M{m}")), |b| {
            b.iter(|| ex.step(empty(), &targets, &loss))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    executor_overhead,
    executor_variants,
    stream_executor,
    gemm_backends
);

fn main() -> ExitCode {
    let run = support::Run::start("runtime");
    benches();
    Criterion::default().configure_from_args().final_summary();
    run.finish_criterion()
}
