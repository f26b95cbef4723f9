//! The simulator runs a lowered schedule (explicit sends and receives) exactly as the compute-only
//! schedule it came from: same compute spans, same transfers, same memory.

mod sim_support;

use pipefill_host::schedule::families::{self, FAMILIES};
use pipefill_host::schedule::lower::lower;
use pipefill_host::schedule::{Item, Params};
use pipefill_host::sim::simulate;
use sim_support::costs;

#[test]
fn every_family_simulates_the_same_lowered_or_not() {
    let mut checked = 0;
    for fam in FAMILIES {
        for (p, m) in [(2, 4), (4, 8), (3, 7)] {
            let Ok(s) = families::generate(fam.name, &Params::new(p, m)) else {
                continue;
            };
            let c = costs(s.stages(), 1.0, 1.5, 0.7, 0.3);
            let plain = simulate(&s, &c).unwrap();
            let low = lower(&s).unwrap();
            let lowered = simulate(&low, &c).unwrap();
            let what = format!("{} P{p} M{m}", fam.name);
            assert_eq!(
                plain.timeline.makespan(),
                lowered.timeline.makespan(),
                "{what}"
            );
            assert_eq!(plain.peak_activations, lowered.peak_activations, "{what}");
            for r in 0..p {
                let compute: Vec<(Item, f64, f64)> = lowered.timeline.spans[r]
                    .iter()
                    .filter(|sp| sp.item().is_compute())
                    .map(|sp| (sp.item(), sp.start, sp.end))
                    .collect();
                let want: Vec<(Item, f64, f64)> = plain.timeline.spans[r]
                    .iter()
                    .map(|sp| (sp.item(), sp.start, sp.end))
                    .collect();
                assert_eq!(compute, want, "{what} rank {r}");
                assert_eq!(plain.timeline.busy(r), lowered.timeline.busy(r), "{what}");
            }
            let key = |t: &pipefill_host::timeline::Transfer| {
                (
                    t.producer(),
                    t.consumer(),
                    t.start.to_bits(),
                    t.end.to_bits(),
                )
            };
            let mut a: Vec<_> = plain.timeline.transfers.iter().map(key).collect();
            let mut b: Vec<_> = lowered.timeline.transfers.iter().map(key).collect();
            a.sort();
            b.sort();
            assert_eq!(a, b, "{what}");
            // The critical path of the lowered run is as long and passes the same compute items.
            let items = |sim: &pipefill_host::sim::Simulation| -> Vec<Item> {
                sim.critical_path
                    .iter()
                    .map(|st| sim.timeline.spans[st.rank][st.index].item())
                    .filter(Item::is_compute)
                    .collect()
            };
            assert_eq!(items(&plain), items(&lowered), "{what}");
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} schedules were compared");
}
