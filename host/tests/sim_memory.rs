//! Memory: the simulator's peak activations agree with the validator's in-flight count (one byte per
//! stage-microbatch), and the part released at I is freed at I.

mod sim_support;

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{families, Params};
use pipefill_host::sim::{activation_curve, peak_activations, simulate};

fn unit_memory(stages: usize, released: f64) -> CostModel {
    let mut st = StageCost::uniform(1.0, 1.0, 1.0);
    st.activation_bytes = 1.0;
    st.released_at_input = released;
    CostModel::uniform(st, stages, LinkCost::default())
}

#[test]
fn peaks_agree_with_the_validator() {
    let mut checked = 0;
    for fam in families::FAMILIES {
        for p in 1..=6usize {
            for m in [1usize, 2, 5, 8, 12, 24] {
                for v in [None, Some(2), Some(3)] {
                    let params = Params {
                        ranks: p,
                        microbatches: m,
                        chunks: v,
                        group_size: None,
                    };
                    let Ok(s) = (fam.generate)(&params) else {
                        continue;
                    };
                    let report =
                        validate(&s).unwrap_or_else(|e| panic!("{} invalid: {e}", fam.name));
                    let c = unit_memory(s.stages(), 0.0);
                    let sim = simulate(&s, &c).unwrap();
                    let want: Vec<f64> = report.peak_in_flight.iter().map(|&n| n as f64).collect();
                    assert_eq!(
                        sim.peak_activations, want,
                        "{} P={p} M={m} V={v:?}",
                        fam.name
                    );
                    // The same count from the timeline alone (what a measured timeline would use).
                    assert_eq!(peak_activations(&sim.timeline, &c), want);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 50, "only {checked} schedules generated");
}

#[test]
fn released_at_input_is_freed_at_i() {
    // One rank, one microbatch: F holds 1 byte, I frees 0.25 of it, W the rest.
    let s = families::generate("gpipe", &Params::new(1, 1)).unwrap();
    let mut s = s;
    let (f, _b) = (s.actions[0][0], s.actions[0][1]);
    s.actions[0] = vec![f, "0I0".parse().unwrap(), "0W0".parse().unwrap()];
    let c = unit_memory(1, 0.25);
    let sim = simulate(&s, &c).unwrap();
    assert_eq!(
        activation_curve(&sim.timeline, &c)[0],
        vec![(0.0, 1.0), (2.0, 0.75), (3.0, 0.0)]
    );
    assert_eq!(sim.peak_activations, vec![1.0]);
}
