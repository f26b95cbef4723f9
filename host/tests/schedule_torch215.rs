//! Files written by PyTorch 2.15 itself (`scripts/torch/dump_fixtures.py`: every family it has, both
//! CSV forms, three shapes) validate and simulate in pipefill, and pipefill's lowered schedules of
//! every family and `auto` pass PyTorch 2.15's rules for a compute+comms schedule.

use std::collections::BTreeSet;

use pipefill_host::auto::{solve, AutoRequest};
use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::families::{self, FAMILIES};
use pipefill_host::schedule::format::{from_csv, to_csv};
use pipefill_host::schedule::lower::{lower, strip};
use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{CommOp, Item, ParamOp, Params, Schedule, ScheduleError};
use pipefill_host::sim::simulate;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/torch215");

/// Every fixture: (file name, its text).
fn fixtures() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(DIR)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

fn costs(stages: usize) -> CostModel {
    let mut c = CostModel::uniform(
        StageCost::uniform(1.0, 1.0, 1.0),
        stages,
        LinkCost {
            latency: 0.25,
            ..LinkCost::default()
        },
    );
    for (s, st) in c.stages.iter_mut().enumerate() {
        st.forward += 0.1 * s as f64; // uneven, so an order that waits shows
    }
    c
}

fn compute(s: &Schedule) -> Vec<Vec<Item>> {
    s.actions
        .iter()
        .map(|l| l.iter().copied().filter(Item::is_compute).collect())
        .collect()
}

/// PyTorch 2.15's checks of a compute+comms schedule, as `_PipelineScheduleRuntime` runs them
/// (`_validate_send_waits` and the reduction check of `_prepare_schedule_with_comms`): every send
/// has one later wait of the same stage and microbatch and no wait comes without its send; every
/// `REDUCE_GRAD` is matched by its `WAIT_REDUCE_GRAD` with at most one pending per rank.
fn pytorch_comms_rules(s: &Schedule) -> Result<(), String> {
    for (rank, list) in s.actions.iter().enumerate() {
        let mut pending = BTreeSet::new();
        let mut reduction: Option<usize> = None;
        for it in list {
            match it {
                Item::Comm(c) if c.op.is_send() => {
                    let fresh = pending.insert((c.op, c.stage, c.microbatch));
                    fresh
                        .then_some(())
                        .ok_or_else(|| format!("Duplicate pipeline send {c} at rank {rank}"))?;
                }
                Item::Comm(c) if c.op.is_wait() => {
                    let send = if c.op == CommOp::WaitSendF {
                        CommOp::SendF
                    } else {
                        CommOp::SendB
                    };
                    if !pending.remove(&(send, c.stage, c.microbatch)) {
                        return Err(format!(
                            "Pipeline wait {c} at rank {rank} has no pending send"
                        ));
                    }
                }
                Item::Param(p) if p.op == ParamOp::ReduceGrad => {
                    if let Some(other) = reduction.replace(p.stage) {
                        return Err(format!(
                            "Rank {rank} cannot start REDUCE_GRAD for stage {} while stage \
                             {other} has a pending reduction",
                            p.stage
                        ));
                    }
                }
                Item::Param(p) if p.op == ParamOp::WaitReduceGrad => {
                    let matched = reduction.take() == Some(p.stage);
                    matched
                        .then_some(())
                        .ok_or_else(|| format!("Rank {rank} has an unmatched {p}"))?;
                }
                _ => {}
            }
        }
        if !pending.is_empty() {
            return Err(format!(
                "Pipeline sends at rank {rank} have no matching wait: {pending:?}"
            ));
        }
        if let Some(stage) = reduction {
            return Err(format!(
                "Stage {stage} at rank {rank} has REDUCE_GRAD without WAIT_REDUCE_GRAD"
            ));
        }
    }
    Ok(())
}

