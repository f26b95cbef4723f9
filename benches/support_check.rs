//! Tests of the bench support module (`benches/support/`): run by `cargo test` (this target has
//! `test = true`, `bench = false`), never by `cargo bench`.

#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

use support::args::{ArgError, Baseline, BenchArgs, Mode};
use support::measure::{threshold_from_env, Better, Measurement};

fn parse(args: &[&str]) -> Result<BenchArgs, ArgError> {
    BenchArgs::parse(args.iter().copied())
}

#[test]
fn cargo_bench_flags_read_as_criterion_reads_them() {
    let a = parse(&["--save-baseline", "main", "--bench"]).unwrap();
    assert_eq!(a.mode, Mode::Bench);
    assert_eq!(a.baseline, Baseline::Save("main".into()));
    assert!(a.positional.is_empty(), "the baseline name is not a filter");

    let a = parse(&["gemm", "--baseline=main", "--bench", "--quick", "--noplot"]).unwrap();
    assert_eq!(
        a.baseline,
        Baseline::Compare {
            name: "main".into(),
            strict: true
        }
    );
    assert!(a.quick);
    assert_eq!(a.filter(), Some("gemm"));

    let a = parse(&["--bench", "--baseline-lenient", "x", "--sample-size", "10"]).unwrap();
    assert_eq!(
        a.baseline,
        Baseline::Compare {
            name: "x".into(),
            strict: false
        }
    );
    assert!(a.positional.is_empty(), "a flag's value is not a filter");
}

#[test]
fn modes_follow_criterion() {
    assert_eq!(parse(&[]).unwrap().mode, Mode::Test, "cargo test --benches");
    assert_eq!(parse(&["--bench"]).unwrap().mode, Mode::Bench);
    assert_eq!(parse(&["--bench", "--test"]).unwrap().mode, Mode::Test);
    assert_eq!(parse(&["--bench", "--list"]).unwrap().mode, Mode::List);
    assert_eq!(
        parse(&["--bench"]).unwrap().baseline,
        Baseline::Save("base".into())
    );
    assert_eq!(
        parse(&["--bench", "--discard-baseline"]).unwrap().baseline,
        Baseline::Discard
    );
}

#[test]
fn bad_command_lines_are_refused_with_the_flag_named() {
    assert_eq!(
        parse(&["--bench", "--frobnicate"]),
        Err(ArgError::Unknown("--frobnicate".into()))
    );
    assert_eq!(
        parse(&["--bench", "--baseline"]),
        Err(ArgError::MissingValue("--baseline".into()))
    );
    assert!(matches!(
        parse(&["--save-baseline", "a", "--baseline", "b"]),
        Err(ArgError::Conflict(..))
    ));
    assert_eq!(
        parse(&["--save-baseline", "../x"]),
        Err(ArgError::BadName("../x".into()))
    );
    assert!(
        parse(&["--save-baseline", "new"]).is_err(),
        "criterion's own directory"
    );
    let msg = ArgError::MissingValue("--baseline".into()).to_string();
    assert!(msg.contains("--baseline"), "{msg}");
}

#[test]
fn filters_match_as_text() {
    let a = parse(&["--bench", "speedup"]).unwrap();
    assert!(a.selects(a.filter(), "runtime_speedup/P2-M8-h512"));
    assert!(!a.selects(a.filter(), "partition/uniform"));
    let e = parse(&["--bench", "--exact", "partition/uniform"]).unwrap();
    assert!(e.selects(e.filter(), "partition/uniform"));
    assert!(!e.selects(e.filter(), "partition/uniform2"));
    let i = parse(&["--bench", "--ignored"]).unwrap();
    assert!(!i.selects(None, "partition/uniform"));
}

