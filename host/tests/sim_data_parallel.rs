//! The data-parallel all-reduce model: free links change nothing, a rank's reductions queue on its
//! one channel in readiness order, the tail grows with D and the bytes, and each reduction starts no
//! earlier than its stage's last backward.

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::runtime::last_gradient_actions;
use pipefill_host::schedule::{families, Params};
use pipefill_host::sim::data_parallel::{reductions, DataParallel};
use pipefill_host::sim::simulate;

fn costs(stages: usize, bytes: f64) -> CostModel {
    let mut s = StageCost::uniform(1.0, 1.0, 0.5);
    s.parameter_bytes = bytes;
    CostModel::uniform(s, stages, LinkCost::default())
}

#[test]
fn free_links_change_nothing_and_slow_links_add_a_tail() {
    for name in ["1f1b", "zb-h1", "interleaved-1f1b", "zbv"] {
        let s = families::generate(name, &Params::new(4, 8)).unwrap();
        let c = costs(s.stages(), 4000.0);
        let sim = simulate(&s, &c).unwrap();
        let free = DataParallel {
            replicas: 8,
            link: LinkCost::default(),
        };
        let r = reductions(&s, &sim.timeline, &c, &free);
        assert_eq!(r.len(), s.stages(), "{name}: one reduction per stage");
        assert_eq!(
            free.step_time(&sim.timeline, &r),
            sim.timeline.makespan(),
            "{name}"
        );
        let mut last = sim.timeline.makespan();
        for d in [2, 4, 8] {
            let dp = DataParallel {
                replicas: d,
                link: LinkCost {
                    latency: 0.1,
                    bandwidth: 1000.0,
                },
            };
            let r = reductions(&s, &sim.timeline, &c, &dp);
            let t = dp.step_time(&sim.timeline, &r);
            assert!(
                t > sim.timeline.makespan() && t >= last,
                "{name} D={d}: {t}"
            );
            last = t;
            // Each starts after its stage's last backward; a rank's reductions do not overlap.
            let ends = last_gradient_actions(&s);
            for x in &r {
                let a = ends[x.stage].unwrap();
                let span_end = sim.timeline.spans[x.rank]
                    .iter()
                    .filter(|sp| sp.item().actions().any(|b| b == a))
                    .map(|sp| sp.end)
                    .next()
                    .unwrap();
                assert!(
                    x.start >= span_end - 1e-12,
                    "{name}: stage {} starts early",
                    x.stage
                );
                let same_rank = r.iter().filter(|y| y.rank == x.rank && y.stage != x.stage);
                for y in same_rank {
                    assert!(
                        x.end <= y.start + 1e-12 || y.end <= x.start + 1e-12,
                        "{name}: overlap"
                    );
                }
            }
        }
    }
}

#[test]
fn one_replica_reduces_nothing() {
    let s = families::generate("1f1b", &Params::new(2, 4)).unwrap();
    let c = costs(2, 1e9);
    let sim = simulate(&s, &c).unwrap();
    assert!(reductions(&s, &sim.timeline, &c, &DataParallel::NONE).is_empty());
}

#[test]
fn a_schedules_own_reduce_grad_starts_its_reduction() {
    use pipefill_host::schedule::format::{from_csv, to_csv};
    use pipefill_host::schedule::lower::lower;
    let s = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let mut c = costs(2, 1000.0);
    c.link.latency = 0.5; // rank 1's last gradient reaches rank 0 after rank 1's last backward
    let dp = DataParallel {
        replicas: 2,
        link: LinkCost {
            latency: 0.5,
            bandwidth: 1000.0,
        },
    };
    let plain = reductions(&s, &simulate(&s, &c).unwrap().timeline, &c, &dp);
    // The lowered schedule reduces right after each stage's last backward: the same reductions.
    let low = lower(&s).unwrap();
    let lowered = reductions(&low, &simulate(&low, &c).unwrap().timeline, &c, &dp);
    assert_eq!(plain, lowered);
    // Rank 1's REDUCE_GRAD moved behind its wait for the peer's last receive starts later.
    let text = to_csv(&low);
    let late = text.replacen(
        "1REDUCE_GRAD,1WAIT_SEND_B0,1WAIT_SEND_B1",
        "1WAIT_SEND_B0,1WAIT_SEND_B1,1REDUCE_GRAD",
        1,
    );
    assert_ne!(late, text);
    let late = from_csv(&late, "late").unwrap();
    let sim = simulate(&late, &c).unwrap();
    let r = reductions(&late, &sim.timeline, &c, &dp);
    let stage1 = |v: &[pipefill_host::sim::data_parallel::Reduction]| {
        v.iter().find(|x| x.stage == 1).unwrap().start
    };
    assert!(stage1(&r) > stage1(&plain), "{r:?} vs {plain:?}");
}

