//! What each part of a simulation's output costs: the simulator at P = 64, M = 4096, V = 4
//! (interleaved 1F1B, 2,097,152 actions) with spans only, spans and the critical path, spans and
//! every transfer, and everything (`simulate`). Best of five runs each, wall clock, the result's
//! release not included (criterion's `cargo bench -p pipefill-host --bench sim -- P64` includes it).
//!
//! ```sh
//! cargo run --release -p pipefill-host --example sim_options
//! ```

use std::time::Instant;

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::{families, Params};
use pipefill_host::sim::{simulate_with, SimOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let s = families::generate("interleaved-1f1b", &Params::new(64, 4096).with_chunks(4))?;
    let c = CostModel::uniform(
        StageCost::uniform(1.0, 1.0, 1.0),
        s.stages(),
        LinkCost::default(),
    );
    let n = s.action_count() as f64;
    let variants = [
        ("spans", SimOptions::SPANS),
        (
            "spans + critical path",
            SimOptions {
                transfers: false,
                critical_path: true,
                ..SimOptions::SPANS
            },
        ),
        (
            "spans + transfers",
            SimOptions {
                transfers: true,
                critical_path: false,
                ..SimOptions::SPANS
            },
        ),
        ("everything (simulate)", SimOptions::ALL),
    ];
    for (name, options) in variants {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            let sim = simulate_with(&s, &c, options)?;
            best = best.min(t.elapsed().as_secs_f64());
            drop(sim);
        }
        println!(
            "{name:<24} {:7.1} ms  {:5.2} M actions/s",
            best * 1e3,
            n / best / 1e6
        );
    }
    Ok(())
}