#[test]
fn regressions_by_direction_and_threshold() {
    let time = |v| Measurement::new("t", v, "s", Better::Lower).threshold(0.10);
    assert!(!time(1.09).against(1.0).regressed);
    assert!(time(1.11).against(1.0).regressed);
    assert!(
        !time(0.5).against(1.0).regressed,
        "faster is not a regression"
    );
    let speed = |v| Measurement::new("x", v, "x", Better::Higher).threshold(0.10);
    assert!(speed(0.89).against(1.0).regressed);
    assert!(!speed(0.91).against(1.0).regressed);
    assert!(!speed(2.0).against(1.0).regressed);
    let v = time(1.25).against(1.0);
    assert!((v.change - 0.25).abs() < 1e-12);
    assert!(v.line(&time(1.25)).starts_with("REGRESSION name=t "));
}

#[test]
fn lines_are_key_value_pairs() {
    let m = Measurement::new("gemm/forward XW/a=b", 2.5, "ns", Better::Lower);
    assert_eq!(
        m.line(),
        "pipefill-bench name=gemm/forward_XW/a_b value=2.5 unit=ns better=lower threshold=0.1"
    );
}

#[test]
fn threshold_variable_is_checked() {
    assert_eq!(threshold_from_env(None), Ok(None));
    assert_eq!(threshold_from_env(Some("15")), Ok(Some(0.15)));
    for bad in ["0", "-3", "ten", ""] {
        let e = threshold_from_env(Some(bad)).unwrap_err();
        assert!(e.contains("PIPEFILL_BENCH_THRESHOLD"), "{e}");
    }
}

#[test]
fn saved_baselines_round_trip_and_merge() {
    let dir = std::env::temp_dir().join(format!("pipefill-bench-check-{}", std::process::id()));
    let path = support::store::baseline_path(&dir, "b", "main");
    let a = Measurement::new("b/a", 1.0, "s", Better::Lower);
    let b = Measurement::new("b/b", 2.0, "x", Better::Higher);
    assert!(support::store::load(&path).unwrap().is_none());
    support::store::save(&path, &[a.clone(), b]).unwrap();
    // A filtered run saves only what it measured and keeps the rest.
    let a2 = Measurement::new("b/a", 3.0, "s", Better::Lower);
    support::store::save(&path, std::slice::from_ref(&a2)).unwrap();
    let saved = support::store::load(&path).unwrap().unwrap();
    assert_eq!(saved.measurements["b/a"], a2);
    assert_eq!(saved.measurements["b/b"].value, 2.0);
    std::fs::write(&path, "not json").unwrap();
    assert!(support::store::load(&path).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn criterion_results_written_in_this_run_are_found() {
    let home = std::env::temp_dir().join(format!("pipefill-crit-check-{}", std::process::id()));
    let write = |id: &str, dir: &str, median: f64| {
        let new = home.join(dir).join("new");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(
            new.join("benchmark.json"),
            format!("{{\"full_id\":\"{id}\"}}"),
        )
        .unwrap();
        let est = format!("{{\"median\":{{\"point_estimate\":{median}}}}}");
        std::fs::write(new.join("estimates.json"), est).unwrap();
    };
    write("g/old", "g/old", 1.0);
    let before = support::criterion_out::snapshot(&home);
    write("g/fresh bench", "g/fresh_bench", 42.0);
    let found = support::criterion_out::written_since(&home, &before);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].id, "g/fresh bench");
    assert_eq!(found[0].median_ns, 42.0);
    assert_eq!(found[0].dir, home.join("g/fresh_bench"));
    std::fs::remove_dir_all(&home).unwrap();
}