#[test]
fn a_wait_before_more_compute_holds_it_by_the_unoverlapped_reduction() {
    use pipefill_host::schedule::format::from_csv;
    use pipefill_host::sim::data_parallel::simulate_replicated;
    // One rank, two stages (F = 1, B = 1.5): stage 1's reduction starts after 1B0 and overlaps 0B0
    // until its wait; with the wait right after its REDUCE_GRAD, 0B0 waits for all of it.
    let late = "0F0,1F0,1B0,1REDUCE_GRAD,0B0,1WAIT_REDUCE_GRAD,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n";
    let early = "0F0,1F0,1B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n";
    let (late, early) = (
        from_csv(late, "late").unwrap(),
        from_csv(early, "early").unwrap(),
    );
    let c = costs(2, 1000.0);
    let b = c.stages[0].time(pipefill_host::schedule::Op::B);
    let compute = 2.0 * (c.stages[0].forward + b);
    // Without replicas the waits cost nothing.
    let none = DataParallel::NONE;
    for s in [&late, &early] {
        let run = simulate_replicated(s, &c, &none).unwrap();
        assert_eq!(run.step_time, compute);
        assert_eq!(run.simulation.timeline.makespan(), compute);
    }
    for bandwidth in [2000.0, 500.0] {
        // Each reduction moves 1000 bytes: 0.5 s (under 0B0) or 2 s (over it).
        let dp = DataParallel {
            replicas: 2,
            link: LinkCost {
                latency: 0.0,
                bandwidth,
            },
        };
        let r = dp.all_reduce_time(1000.0);
        let (l, e) = (
            simulate_replicated(&late, &c, &dp).unwrap(),
            simulate_replicated(&early, &c, &dp).unwrap(),
        );
        // The late wait hides min(R, B) of stage 1's reduction under 0B0; the early one none.
        assert_eq!(l.step_time, compute + (r - b).max(0.0) + r, "R = {r}");
        assert_eq!(e.step_time, compute + 2.0 * r, "R = {r}");
        assert_eq!(e.step_time - l.step_time, r.min(b), "R = {r}");
        // The wait holds the compute after it, not only the step's end.
        let start_of = |sim: &pipefill_host::sim::Simulation, item: &str| {
            sim.timeline.spans[0]
                .iter()
                .find(|sp| sp.item().to_string() == item)
                .unwrap()
                .start
        };
        assert_eq!(
            start_of(&e.simulation, "0B0") - start_of(&l.simulation, "0B0"),
            r
        );
        // The reductions reported are the ones the run waited for.
        let stage1 = e.reductions.iter().find(|x| x.stage == 1).unwrap();
        assert_eq!(stage1.end, start_of(&e.simulation, "0B0"));
    }
}

#[test]
fn a_lowered_schedule_waits_where_its_reductions_cost_nothing() {
    use pipefill_host::schedule::format::{from_csv, to_csv};
    use pipefill_host::schedule::lower::lower;
    use pipefill_host::sim::data_parallel::simulate_replicated;
    let s = families::generate("interleaved-1f1b", &Params::new(2, 4)).unwrap();
    let c = costs(s.stages(), 1000.0);
    let dp = DataParallel {
        replicas: 4,
        link: LinkCost {
            latency: 0.1,
            bandwidth: 1000.0,
        },
    };
    // Where lowering puts the waits, the reductions lengthen the step as after the run.
    let low = lower(&s).unwrap();
    let run = simulate_replicated(&low, &c, &dp).unwrap();
    let plain = simulate(&s, &c).unwrap();
    let after = dp.step_time(&plain.timeline, &reductions(&s, &plain.timeline, &c, &dp));
    assert!(
        (run.step_time - after).abs() < 1e-9,
        "{} vs {after}",
        run.step_time
    );
    // Rank 0 waits for stage 2's reduction right after starting it: its stage 0 backwards wait.
    let text = to_csv(&low);
    let moved = text.replacen("2WAIT_REDUCE_GRAD,", "", 1).replacen(
        "2REDUCE_GRAD,",
        "2REDUCE_GRAD,2WAIT_REDUCE_GRAD,",
        1,
    );
    assert_ne!(moved, text);
    let early = simulate_replicated(&from_csv(&moved, "early").unwrap(), &c, &dp).unwrap();
    assert!(early.step_time > run.step_time + 1e-9);
}
