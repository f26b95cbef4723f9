//! Choosing the plan to run (`plan::choose`): near-ties within the profile's spread are decided by
//! the stated rule, whatever the noise and the order; a clear winner still wins; the shared-device
//! rescoring; and `auto` planned by the library like the families, at the request's `D` and `P`.

use pipefill_host::auto::AutoOptions;
use pipefill_host::cost::{CostFile, LayerCost, LinkCost, RecomputeChoice};
use pipefill_host::plan::{
    choose, on_one_device, plan, plan_families, plan_given, plan_workers, tie_window, Plan,
    PlanRequest, Split, MAX_TIE, MIN_TIE,
};
use pipefill_host::schedule::families::FAMILIES;
use pipefill_host::schedule::Params;

/// A cost file of `layers` with a free link and overlap share 1.
fn free_link(layers: Vec<LayerCost>) -> CostFile {
    CostFile {
        layers,
        transfer: LinkCost::default(),
        overlap_share: 1.0,
        meta: serde_json::Value::Null,
    }
}

/// Eight even layers, each time multiplied by a factor within `1 +- noise` drawn from `seed`.
fn noisy(seed: u64, noise: f64) -> CostFile {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut draw = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        1.0 + noise * (2.0 * ((x >> 11) as f64 / (1u64 << 53) as f64) - 1.0)
    };
    free_link(
        (0..8)
            .map(|i| {
                let mut l = LayerCost::new(format!("l{i}"), draw(), draw(), draw());
                l.activation_bytes = 1e6;
                l
            })
            .collect(),
    )
}

/// Every handcrafted family at P = 2, M = 8 on `costs`, each split by `--plan auto`.
fn every_family(costs: &CostFile) -> Vec<Plan> {
    let names: Vec<String> = FAMILIES.iter().map(|f| f.name.to_string()).collect();
    plan_families(costs, &Params::new(2, 8), &names, Split::Best, None)
        .unwrap()
        .plans
}

fn key(p: &Plan) -> (String, usize, usize) {
    (p.family.clone(), p.chunks, p.microbatches)
}

/// Costs perturbed within the spread reorder the near-equal predictions (the fastest changes from
/// one profile to the next), but the choice does not: the rule reads the schedules, not the times.
#[test]
fn noise_within_the_spread_does_not_change_the_choice() {
    let spread = 0.08;
    let mut chosen = Vec::new();
    let mut fastest = Vec::new();
    for seed in 0..24 {
        let plans = every_family(&noisy(seed, 0.03));
        let c = choose(&plans, spread).unwrap();
        let tie = c
            .near_tie
            .as_ref()
            .expect("near-equal families are a near-tie");
        assert!(tie.candidates > 1 && tie.window == spread, "{tie:?}");
        chosen.push(key(&plans[c.index]));
        fastest.push(tie.fastest.clone());
    }
    fastest.sort();
    fastest.dedup();
    assert!(
        fastest.len() > 1,
        "the noise should reorder the fastest, or this test shows nothing: {fastest:?}"
    );
    assert!(
        chosen.iter().all(|c| c == &chosen[0]),
        "the choice moved with the noise: {chosen:?}"
    );
}

/// The order the candidates come in decides nothing.
#[test]
fn the_order_of_the_candidates_does_not_decide() {
    let mut plans = every_family(&noisy(7, 0.03));
    let first = key(&plans[choose(&plans, 0.08).unwrap().index]);
    plans.reverse();
    assert_eq!(key(&plans[choose(&plans, 0.08).unwrap().index]), first);
    plans.rotate_left(3);
    assert_eq!(key(&plans[choose(&plans, 0.08).unwrap().index]), first);
}

/// A plan faster than every other by more than the window wins, whatever its shape, and alone.
#[test]
fn a_clear_winner_still_wins() {
    let mut plans = every_family(&noisy(3, 0.0));
    let ruled = key(&plans[choose(&plans, 1.0).unwrap().index]);
    let best = plans
        .iter()
        .map(|p| p.step_time)
        .fold(f64::INFINITY, f64::min);
    // The rule's last pick (gpipe: every microbatch in flight), made clearly the fastest.
    let at = plans.iter().position(|p| p.family == "gpipe").unwrap();
    assert_ne!(key(&plans[at]), ruled);
    plans[at].step_time = best * (1.0 - 1.5 * MAX_TIE);
    // However noisy the profile (a spread of 100%), the window stays at most MAX_TIE.
    let c = choose(&plans, 1.0).unwrap();
    assert_eq!(plans[c.index].family, "gpipe");
    assert!(c.near_tie.is_none(), "{:?}", c.near_tie);
}