/// The instruction suite's thresholds flag a 2% slowdown and ignore a 0.5% one, through the same
/// comparison a bench runs (`Run::finish` under `--baseline`) against a saved baseline file.
#[test]
fn instruction_thresholds_flag_two_percent_and_ignore_half_a_percent() {
    use support::callgrind::{CYCLES_THRESHOLD, IR_THRESHOLD};
    let dir = std::env::temp_dir().join(format!("pipefill-ir-check-{}", std::process::id()));
    let path = support::store::baseline_path(&dir, "instructions", "main");
    let figure = |name: &str, value: f64, threshold: f64| {
        Measurement::new(name, value, "Ir", Better::Lower).threshold(threshold)
    };
    let base = 12_345_678.0;
    let names = ["x/Ir", "x/cycles"];
    let thresholds = [IR_THRESHOLD, CYCLES_THRESHOLD];
    let saved: Vec<_> = names
        .iter()
        .zip(thresholds)
        .map(|(n, t)| figure(n, base, t))
        .collect();
    support::store::save(&path, &saved).unwrap();
    let loaded = support::store::load(&path).unwrap().unwrap();
    let lookup = |m: &Measurement| loaded.measurements.get(&m.name).map(|b| b.value);
    for (n, t) in names.iter().zip(thresholds) {
        let (lines, regressions) = support::verdicts(&[figure(n, base * 1.02, t)], "main", lookup);
        assert_eq!(regressions, 1, "a 2% slowdown of {n} is flagged: {lines:?}");
        assert!(lines[0].starts_with("REGRESSION "), "{lines:?}");
        assert!(lines[0].contains("change=+2.0%"), "{lines:?}");
        let (lines, regressions) = support::verdicts(&[figure(n, base * 1.005, t)], "main", lookup);
        assert_eq!(regressions, 0, "a 0.5% change of {n} is noise: {lines:?}");
        assert!(lines[0].starts_with("ok "), "{lines:?}");
        let (_, regressions) = support::verdicts(&[figure(n, base * 0.98, t)], "main", lookup);
        assert_eq!(regressions, 0, "faster is not a regression");
    }
    let (lines, _) = support::verdicts(&[figure("y/Ir", 1.0, IR_THRESHOLD)], "main", lookup);
    assert!(lines[0].starts_with("new name=y/Ir"), "{lines:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn callgrind_totals_and_estimated_cycles() {
    use support::callgrind::Counts;
    let out = "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\n\
               events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n\
               fl=(1) a.rs\nfn=(1) f\n3 10 2\n\
               summary: 1000 300 100 10 20 5 2 3 1\ntotals: 1000 300 100 10 20 5 2 3 1\n";
    let c = Counts::parse(out).unwrap();
    assert_eq!(c.ir(), 1000);
    // L1 hits 1400 - 35 = 1365, LL hits 35 - 6 = 29, RAM 6: 1365 + 5 * 29 + 35 * 6.
    assert_eq!(c.estimated_cycles(), Some(1365 + 145 + 210));
    // Trailing zero counts may be left out; no cache events, no estimate.
    let c = Counts::parse("events: Ir Dr\ntotals: 42\n").unwrap();
    assert_eq!((c.ir(), c.get("Dr"), c.estimated_cycles()), (42, 0, None));
    assert!(Counts::parse("totals: 1\n").is_err());
    assert!(Counts::parse("events: Ir\n").is_err());
    assert!(Counts::parse("events: Ir\ntotals: x\n").is_err());
}

#[test]
fn spread_of_repeats_has_the_median_its_interval_and_the_minimum() {
    use support::stats::Spread;
    assert_eq!(Spread::of(&[]), None);
    assert_eq!(Spread::of(&[1.0, f64::NAN]), None);
    // Five repeats: no narrower interval reaches 95%, so the whole range (coverage 1 - 2/32).
    let s = Spread::of(&[5.0, 1.0, 4.0, 2.0, 3.0]).unwrap();
    assert_eq!((s.n, s.min, s.median, s.lo, s.hi), (5, 1.0, 3.0, 1.0, 5.0));
    assert!((s.coverage - 0.9375).abs() < 1e-12);
    // Fifteen: [x_(4), x_(12)], coverage 1 - 2 P(Bin(15, 1/2) <= 3) = 0.9648.
    let v: Vec<f64> = (1..=15).rev().map(f64::from).collect();
    let s = Spread::of(&v).unwrap();
    assert_eq!((s.median, s.lo, s.hi, s.min), (8.0, 4.0, 12.0, 1.0));
    assert!((s.coverage - 0.96484375).abs() < 1e-9, "{}", s.coverage);
    let even = Spread::of(&[1.0, 2.0, 3.0, 10.0]).unwrap();
    assert_eq!(even.median, 2.5);
    assert!(even
        .describe(1e3, "ms")
        .starts_with("median 2500.000 ms (87.5% CI [1000.000, 10000.000], min 1000.000, n = 4)"));
}
