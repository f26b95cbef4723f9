//! How far each family is from the lower bound, with the bound before the one-machine relaxation
//! (`basic_bound`), today's (`lower_bound`), and the memory bound with the schedule's own peak as
//! the limit (`lower_bound_with_limit`). Prints a Markdown table (NOTES.md, section "vbound").
//!
//! `cargo run --release -p pipefill-host --example bound_gap`

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_host::sim::{basic_bound, lower_bound_with_limit, peak_activations, simulate};

/// F = I = W = 1 per rank at V = 1 (1/V per chunk); `edge` times that on the first and last
/// stage; `latency` on every hop.
fn costs(s: &Schedule, edge: f64, latency: f64) -> CostModel {
    let v = s.chunks as f64;
    let mut c = CostModel::uniform(
        StageCost::uniform(1.0 / v, 1.0 / v, 1.0 / v),
        s.stages(),
        LinkCost {
            latency,
            bandwidth: f64::INFINITY,
        },
    );
    let last = s.stages() - 1;
    for i in [0, last] {
        c.stages[i] = StageCost::uniform(edge / v, edge / v, edge / v);
    }
    c
}

fn main() {
    println!("| costs | P | M | family | makespan | basic | bound | with own peak | peak |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (label, edge, latency) in [("F=I=W", 1.0, 0.0), ("ends 1.5x, lat 0.1", 1.5, 0.1)] {
        for (p, m) in [(4, 8), (8, 32)] {
            for fam in families::FAMILIES {
                let Ok(s) = (fam.generate)(&Params::new(p, m)) else {
                    continue;
                };
                let c = costs(&s, edge, latency);
                let sim = simulate(&s, &c).expect("a generated schedule simulates");
                let mut unit = c.clone();
                for st in &mut unit.stages {
                    st.activation_bytes = 1.0 / s.chunks as f64;
                }
                let peak = peak_activations(&sim.timeline, &unit);
                let pairs = s.actions.iter().flatten().any(|i| i.actions().count() == 2);
                let basic = basic_bound(p, m, s.placement, &c, pairs);
                let limited = lower_bound_with_limit(&s, &c, &peak).expect("one limit per rank");
                let top = peak.iter().copied().fold(0.0, f64::max);
                println!(
                    "| {label} | {p} | {m} | {} | {:.2} | {:.2} ({:.3}) | {:.2} ({:.3}) | {:.2} ({:.3}) | {top} |",
                    s.name,
                    sim.timeline.makespan(),
                    basic,
                    sim.timeline.makespan() / basic,
                    sim.lower_bound,
                    sim.ratio_to_bound(),
                    limited,
                    sim.timeline.makespan() / limited,
                );
            }
        }
    }
}