#[test]
fn every_pytorch_file_validates_and_simulates() {
    let files = fixtures();
    // 5 multi-stage families and GPipe in both forms, 1F1B's compute-only order; 3 shapes each.
    assert_eq!(files.len(), 39);
    let mut checked = 0;
    for (name, text) in &files {
        if name.starts_with("1f1b_") {
            continue; // below: PyTorch 2.15 writes an order it refuses itself
        }
        let s = from_csv(text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let report = validate(&s).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.peak_in_flight.len(), s.ranks);
        // The same items back, without PyTorch's idle cells and line ends.
        let cells: Vec<String> = text
            .lines()
            .map(|l| {
                l.split(',')
                    .filter(|c| !c.is_empty())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        assert_eq!(to_csv(&s), cells.join("\n") + "\n", "{name}");
        let sim = simulate(&s, &costs(s.stages())).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(sim.timeline.makespan() >= sim.lower_bound - 1e-9, "{name}");
        if name.ends_with("_compute_comms.csv") {
            pytorch_comms_rules(&s).unwrap_or_else(|e| panic!("{name}: {e}"));
            // Its compute order is the compute-only file's, and it moves what a crossing needs.
            let only = name.replace("_compute_comms", "_compute_only");
            let (_, only_text) = files.iter().find(|(n, _)| *n == only).unwrap();
            let only = from_csv(only_text, &only).unwrap();
            assert_eq!(compute(&s), compute(&only), "{name}");
            let crossings = (1..s.stages())
                .filter(|&st| s.rank_of(st) != s.rank_of(st - 1))
                .count();
            assert_eq!(sim.timeline.transfers.len(), 2 * crossings * s.microbatches);
            // Stripped of what lowering adds, it is a compute-only schedule that simulates.
            let stripped = strip(&s);
            validate(&stripped).unwrap_or_else(|e| panic!("{name} stripped: {e}"));
        }
        checked += 1;
    }
    assert_eq!(checked, 36);
}

#[test]
fn pytorch_comms_files_take_what_their_compute_order_takes() {
    // PyTorch's runtime posts a receive where it sits and waits on it at the compute that uses
    // the data: its compute+comms files, whose receives sit early, take no longer than their
    // compute-only order at zero transfer latency, on every fixture, and PyTorch 2.15's own
    // files take exactly that (their sends' waits never hold a rank).
    let files = fixtures();
    let mut checked = 0;
    for (name, text) in files
        .iter()
        .filter(|(n, _)| n.ends_with("_compute_comms.csv"))
    {
        let comms = from_csv(text, name).unwrap();
        let only_name = name.replace("_compute_comms", "_compute_only");
        let (_, only_text) = files.iter().find(|(n, _)| *n == only_name).unwrap();
        let only = from_csv(only_text, &only_name).unwrap();
        for latency in [0.0, 0.25] {
            let mut c = costs(comms.stages());
            c.link.latency = latency;
            let (a, b) = (simulate(&comms, &c).unwrap(), simulate(&only, &c).unwrap());
            let (a, b) = (a.timeline.makespan(), b.timeline.makespan());
            assert!(a <= b + 1e-9, "{name} latency {latency}: {a} > {b}");
            assert!((a - b).abs() < 1e-9, "{name} latency {latency}: {a} vs {b}");
        }
        checked += 1;
    }
    assert_eq!(checked, 18);
    // The numbers: PyTorch's ZBV at P = 4, M = 8 is pipefill's `zbv` order, which with
    // F = I = W = 1 and free links meets the lower bound; its compute+comms file does too (it did
    // not while the simulator blocked a rank at each receive: its receives sit early).
    let text = &files
        .iter()
        .find(|(n, _)| n == "zbv_p4_m8_compute_comms.csv")
        .unwrap()
        .1;
    let zbv = from_csv(text, "zbv").unwrap();
    let ours = families::generate("zbv", &Params::new(4, 8)).unwrap();
    assert_eq!(compute(&strip(&zbv)), compute(&ours));
    let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 8, LinkCost::default());
    let (sim, own) = (simulate(&zbv, &c).unwrap(), simulate(&ours, &c).unwrap());
    assert_eq!(sim.timeline.makespan(), sim.lower_bound);
    assert_eq!(sim.timeline.makespan(), own.timeline.makespan());
}

#[test]
fn pytorch_1f1b_order_is_refused_as_pytorch_refuses_it() {
    // PyTorch 2.15's Schedule1F1B._get_pipeline_order starts the last rank at microbatch 1 and ends
    // it at microbatch M (its own _validate_schedule refuses it: "Running Full Backward for stage
    // 1, microbatch 0 without first running Forward"). Read with M + 1 microbatches, rank 0
    // reduces its gradients after M of them.
    for (name, text) in fixtures().iter().filter(|(n, _)| n.starts_with("1f1b_")) {
        let s = from_csv(text, name).unwrap();
        let m = s.microbatches - 1;
        let e = validate(&s).expect_err(name).to_string();
        let wanted = format!(
            "rank 0, position {}, `0REDUCE_GRAD`: `0REDUCE_GRAD` reduces the gradients of stage 0 \
             after {m} of its {} weight backwards",
            2 * m,
            m + 1
        );
        assert!(e.starts_with(&wanted), "{name}: {e}");
    }
}

#[test]
fn pipefill_lowered_schedules_pass_pytorch_rules() {
    let mut checked = 0;
    for fam in FAMILIES {
        for (p, m) in [(2, 4), (4, 8), (3, 6)] {
            let Ok(s) = families::generate(fam.name, &Params::new(p, m)) else {
                continue;
            };
            let low = lower(&s).unwrap();
            pytorch_comms_rules(&low).unwrap_or_else(|e| panic!("{} P{p}: {e}", fam.name));
            validate(&low).unwrap();
            // The waits cost nothing: the lowered file takes what the compute-only one takes.
            let c = costs(s.stages());
            let (plain, lowered) = (simulate(&s, &c).unwrap(), simulate(&low, &c).unwrap());
            assert!(
                (plain.timeline.makespan() - lowered.timeline.makespan()).abs() < 1e-9,
                "{} P{p} M{m}",
                fam.name
            );
            checked += 1;
        }
    }
    assert!(checked >= 30, "{checked}");
    for (p, m) in [(2, 4), (4, 8)] {
        let req = AutoRequest::new(p, m, costs(p)).with_budget(0.01, 1);
        let s = solve(&req).unwrap().schedule;
        let low = lower(&s).unwrap();
        pytorch_comms_rules(&low).unwrap();
        validate(&low).unwrap();
    }
}

#[test]
fn pytorch_rules_checker_catches_what_pytorch_refuses() {
    // The checker above refuses what PyTorch refuses, so the test above can fail.
    let s = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let low = lower(&s).unwrap();
    let text = to_csv(&low);
    // So does pipefill's validator, naming the rank and the position.
    for (from, to, needle) in [
        (
            ",0WAIT_SEND_F0",
            "",
            "rank 0, position 1, `0SEND_F0`: `0SEND_F0` has no matching `0WAIT_SEND_F0`",
        ),
        (
            "0REDUCE_GRAD,0WAIT_REDUCE_GRAD",
            "0REDUCE_GRAD",
            "`0REDUCE_GRAD` has no matching `0WAIT_REDUCE_GRAD`",
        ),
        (
            "1SEND_B0,",
            "1WAIT_SEND_B0,1SEND_B0,",
            "`1WAIT_SEND_B0` waits for `1SEND_B0`, which is not before it on rank 1",
        ),
    ] {
        let damaged = text.replacen(from, to, 1);
        assert_ne!(damaged, text, "{from}");
        let d = from_csv(&damaged, "damaged").unwrap();
        assert!(pytorch_comms_rules(&d).is_err(), "{from}");
        let e = validate(&d).expect_err(from).to_string();
        assert!(e.contains(needle), "{from}: wanted `{needle}` in {e}");
    }
}

#[test]
fn two_pending_reductions_and_a_wait_that_blocks_the_peer_are_refused() {
    // Two reductions pending at once on rank 0 (stages 0 and 2 of interleaved 1F1B).
    let s = "0F0,2F0,2B0,0B0,2REDUCE_GRAD,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,2WAIT_REDUCE_GRAD\n\
             1F0,3F0,3B0,1B0\n";
    let e = validate(&from_csv(s, "two").unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank 0, position 5, `0REDUCE_GRAD`: stage 0's reduction would start while stage 2's is pending"),
        "{e}"
    );
    // A send's wait before the peer can post its receive: rank 0 waits for 1RECV_F0, which rank 1
    // reaches only after 0's gradient, which rank 0 sends after the wait.
    let s = "0F0,0SEND_F0,0WAIT_SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n";
    let ok = from_csv(s, "fine").unwrap();
    validate(&ok).unwrap();
    let blocked = "0F0,0SEND_F0,0F1,0SEND_F1,0WAIT_SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1\n\
                   1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1WAIT_SEND_B0,1WAIT_SEND_B1\n";
    validate(&from_csv(blocked, "fine too").unwrap()).unwrap();
    // Receives posted early (PyTorch's irecv) do not block their rank: rank 1 posts microbatch 1's
    // receive before it computes microbatch 0, whose gradient rank 0 needs before it sends
    // microbatch 1. A rank that blocked at its receives would deadlock here.
    let early = "0F0,0SEND_F0,0WAIT_SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1,0WAIT_SEND_F1\n\
                 1RECV_F0,1RECV_F1,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1WAIT_SEND_B0,1WAIT_SEND_B1\n";
    let early = from_csv(early, "early").unwrap();
    validate(&early).unwrap();
    let c = costs(2);
    let (posted, plain) = (
        simulate(&early, &c).unwrap(),
        simulate(&strip(&early), &c).unwrap(),
    );
    assert_eq!(posted.timeline.makespan(), plain.timeline.makespan());
    // Each rank's send's wait is where the peer posts its receive only after its own wait: a cycle.
    let deadlock = "0F0,0SEND_F0,0F1,0SEND_F1,0WAIT_SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0WAIT_SEND_F0\n\
                    1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1WAIT_SEND_B1\n";
    let e = validate(&from_csv(deadlock, "stuck").unwrap()).unwrap_err();
    assert!(matches!(e, ScheduleError::Deadlock { .. }), "{e}");
    let e = e.to_string();
    for waits in ["0WAIT_SEND_F1", "1RECV_F1", "1WAIT_SEND_B0", "0RECV_B0"] {
        assert!(e.contains(waits), "{waits} in {e}");
    }
    // The simulator refuses it the same way.
    let sim = simulate(&from_csv(deadlock, "stuck").unwrap(), &c).unwrap_err();
    assert_eq!(sim.to_string(), format!("schedule: {e}"));
}
