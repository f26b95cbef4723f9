//! The lower bound with recomputation: on a grid of small cases (P, M, V and placement, uneven
//! stages, none / full / mixed recomputation) it never exceeds the simulated makespan of any
//! family, with or without the memory argument; and `auto`'s bound under a byte limit (its
//! in-flight limit per rank counted from what a recomputing stage keeps, its `I`/`B` times with the
//! forward again) is never above the makespan of any family that fits that limit.

use pipefill_host::auto::{solve, AutoRequest, MemoryLimit};
use pipefill_host::cost::{CostModel, LinkCost, Recompute, StageCost};
use pipefill_host::schedule::{families, Params, Placement};
use pipefill_host::sim::{lower_bound, lower_bound_with_limit, simulate};

mod sim_support;
use sim_support::peak_in_flight as in_flight;

/// `S` uneven stages with big stashes, small inputs, part released at `I`, in `modes` (cycled).
fn model(stages: usize, modes: &[Recompute]) -> CostModel {
    let st = (0..stages)
        .map(|s| {
            let k = s as f64;
            let mut c = StageCost::uniform(0.5 + 0.25 * (s % 3) as f64, 1.0 + 0.1 * k, 0.75);
            c.activation_bytes = 100.0 + 20.0 * (s % 2) as f64;
            c.input_bytes = 8.0;
            c.released_at_input = 30.0;
            c.parameter_bytes = 10.0;
            c.output_bytes = 8.0;
            c.with_recompute(modes[s % modes.len()])
        })
        .collect();
    let link = LinkCost {
        latency: 0.05,
        ..LinkCost::default()
    };
    CostModel {
        stages: st,
        link,
        overlap_share: 0.0,
    }
}

const SHAPES: [(usize, usize, Placement); 5] = [
    (2, 1, Placement::Looped),
    (3, 1, Placement::Looped),
    (2, 2, Placement::Looped),
    (2, 2, Placement::Vshape),
    (3, 2, Placement::Vshape),
];

fn mode_sets() -> [Vec<Recompute>; 3] {
    [
        vec![Recompute::None],
        vec![Recompute::Full],
        vec![Recompute::Full, Recompute::None],
    ]
}

#[test]
fn the_bound_is_never_above_any_familys_makespan_with_recomputation() {
    let mut checked = 0;
    for (p, v, placement) in SHAPES {
        for m in [p, 2 * p, 3 * p] {
            for modes in mode_sets() {
                let costs = model(p * v, &modes);
                for fam in families::FAMILIES
                    .iter()
                    .filter(|f| f.placement == placement)
                {
                    let Ok(s) = (fam.generate)(&Params::new(p, m).with_chunks(v)) else {
                        continue;
                    };
                    let makespan = simulate(&s, &costs).unwrap().timeline.makespan();
                    let below = |x: f64| x <= makespan * (1.0 + 1e-9) + 1e-9;
                    let free = lower_bound(&s, &costs);
                    assert!(below(free), "{} P={p} M={m}: {free} > {makespan}", s.name);
                    let limits = in_flight(&s, &costs);
                    let limited = lower_bound_with_limit(&s, &costs, &limits).unwrap();
                    assert!(
                        below(limited),
                        "{} P={p} M={m} {modes:?}: memory bound {limited} > {makespan}",
                        s.name
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 100, "{checked}");
}

#[test]
fn autos_bound_under_a_byte_limit_is_never_above_a_fitting_family() {
    let mut compared = 0;
    for (p, v, placement) in SHAPES {
        let m = 2 * p;
        for modes in mode_sets() {
            let costs = model(p * v, &modes);
            let base = AutoRequest::new(p, m, costs.clone())
                .with_chunks(v, placement)
                .with_budget(0.02, 1);
            // Limits from tight to the most any family of the shape holds (bytes).
            let most = (families::FAMILIES.iter())
                .filter(|f| f.placement == placement)
                .filter_map(|f| (f.generate)(&Params::new(p, m).with_chunks(v)).ok())
                .flat_map(|s| simulate(&s, &costs).unwrap().peak_activations)
                .fold(0.0, f64::max);
            for share in [0.35, 0.5, 0.7, 1.0] {
                let limit = 10.0 * v as f64 + share * most;
                let Ok(auto) = solve(&base.clone().with_limit(MemoryLimit::Bytes(limit))) else {
                    continue;
                };
                let bound = auto.solver.lower_bound;
                let own = simulate(&auto.schedule, &costs)
                    .unwrap()
                    .timeline
                    .makespan();
                assert!(bound <= own * (1.0 + 1e-9), "{bound} > auto's {own}");
                for f in auto.solver.families.iter().filter(|f| f.value.is_some()) {
                    assert!(
                        bound <= f.makespan * (1.0 + 1e-9) + 1e-9,
                        "P={p} V={v} {placement:?} {modes:?} limit {limit}: bound {bound} > {} {}",
                        f.family,
                        f.makespan
                    );
                    compared += 1;
                }
            }
        }
    }
    assert!(compared >= 30, "{compared}");
}
