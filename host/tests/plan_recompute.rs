//! The planner chooses recomputation per stage under a memory limit (`PlanRequest::recompute`).

use pipefill_host::auto::AutoOptions;
use pipefill_host::cost::{CostFile, LayerCost, LinkCost, Recompute, RecomputeChoice};
use pipefill_host::plan::{plan, plan_given, Plan, PlanError, PlanRequest, Split};
use pipefill_host::schedule::Params;

/// [`costs`] with 60 of each layer's 100 bytes declared selective, rebuilt in 0.01 (a 25th of
/// the forward).
fn selective_costs() -> CostFile {
    let mut c = costs();
    for l in &mut c.layers {
        (l.selective_bytes, l.selective_time) = (60.0, 0.01);
    }
    c
}

#[test]
fn auto_chooses_selective_where_it_fits_for_less_time_than_full() {
    // One chunk per rank: each stage holds two layers, so every stage can recompute selectively.
    let with = |limit, choice| {
        let mut r = request(limit, choice);
        r.costs = selective_costs();
        r.families = vec!["1f1b".into(), "zb-h1".into(), "zb-h2".into()];
        r.chunks = vec![1];
        plan(&r)
    };
    let least = with(None, RecomputeChoice::None)
        .unwrap()
        .plans
        .iter()
        .map(worst)
        .fold(f64::INFINITY, f64::min);
    // Below every plan without recomputation, found by lowering the limit.
    let mut limit = least;
    while with(Some(limit), RecomputeChoice::None).is_ok() {
        limit *= 0.95;
    }
    let auto = with(Some(limit), RecomputeChoice::Auto).unwrap();
    let full = with(Some(limit), RecomputeChoice::Full).unwrap();
    let (a, f) = (auto.best().unwrap(), full.best().unwrap());
    assert!(worst(a) <= limit);
    assert!(
        a.recompute.contains(&Recompute::Selective),
        "{:?} {} {}",
        a.recompute,
        a.family,
        a.step_time
    );
    assert!(
        a.step_time < f.step_time,
        "{} vs full {}",
        a.step_time,
        f.step_time
    );
    // `selective`: every stage that declares it (each has two layers here), none elsewhere.
    let sel = with(None, RecomputeChoice::Selective).unwrap();
    for p in &sel.plans {
        for (st, m) in p.cost.stages.iter().zip(&p.recompute) {
            let want = if st.selective() {
                Recompute::Selective
            } else {
                Recompute::None
            };
            assert_eq!(*m, want, "{} {:?}", p.family, p.layers_per_stage);
        }
    }
    assert!(sel
        .plans
        .iter()
        .any(|p| p.recompute.contains(&Recompute::Selective)));
}

/// Eight layers whose stashes (100 bytes a sample) dwarf their inputs (1 byte) and parameters; a
/// cheap forward, so recomputing costs little time.
fn costs() -> CostFile {
    let layers = (0..8)
        .map(|i| {
            let mut l = LayerCost::new(format!("l{i}"), 0.25, 1.0, 1.0);
            l.activation_bytes = 100.0;
            l.released_at_input = 60.0;
            l.output_bytes = 1.0;
            l.parameter_bytes = 1.0;
            l
        })
        .collect();
    CostFile {
        layers,
        transfer: LinkCost::default(),
        overlap_share: 1.0,
        meta: serde_json::Value::Null,
    }
}

fn request(limit: Option<f64>, choice: RecomputeChoice) -> PlanRequest {
    let mut r = PlanRequest::new(costs(), 1.0, 4, 16);
    r.memory_limit = limit;
    r.recompute = choice;
    r.refine = 1;
    r
}

fn worst(p: &Plan) -> f64 {
    p.peak_memory.iter().copied().fold(0.0, f64::max)
}

fn recomputing(p: &Plan) -> usize {
    p.recompute
        .iter()
        .filter(|&&m| m != Recompute::None)
        .count()
}

/// The least peak of any plan without recomputation.
fn least_peak_without() -> f64 {
    let all = plan(&request(None, RecomputeChoice::None)).unwrap();
    all.plans.iter().map(worst).fold(f64::INFINITY, f64::min)
}