#[test]
fn the_window_is_the_spread_within_bounds() {
    assert_eq!(tie_window(0.0), MIN_TIE);
    assert_eq!(tie_window(0.05), 0.05);
    assert_eq!(tie_window(0.4), MAX_TIE);
    assert_eq!(tie_window(f64::NAN), MAX_TIE);
}

/// With overlap share 1 (no overlap on the device) the shared-device step is the serial sum of
/// every action, whatever the schedule; the re-scored plans come best first and a re-scored plan
/// predicts the shared timeline.
#[test]
fn one_device_scores_plans_by_the_shared_model() {
    let costs = free_link(
        (0..4)
            .map(|i| LayerCost::new(format!("l{i}"), 1.0, 1.0 + i as f64 * 0.1, 0.5))
            .collect(),
    );
    let fams = vec!["1f1b".to_string(), "zb-h1".to_string(), "gpipe".to_string()];
    let report = plan_families(&costs, &Params::new(2, 4), &fams, Split::Uniform, None).unwrap();
    let serial = 4.0 * (4.0 * 1.0 + (1.0 + 1.1 + 1.2 + 1.3) + 4.0 * 0.5);
    assert!(report.plans.iter().all(|p| p.step_time < serial - 1.0));
    let plans = on_one_device(report.plans);
    assert_eq!(plans.len(), 3);
    for p in &plans {
        assert!(
            (p.step_time - serial).abs() < 1e-9,
            "{}: {}",
            p.family,
            p.step_time
        );
        assert!((p.predicted().unwrap().makespan() - serial).abs() < 1e-9);
    }
}

/// `auto` is a schedule source of the planner: with `D = 2` every row, auto's too, is planned for
/// two replicas (each its half of the batch); with `--workers` auto is planned at every split.
#[test]
fn auto_is_planned_like_the_families() {
    let mut costs = noisy(1, 0.3);
    for l in &mut costs.layers {
        l.parameter_bytes = 1e6;
    }
    let mut req = PlanRequest::new(costs, 1.0, 4, 16);
    req.families = vec!["auto".into(), "1f1b".into()];
    req.auto.time_budget = 0.01;
    req.data_parallel.replicas = 2;
    req.data_parallel.link = LinkCost {
        latency: 0.0,
        bandwidth: 1e9,
    };
    let report = plan(&req).unwrap();
    assert!(report.plans.iter().any(|p| p.family == "auto"));
    for p in &report.plans {
        assert_eq!(p.data_parallel, 2, "{}", p.family);
        assert_eq!(p.microbatches * p.microbatch_size * 2, 16, "{}", p.family);
    }
    req.data_parallel.replicas = 1;
    let report = plan_workers(&req, 4).unwrap();
    let mut splits: Vec<(usize, usize)> = report
        .plans
        .iter()
        .filter(|p| p.family == "auto" && p.ranks > 1)
        .map(|p| (p.ranks, p.data_parallel))
        .collect();
    splits.dedup();
    splits.sort();
    splits.dedup();
    assert_eq!(splits, vec![(2, 2), (4, 1)]);
    // The given-schedule planner (train's) takes auto with its options, at its V.
    let auto = AutoOptions {
        time_budget: 0.01,
        max_in_flight: Some(2.0),
        ..AutoOptions::default()
    };
    let names = vec!["auto".to_string()];
    let given = plan_given(
        &req.costs,
        &Params::new(4, 8),
        &names,
        Split::Best,
        None,
        &auto,
        RecomputeChoice::None,
    );
    let p = &given.unwrap().plans[0];
    assert_eq!(
        (p.family.as_str(), p.chunks, p.microbatches),
        ("auto", 1, 8)
    );
    // Its limit holds: at most 2 microbatches in flight on any rank.
    let peak = pipefill_host::schedule::validate::validate(&p.schedule)
        .unwrap()
        .peak_in_flight;
    assert!(peak.iter().all(|&k| k <= 2), "{peak:?}");
}
