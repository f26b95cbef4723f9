//! Property tests over every family in the registry: for P in 1..=16, M in 1..=64, V in 1..=4 (and
//! for interleaved families any group size), generating gives either a schedule that validates or a
//! typed refusal; never a panic, never an invalid schedule; and every family generates in at least
//! a sixteenth of the cases. Plus the peak in-flight laws (no refusal there: a refusal fails them).

mod prop_coverage;

use pipefill_host::schedule::families::{Family, FAMILIES};
use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{families, Params, ScheduleError};
use prop_coverage::Tally;
use proptest::prelude::*;

fn params() -> impl Strategy<Value = Params> {
    (
        1usize..=16,
        1usize..=64,
        1usize..=4,
        prop::option::of(1usize..=20),
    )
        .prop_map(|(p, m, v, g)| Params {
            ranks: p,
            microbatches: m,
            chunks: Some(v),
            group_size: g,
        })
}

/// Checks one family on `p`: a schedule that validates (tallied under the family's name) or a
/// typed refusal.
fn validates_or_refuses(fam: &Family, p: &Params, tally: &Tally) -> Result<(), TestCaseError> {
    match (fam.generate)(p) {
        Ok(s) => {
            prop_assert_eq!(s.ranks, p.ranks);
            prop_assert_eq!(s.microbatches, p.microbatches);
            prop_assert_eq!(Some(s.chunks), p.chunks);
            prop_assert_eq!(s.placement, fam.placement);
            if let Err(e) = validate(&s) {
                prop_assert!(false, "{} with {:?} is invalid: {}", fam.name, p, e);
            }
            tally.hit(fam.name);
        }
        Err(ScheduleError::Refused { family, reason }) => {
            prop_assert_eq!(family, fam.name);
            prop_assert!(!reason.is_empty());
        }
        Err(e) => prop_assert!(false, "{} with {:?}: untyped refusal {}", fam.name, p, e),
    }
    Ok(())
}

#[test]
fn every_family_validates_or_refuses() {
    let tally = prop_coverage::run(file!(), 256, params(), |p, tally| {
        FAMILIES
            .iter()
            .try_for_each(|fam| validates_or_refuses(fam, &p, tally))
    });
    // Measured acceptance over 20000 draws of `params()`: looped-bfs 100%, interleaved-1f1b 45%,
    // interleaved-zb 36%, the V = 1 families and zbv 25%, dualpipev 19%. A sixteenth is more than
    // 5 standard deviations below the lowest, so only a generator that stopped generating fails.
    for fam in FAMILIES {
        tally.assert_floor(fam.name, 16);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn gpipe_peak_is_m_and_1f1b_peak_is_min_m_p_minus_r(p in 1usize..=16, m in 1usize..=64) {
        let g = families::generate("gpipe", &Params::new(p, m)).unwrap();
        prop_assert_eq!(validate(&g).unwrap().peak_in_flight, vec![m; p]);
        let s = families::generate("1f1b", &Params::new(p, m)).unwrap();
        let want: Vec<usize> = (0..p).map(|r| m.min(p - r)).collect();
        prop_assert_eq!(validate(&s).unwrap().peak_in_flight, want);
    }

    #[test]
    fn looped_bfs_peak_is_v_times_m(p in 1usize..=16, m in 1usize..=64, v in 1usize..=4) {
        let s = families::generate("looped-bfs", &Params::new(p, m).with_chunks(v)).unwrap();
        prop_assert_eq!(validate(&s).unwrap().peak_in_flight, vec![v * m; p]);
    }
}

#[test]
fn defaults_work_for_every_family() {
    for fam in FAMILIES {
        let p = Params::new(4, 8);
        let s = families::generate(fam.name, &p).unwrap_or_else(|e| {
            panic!("{} refuses its own defaults (P = 4, M = 8): {e}", fam.name)
        });
        assert_eq!(s.chunks, fam.default_chunks, "{}", fam.name);
        assert_eq!(s.name, fam.name);
        if let Err(e) = validate(&s) {
            panic!("{} with its defaults is invalid: {e}", fam.name);
        }
    }
}

#[test]
fn refusals_say_what_works() {
    let e = families::generate("1f1b", &Params::new(4, 8).with_chunks(2)).unwrap_err();
    assert!(e.to_string().contains("use V = 1"), "{e}");
    let e = families::generate("interleaved-1f1b", &Params::new(4, 8).with_chunks(1)).unwrap_err();
    assert!(e.to_string().contains("use V >= 2"), "{e}");
    let e = families::generate("gpipe", &Params::new(0, 8)).unwrap_err();
    assert!(
        e.to_string().contains("ranks (P) must be at least 1"),
        "{e}"
    );
    let e = families::generate("gpipe", &Params::new(1 << 20, 1 << 20)).unwrap_err();
    assert!(e.to_string().contains("exceeds the limit"), "{e}");
    let e = families::generate("nope", &Params::new(2, 2)).unwrap_err();
    assert!(matches!(e, ScheduleError::UnknownFamily { .. }));
}

#[test]
fn auto_asked_of_the_generators_names_its_entry_point() {
    let e = families::generate("auto", &Params::new(2, 4)).unwrap_err();
    assert_eq!(e, ScheduleError::AutoNeedsCosts);
    assert!(e.to_string().contains("auto::solve"), "{e}");
    assert!(e.to_string().contains("plan::generate(\"auto\""), "{e}");
}