#[test]
fn below_every_plan_without_recomputation_a_recomputing_plan_fits() {
    let limit = 0.6 * least_peak_without();
    let none = plan(&request(Some(limit), RecomputeChoice::None));
    assert!(matches!(none, Err(PlanError::NoPlan { .. })), "{none:?}");
    let report = plan(&request(Some(limit), RecomputeChoice::Auto)).unwrap();
    let best = report.best().unwrap();
    assert!(recomputing(best) > 0, "{:?}", best.recompute);
    assert!(worst(best) <= limit, "{} > {limit}", worst(best));
    // The plan's costs carry the modes, so its timeline replays its prediction.
    let modes: Vec<Recompute> = best.cost.stages.iter().map(|s| s.recompute).collect();
    assert_eq!(modes, best.recompute);
    assert_eq!(best.timeline().unwrap().makespan(), best.step_time);
}

#[test]
fn recomputation_that_lets_a_deeper_schedule_fit_is_faster() {
    // Just under what the fastest plan without recomputation needs: it no longer fits.
    let unlimited = plan(&request(None, RecomputeChoice::None)).unwrap();
    let limit = 0.95 * worst(unlimited.best().unwrap());
    let none = plan(&request(Some(limit), RecomputeChoice::None)).unwrap();
    let auto = plan(&request(Some(limit), RecomputeChoice::Auto)).unwrap();
    let (a, n) = (auto.best().unwrap(), none.best().unwrap());
    assert!(
        a.step_time < n.step_time,
        "auto {} ({} {:?}) vs none {} ({})",
        a.step_time,
        a.family,
        a.recompute,
        n.step_time,
        n.family
    );
    assert!(recomputing(a) > 0 && worst(a) <= limit);
}

#[test]
fn a_generous_limit_recomputes_nothing() {
    let limit = 100.0 * least_peak_without();
    let auto = plan(&request(Some(limit), RecomputeChoice::Auto)).unwrap();
    let none = plan(&request(Some(limit), RecomputeChoice::None)).unwrap();
    let (a, n) = (auto.best().unwrap(), none.best().unwrap());
    assert_eq!(recomputing(a), 0, "{:?}", a.recompute);
    assert_eq!(a.step_time, n.step_time);
    // Nor does any other plan listed: where a split fits without, recomputing only slows it.
    assert!(auto.plans.iter().all(|p| recomputing(p) == 0));
}

#[test]
fn full_recomputes_every_stage() {
    let report = plan(&request(None, RecomputeChoice::Full)).unwrap();
    assert!(report
        .plans
        .iter()
        .all(|p| p.recompute.iter().all(|&m| m == Recompute::Full)));
}

#[test]
fn a_plan_written_before_recomputation_still_reads() {
    let p = plan(&request(None, RecomputeChoice::None)).unwrap().plans[0].clone();
    let mut v = serde_json::to_value(&p).unwrap();
    let obj = v.as_object_mut().unwrap();
    assert!(obj.remove("recompute").is_some());
    for st in obj["cost"]["stages"].as_array_mut().unwrap() {
        let st = st.as_object_mut().unwrap();
        st.remove("recompute");
        st.remove("input_bytes");
    }
    let back: Plan = serde_json::from_value(v).unwrap();
    assert!(back.recompute.is_empty());
    assert!(back
        .cost
        .stages
        .iter()
        .all(|s| s.recompute == Recompute::None));
    assert_eq!(back.timeline().unwrap().makespan(), p.step_time);
}

#[test]
fn a_given_schedule_gets_its_modes_chosen_with_one_argument() {
    let given = |limit, choice| {
        let names = ["1f1b".to_string(), "zb-h1".to_string()];
        let auto = AutoOptions {
            time_budget: 0.05,
            ..AutoOptions::default()
        };
        plan_given(
            &costs(),
            &Params::new(4, 8),
            &names,
            Split::Best,
            limit,
            &auto,
            choice,
        )
    };
    let free = given(None, RecomputeChoice::None).unwrap();
    let limit = 0.5 * free.plans.iter().map(worst).fold(f64::INFINITY, f64::min);
    assert!(given(Some(limit), RecomputeChoice::None).is_err());
    let report = given(Some(limit), RecomputeChoice::Auto).unwrap();
    let best = report.best().unwrap();
    assert!(recomputing(best) > 0 && worst(best) <= limit, "{best:?}");
}
