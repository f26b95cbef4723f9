//! `plan`: candidates sorted by simulated step time, memory limit respected, refinement never worse.

use pipefill_host::auto::{solve, AutoOptions};
use pipefill_host::cost::{split_even, CostFile, CostModel, LayerCost, LinkCost};
use pipefill_host::plan::{generate, plan, PlanError, PlanRequest};
use pipefill_host::schedule::families::{self, FAMILIES};
use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{Params, ScheduleError};
use pipefill_host::sim::simulate;

/// Embedding-like first layer and LM-head-like last layer, light blocks between.
fn model() -> CostFile {
    let mut layers = Vec::new();
    for i in 0..10 {
        let t = if i == 0 || i == 9 { 6.0 } else { 1.0 };
        let mut l = LayerCost::new(format!("l{i}"), t, t, t);
        l.activation_bytes = 100.0;
        l.parameter_bytes = if i == 0 || i == 9 { 1000.0 } else { 100.0 };
        l.output_bytes = 10.0;
        layers.push(l);
    }
    CostFile {
        layers,
        transfer: LinkCost {
            latency: 0.01,
            bandwidth: 1000.0,
        },
        overlap_share: 0.0,
        meta: serde_json::Value::Null,
    }
}

#[test]
fn plans_are_sorted_and_beat_the_uniform_split() {
    let mut req = PlanRequest::new(model(), 1.0, 4, 16);
    req.max_microbatches = 16;
    let report = plan(&req).unwrap();
    let steps: Vec<f64> = report.plans.iter().map(|p| p.step_time).collect();
    assert!(
        steps.windows(2).all(|w| w[0] <= w[1] * (1.0 + 1e-9)),
        "{steps:?}"
    );
    let best = report.best().unwrap();
    for p in &report.plans {
        assert_eq!(p.layers_per_stage.iter().sum::<usize>(), 10);
        assert_eq!(p.layers_per_stage.len(), 4 * p.chunks);
        assert!(p.ratio_to_bound >= 1.0 - 1e-9, "{p:?}");
        assert!((0.0..1.0).contains(&p.bubble_fraction));
        assert_eq!(p.microbatch_size * p.microbatches, 16);
    }
    // On this model the uniform split of the best plan's own schedule is strictly slower: the heavy
    // first and last layers each share a stage with light ones.
    let counts = split_even(10, best.layers_per_stage.len()).unwrap();
    let layers: Vec<LayerCost> = req
        .costs
        .layers
        .iter()
        .map(|l| l.scaled(best.microbatch_size as f64))
        .collect();
    let uniform = CostModel::from_layers(&layers, &counts, req.costs.transfer).unwrap();
    let uniform_step = simulate(&best.schedule, &uniform)
        .unwrap()
        .timeline
        .makespan();
    assert!(
        best.step_time < uniform_step,
        "{} vs {uniform_step}",
        best.step_time
    );
}

#[test]
fn memory_limit_rules_plans_out() {
    let mut req = PlanRequest::new(model(), 1.0, 4, 16);
    req.max_microbatches = 16;
    let free = plan(&req).unwrap();
    let worst_mem = free
        .plans
        .iter()
        .map(|p| p.peak_memory.iter().copied().fold(0.0, f64::max))
        .fold(0.0, f64::max);
    let best_mem = free
        .plans
        .iter()
        .map(|p| p.peak_memory.iter().copied().fold(0.0, f64::max))
        .fold(f64::INFINITY, f64::min);
    let limit = 0.5 * (worst_mem + best_mem);
    req.memory_limit = Some(limit);
    let tight = plan(&req).unwrap();
    assert!(tight.plans.len() < free.plans.len());
    for p in &tight.plans {
        assert!(p.peak_memory.iter().all(|&m| m <= limit), "{p:?}");
    }
    req.memory_limit = Some(1.0);
    assert!(matches!(plan(&req), Err(PlanError::NoPlan { skipped }) if !skipped.is_empty()));
}

