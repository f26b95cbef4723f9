//! Generating and validating large schedules: P = 64, M = 1024, V = 4 (V = 2 for V-shape families,
//! V = 1 for the families that take only V = 1).
//!
//! Baselines measured in the same run: `walk` is one pass over every action of the interleaved-1F1B
//! schedule (the least any O(actions) check can cost), and validation at M = 256 shows how the
//! cost scales with the number of actions.
//!
//! Run: `cargo bench -p pipefill-host --bench schedule`. As every bench, it takes criterion's baseline
//! flags and prints one `pipefill-bench` line per figure (docs/benchmarks.md, "Benchmarks as a regression run").

use std::hint::black_box;
use std::process::ExitCode;

use criterion::{criterion_group, Criterion};
use pipefill_host::schedule::families::FAMILIES;
use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{Item, Params, Schedule};

#[allow(dead_code)]
#[path = "../../benches/support/mod.rs"]
mod support;

const P: usize = 64;
const M: usize = 1024;
const V: usize = 4;

/// The largest V the family takes up to [`V`].
fn params_for(name: &str, m: usize) -> Option<(Params, Schedule)> {
    let f = FAMILIES.iter().find(|f| f.name == name)?;
    [V, 2, 1]
        .iter()
        .map(|&v| Params::new(P, m).with_chunks(v))
        .find_map(|p| (f.generate)(&p).ok().map(|s| (p, s)))
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("schedule");
    g.sample_size(10);
    for f in FAMILIES {
        let Some((params, s)) = params_for(f.name, M) else {
            continue;
        };
        let id = format!("{}/P{P}-M{M}-V{}", f.name, s.chunks);
        g.bench_function(format!("generate/{id}"), |b| {
            b.iter(|| (f.generate)(black_box(&params)).map(|s| s.action_count()))
        });
        g.bench_function(format!("validate/{id}"), |b| {
            b.iter(|| validate(black_box(&s)).map(|r| r.makespan_slots))
        });
    }
    if let Some((_, s)) = params_for("interleaved-1f1b", M) {
        g.bench_function(format!("walk/interleaved-1f1b/P{P}-M{M}-V{V}"), |b| {
            b.iter(|| {
                black_box(&s)
                    .actions
                    .iter()
                    .flatten()
                    .flat_map(Item::actions)
                    .map(|a| a.stage ^ a.microbatch)
                    .fold(0usize, usize::wrapping_add)
            })
        });
    }
    if let Some((_, s)) = params_for("interleaved-1f1b", M / 4) {
        g.bench_function(
            format!("validate/interleaved-1f1b/P{P}-M{}-V{V}", M / 4),
            |b| b.iter(|| validate(black_box(&s)).map(|r| r.makespan_slots)),
        );
    }
    g.finish();
}

criterion_group!(benches, bench);

fn main() -> ExitCode {
    let run = support::Run::start("schedule");
    benches();
    Criterion::default().configure_from_args().final_summary();
    run.finish_criterion()
}
