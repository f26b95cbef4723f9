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