#[test]
fn bad_requests_are_refused() {
    let mut req = PlanRequest::new(model(), 1.0, 4, 16);
    req.families = vec!["nope".into()];
    assert!(matches!(plan(&req), Err(PlanError::UnknownFamily { name, .. }) if name == "nope"));
    let req = PlanRequest::new(model(), 1.0, 11, 16);
    assert!(matches!(
        plan(&req),
        Err(PlanError::TooFewLayers {
            layers: 10,
            stages: 11
        })
    ));
    let req = PlanRequest::new(model(), 0.0, 4, 16);
    assert!(matches!(plan(&req), Err(PlanError::CostBatch { value }) if value == 0.0));
}

#[test]
fn best_partition_for_a_fixed_schedule_beats_uniform() {
    use pipefill_host::plan::best_partition;
    use pipefill_host::schedule::{families, Params};
    let costs = model();
    let s = families::generate("1f1b", &Params::new(4, 8)).unwrap();
    let best = best_partition(&costs, &s, None).unwrap();
    assert_eq!((best.family.as_str(), best.microbatches), ("1f1b", 8));
    let uniform =
        CostModel::from_layers(&costs.layers, &split_even(10, 4).unwrap(), costs.transfer).unwrap();
    let uniform_step = simulate(&s, &uniform).unwrap().timeline.makespan();
    assert!(
        best.step_time < uniform_step,
        "{} vs {uniform_step}",
        best.step_time
    );
    // The name is a label: a renamed schedule plans the same.
    let mut renamed = s.clone();
    renamed.name = "mine".into();
    let mine = best_partition(&costs, &renamed, None).unwrap();
    assert_eq!(mine.family, "mine");
    assert_eq!(mine.layers_per_stage, best.layers_per_stage);
}

/// `model()` measured at 16 samples per microbatch, with a given share of every time fixed.
fn with_fixed_share(share: f64) -> CostFile {
    let mut costs = model();
    for l in &mut costs.layers {
        l.fixed = Some(pipefill_host::cost::FixedCost {
            forward: share * l.forward,
            backward_input: share * l.backward_input,
            backward_weight: share * l.backward_weight,
        });
    }
    costs
}

#[test]
fn fixed_overhead_makes_plan_prefer_larger_microbatches() {
    let run = |costs: CostFile| {
        let mut req = PlanRequest::new(costs, 16.0, 4, 16);
        req.max_microbatches = 16;
        plan(&req).unwrap()
    };
    // Linear scaling: halving the microbatch halves its cost, so many small microbatches (smaller
    // bubble) win.
    let linear = run(model());
    let linear_best = linear.best().unwrap();
    assert!(linear_best.microbatches >= 8, "{linear_best:?}");
    // A file without `fixed` and one with a zero fixed part plan the same.
    let zero = run(with_fixed_share(0.0));
    assert_eq!(zero.best().unwrap().step_time, linear_best.step_time);
    // All of every time fixed: a microbatch costs the same whatever its size, so each extra one
    // adds a whole microbatch of work to every rank; one microbatch of 16 is the known optimum.
    let fixed = run(with_fixed_share(1.0));
    let best = fixed.best().unwrap();
    assert_eq!(
        (best.microbatches, best.microbatch_size),
        (1, 16),
        "{best:?}"
    );
    // Predictions follow the model: with every time fixed, M microbatches of any size cost what M
    // of the measured size cost, so the M = 16 plan is much slower than under linear scaling.
    let slowest_m = |r: &pipefill_host::plan::PlanReport| {
        r.plans
            .iter()
            .filter(|p| p.microbatches == 16)
            .map(|p| p.step_time)
            .fold(f64::INFINITY, f64::min)
    };
    assert!(slowest_m(&fixed) > 8.0 * slowest_m(&linear));
}

#[test]
fn samples_override_the_fixed_part_and_steer_the_plan() {
    let run = |costs: CostFile| {
        let mut req = PlanRequest::new(costs, 16.0, 4, 16);
        req.max_microbatches = 16;
        plan(&req).unwrap()
    };
    // Samples that say every size costs what the measured one does (all time fixed): the plan must
    // behave as with a fixed part of 100 %, even though the file's `fixed` says 0 % (samples win).
    let mut costs = with_fixed_share(0.0);
    for l in &mut costs.layers {
        let at = |scale: f64| pipefill_host::cost::SizeSample {
            scale,
            forward: l.forward,
            backward_input: l.backward_input,
            backward_weight: l.backward_weight,
            backward: l.backward,
        };
        l.samples = vec![at(1.0 / 16.0), at(0.25)];
    }
    let report = run(costs);
    let best = report.best().unwrap();
    assert_eq!(
        (best.microbatches, best.microbatch_size),
        (1, 16),
        "{best:?}"
    );
    let fixed = run(with_fixed_share(1.0));
    assert!(
        (fixed.best().unwrap().step_time - best.step_time).abs() <= 1e-12,
        "same costs at every size, same prediction"
    );
}

