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
