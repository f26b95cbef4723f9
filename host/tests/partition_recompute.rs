//! The partitioner's memory limit with recomputation: its count against the simulator's (an
//! independent count: the simulator walks the actions in time), and a split that fits only
//! because a heavy stage recomputes, found directly.

use pipefill_host::auto::AutoOptions;
use pipefill_host::cost::{CostFile, CostModel, LayerCost, LinkCost, Recompute, RecomputeChoice};
use pipefill_host::partition::{optimal, Layout, MemoryLimit, Partition, Problem};
use pipefill_host::plan::{peak_memory, plan_given, with_modes, Split};
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_host::sim::simulate;

/// Layers with the given activation bytes; one second each of F, I and W, one byte sent on.
fn layers(acts: &[f64]) -> Vec<LayerCost> {
    acts.iter()
        .enumerate()
        .map(|(i, &a)| {
            let mut l = LayerCost::new(format!("l{i}"), 1.0, 1.0, 1.0);
            l.activation_bytes = a;
            l.output_bytes = 1.0;
            l
        })
        .collect()
}

fn layout_of(s: &Schedule) -> Layout {
    Layout {
        ranks: s.ranks,
        chunks: s.chunks,
        placement: s.placement,
    }
}

/// Per rank, the simulator's peak (activations held plus parameters) for `layers` split at
/// `boundaries` with stage `s` in `modes[s]`.
fn simulated(
    s: &Schedule,
    layers: &[LayerCost],
    boundaries: &[usize],
    modes: &[Recompute],
) -> Vec<u64> {
    let per_stage: Vec<usize> = boundaries.windows(2).map(|w| w[1] - w[0]).collect();
    let model = CostModel::from_layers(layers, &per_stage, LinkCost::default()).unwrap();
    let model = with_modes(model, modes);
    let sim = simulate(s, &model).unwrap();
    peak_memory(s, &model, &sim)
        .iter()
        .map(|m| m.round() as u64)
        .collect()
}

#[test]
fn a_split_that_fits_only_because_the_heavy_stage_recomputes_is_found() {
    // 1F1B on 2 ranks keeps two microbatches on stage 0, one on stage 1. The balanced split
    // [0, 2, 4] holds 2 x 20 bytes on rank 0; without recomputation only [0, 1, 4] fits 25 bytes.
    // Recomputing stage 0 (it keeps its input, none for the first stage, and rebuilds one stash
    // at a time) holds 20 there: the balanced split fits, and is still the fastest (8 s a
    // microbatch on stage 0 with its forward again, against 9 s for [0, 1, 4]'s stage 1).
    let layers = layers(&[10.0, 10.0, 1.0, 1.0]);
    let s = families::generate("1f1b", &Params::new(2, 4)).unwrap();
    let layout = layout_of(&s);
    let limit = MemoryLimit::of_schedule(25, &s);
    let problem = Problem::from_layers(&layers, &LinkCost::default()).unwrap();

    let without = optimal(&problem, &layout, Some(&limit)).unwrap();
    assert_eq!(without.boundaries, vec![0, 1, 4]);
    let modes = [Recompute::Full, Recompute::None];
    let recomputing = problem.clone().with_recompute(&modes);
    let with = optimal(&recomputing, &layout, Some(&limit)).unwrap();
    assert_eq!(with.boundaries, vec![0, 2, 4]);
    assert!(with.bottleneck < without.bottleneck);
    // The old count (whole stashes per in-flight microbatch) refuses it whatever the mode.
    let whole = MemoryLimit::whole(25, &layout, &[2, 1]);
    let old = optimal(&recomputing, &layout, Some(&whole)).unwrap();
    assert_eq!(old.boundaries, vec![0, 1, 4]);

    // The partitioner's count is the simulator's, and fits.
    let counted = recomputing
        .rank_memory(&layout, &with.boundaries, &limit.holds)
        .unwrap();
    assert_eq!(counted, simulated(&s, &layers, &with.boundaries, &modes));
    assert!(counted.iter().all(|&m| m <= 25), "{counted:?}");

    // The planner, asked to choose recomputation, returns that split with stage 0 recomputing.
    let file = CostFile {
        layers,
        transfer: LinkCost::default(),
        overlap_share: 0.0,
        meta: serde_json::Value::Null,
    };
    let names = ["1f1b".to_string()];
    let report = plan_given(
        &file,
        &Params::new(2, 4),
        &names,
        Split::Best,
        Some(25.0),
        &AutoOptions::default(),
        RecomputeChoice::Auto,
    )
    .unwrap();
    let best = report.best().unwrap();
    assert_eq!(best.layers_per_stage, vec![2, 2]);
    assert_eq!(best.recompute, modes.to_vec());
}

#[test]
fn the_partitioners_count_equals_the_simulators_peak() {
    // Uneven stashes, parts released at I, selective parts, inputs and parameters; every family
    // shape below, with no, full, selective and mixed recomputation, on several splits: the count
    // per rank is the simulator's.
    let acts = [
        40.0, 7.0, 30.0, 12.0, 55.0, 3.0, 21.0, 16.0, 9.0, 33.0, 5.0, 27.0,
    ];
    let mut layers = layers(&acts);
    for (i, l) in layers.iter_mut().enumerate() {
        l.released_at_input = (l.activation_bytes * 0.4).floor();
        l.output_bytes = (2 + i % 5) as f64;
        l.parameter_bytes = (3 * i) as f64;
        // Every other layer can drop a part after F (counted from a stage's second layer on).
        if i % 2 == 1 {
            l.selective_bytes = (l.activation_bytes * 0.3).floor();
            l.selective_time = 0.1;
        }
    }
    let problem = Problem::from_layers(&layers, &LinkCost::default()).unwrap();
    let shapes = [
        ("1f1b", 3, 1),
        ("gpipe", 2, 1),
        ("zb-h1", 3, 1),
        ("zb-h2", 3, 1),
        ("interleaved-1f1b", 2, 2),
        ("zbv", 2, 2),
        ("dualpipev", 2, 2),
    ];
    let mut checked = 0;
    for (name, p, v) in shapes {
        let s = families::generate(name, &Params::new(p, 6).with_chunks(v)).unwrap();
        let layout = layout_of(&s);
        let limit = MemoryLimit::of_schedule(u64::MAX, &s);
        let stages = s.stages();
        let sets = [
            vec![Recompute::None; stages],
            vec![Recompute::Full; stages],
            (0..stages)
                .map(|i| [Recompute::Full, Recompute::None][i % 2])
                .collect(),
            vec![Recompute::Selective; stages],
            (0..stages)
                .map(|i| [Recompute::Selective, Recompute::Full, Recompute::None][i % 3])
                .collect(),
        ];
        let splits = [
            vec![1; stages],
            (0..stages).map(|i| 1 + i % 3).collect::<Vec<_>>(),
            (0..stages).map(|i| 1 + (stages - i) % 2).collect(),
        ];
        for modes in &sets {
            for counts in &splits {
                let mut counts = counts.clone();
                counts[stages - 1] += acts.len() - counts.iter().sum::<usize>();
                let b = Partition::boundaries_from_counts(&counts);
                let counted = problem
                    .clone()
                    .with_recompute(modes)
                    .rank_memory(&layout, &b, &limit.holds)
                    .unwrap();
                let want = simulated(&s, &layers, &b, modes);
                assert_eq!(counted, want, "{name} {modes:?} {counts:?}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 7 * 15);
}