#[test]
fn one_rank_lists_one_plan_per_batch_shape() {
    // At P = 1 every family runs the same actions: `plan_workers` keeps one row per (D, M,
    // microbatch size) there, while P > 1 still lists every family.
    let mut req = PlanRequest::new(model(), 1.0, 1, 16);
    req.data_parallel.link = LinkCost {
        latency: 0.0,
        bandwidth: 1e9,
    };
    let report = pipefill_host::plan::plan_workers(&req, 2).unwrap();
    let one: Vec<_> = report.plans.iter().filter(|p| p.ranks == 1).collect();
    let shapes: std::collections::BTreeSet<_> = one
        .iter()
        .map(|p| (p.data_parallel, p.microbatches, p.microbatch_size))
        .collect();
    assert!(!one.is_empty());
    assert_eq!(one.len(), shapes.len(), "P = 1 rows: {one:?}");
    let two: std::collections::BTreeSet<_> = report
        .plans
        .iter()
        .filter(|p| p.ranks == 2)
        .map(|p| p.family.as_str())
        .collect();
    assert!(two.len() > 1, "P = 2 keeps its families: {two:?}");
}

#[test]
fn times_past_the_partitioners_arithmetic_are_refused() {
    // 1e11 s per layer overflows integer nanoseconds: refused with the total, not planned as
    // "fits 0 bytes" (the saturated sums used to read as a memory refusal).
    let mut costs = model();
    for l in &mut costs.layers {
        l.forward = 1e11;
    }
    let req = PlanRequest::new(costs.clone(), 1.0, 2, 16);
    let e = plan(&req).unwrap_err().to_string();
    assert!(
        e.contains("add up to") && e.contains("seconds per microbatch"),
        "{e}"
    );
    let p = pipefill_host::partition::Problem::from_layers(&costs.layers, &costs.transfer);
    assert!(matches!(
        p,
        Err(pipefill_host::partition::PartitionError::TooLarge { .. })
    ));
    // Just under the bound still plans.
    let mut fits = model();
    for l in &mut fits.layers {
        l.forward = 1e7;
    }
    assert!(plan(&PlanRequest::new(fits, 1.0, 2, 16)).is_ok());
}

#[test]
fn one_entry_point_makes_every_family_and_auto_when_given_costs() {
    let params = Params::new(2, 4);
    let opts = AutoOptions::default();
    for f in FAMILIES {
        let want = families::generate(f.name, &params);
        let got = generate(f.name, &params, None, &opts);
        match (want, got) {
            (Ok(w), Ok(g)) => assert_eq!(w, g, "{}", f.name),
            (Err(w), Err(PlanError::Schedule { source, .. })) => assert_eq!(w, source),
            (w, g) => panic!("{}: {w:?} against {g:?}", f.name),
        }
    }
    // `auto`: solved for the costs cut evenly into P x V stages, as `auto::solve` solves it.
    let costs = model();
    let got = generate("auto", &params, Some(&costs), &opts).unwrap();
    validate(&got).unwrap();
    let counts = split_even(costs.layers.len(), 2).unwrap();
    let req = opts.request(2, 4, 1, costs.model(&counts).unwrap(), opts.limit(None));
    assert_eq!(got, solve(&req).unwrap().schedule);
    // Without costs it names where `auto` comes from; an unknown name lists `auto`.
    match generate("auto", &params, None, &opts) {
        Err(PlanError::Schedule { source, .. }) => {
            assert_eq!(source, ScheduleError::AutoNeedsCosts)
        }
        other => panic!("{other:?}"),
    }
    let e = generate("nope", &params, Some(&costs), &opts).unwrap_err();
    assert!(e.to_string().contains("auto"), "{e}");
}
