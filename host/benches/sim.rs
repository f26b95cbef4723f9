//! Simulator throughput: actions simulated per second at three sizes up to P = 64, M = 4096, V = 4
//! (criterion reports elements/s = actions/s). The schedule is generated once, outside the timing; each
//! iteration runs the whole simulation (timeline, transfers, memory, critical path, lower bound), and
//! `summarize` the same simulation without recording the timeline (what a plan search uses).
//!
//! `cargo bench -p pipefill-host --bench sim`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::{families, Params};
use pipefill_host::sim::{simulate, summarize};

/// `(family, P, M, V)`.
const SIZES: &[(&str, usize, usize, usize)] = &[
    ("interleaved-1f1b", 8, 64, 2),
    ("interleaved-zb", 16, 512, 4),
    ("interleaved-1f1b", 64, 4096, 4),
];

fn bench_simulate(c: &mut Criterion) {
    let mut group = c.benchmark_group("simulate");
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
        group.throughput(Throughput::Elements(actions));
        group.bench_with_input(
            BenchmarkId::new(name, format!("P{p}_M{m}_V{v}_{actions}actions")),
            &schedule,
            |b, s| b.iter(|| simulate(s, &costs).map(|r| r.timeline.makespan())),
        );
        group.bench_with_input(
            BenchmarkId::new(
                format!("{name}/summarize"),
                format!("P{p}_M{m}_V{v}_{actions}actions"),
            ),
            &schedule,
            |b, s| b.iter(|| summarize(s, &costs).map(|r| r.makespan)),
        );
    }
    group.finish();
}

criterion_group!(benches, bench_simulate);
criterion_main!(benches);
