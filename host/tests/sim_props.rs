//! Property tests: for every family, random P, M, V and random heterogeneous costs (per-stage F, I, W,
//! B, boundary bytes, latency, bandwidth, overlap share), the simulator equals the naive reference
//! simulator item by item, never beats its lower bound, and its critical path adds up to the makespan.

mod sim_support;

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::{families, Params};
use pipefill_host::sim::{simulate, summarize};
use proptest::prelude::*;
use sim_support::{assert_critical_path, assert_matches_reference};

fn stage() -> impl Strategy<Value = StageCost> {
    (
        0.0f64..3.0,
        0.0f64..3.0,
        0.0f64..3.0,
        prop::option::of(0.0f64..6.0),
        0.0f64..1e6,
    )
        .prop_map(|(f, i, w, b, bytes)| {
            let mut s = StageCost::uniform(f, i, w);
            if let Some(b) = b {
                s.backward = b;
            }
            s.output_bytes = bytes;
            s
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn simulator_is_exact_and_bounded(
        p in 1usize..=5,
        m in 1usize..=10,
        v in 1usize..=3,
        stages in prop::collection::vec(stage(), 15),
        latency in 0.0f64..0.5,
        bandwidth in prop::option::of(1e5f64..1e7),
        share in 0.0f64..=1.0,
    ) {
        let mut simulated = 0;
        for fam in families::FAMILIES {
            let params = Params { ranks: p, microbatches: m, chunks: Some(v), group_size: None };
            let Ok(s) = (fam.generate)(&params) else { continue };
            let c = CostModel {
                stages: stages.iter().cycle().take(s.stages()).copied().collect(),
                link: LinkCost { latency, bandwidth: bandwidth.unwrap_or(f64::INFINITY) },
                overlap_share: share,
            };
            let sim = simulate(&s, &c).unwrap();
            assert_matches_reference(&s, &c, &sim);
            let t = &sim.timeline;
            let sum = summarize(&s, &c).unwrap();
            prop_assert_eq!(sum.makespan, t.makespan());
            prop_assert_eq!(&sum.peak_activations, &sim.peak_activations);
            prop_assert_eq!(sum.lower_bound, sim.lower_bound);
            for r in 0..p {
                prop_assert!((sum.busy[r] - t.busy(r)).abs() <= 1e-9 * t.makespan().max(1.0));
            }
            prop_assert!(sim.lower_bound <= t.makespan() * (1.0 + 1e-9) + 1e-12,
                "{} P={} M={} V={}: makespan {} below the bound {}", fam.name, p, m, v, t.makespan(), sim.lower_bound);
            if t.makespan() > 0.0 {
                assert_critical_path(&sim);
            }
            simulated += 1;
        }
        prop_assert!(simulated > 0, "no family generated P={} M={} V={}", p, m, v);
    }
}
