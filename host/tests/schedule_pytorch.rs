//! Files in the forms PyTorch pipelining writes (`_dump_csv` with `compute_only` and with
//! `compute_comms`) read back, validate, lower and simulate. The files under `tests/data/` follow
//! PyTorch's own passes for these small cases: `ScheduleGPipe` / `Schedule1F1B` orders with idle cells,
//! `_add_reduce_grad` (a `REDUCE_GRAD` after each stage's last backward), and for the compute+comms
//! form `_add_unshard_reshard` and `_add_send_recv` (receives placed by the round-robin lowering,
//! not right before their consumer).

use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::format::{from_csv, to_csv};
use pipefill_host::schedule::lower::{lower, strip};
use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{Item, Schedule};
use pipefill_host::sim::simulate;

fn read(name: &str) -> (String, Schedule) {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let s = from_csv(&text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    (text, s)
}

fn costs(stages: usize) -> CostModel {
    CostModel::uniform(
        StageCost::uniform(1.0, 1.0, 1.0),
        stages,
        LinkCost {
            latency: 0.25,
            ..LinkCost::default()
        },
    )
}

fn compute(s: &Schedule) -> Vec<Vec<Item>> {
    s.actions
        .iter()
        .map(|l| l.iter().copied().filter(Item::is_compute).collect())
        .collect()
}

#[test]
fn compute_only_files_with_reduce_grad_validate_lower_and_simulate() {
    for name in [
        "pytorch_gpipe_p2_m2_compute_only.csv",
        "pytorch_1f1b_p2_m3_compute_only.csv",
    ] {
        let (text, s) = read(name);
        assert_eq!((s.ranks, s.chunks), (2, 1), "{name}");
        validate(&s).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Written back without the idle cells, otherwise the same.
        assert_eq!(
            to_csv(&s),
            text.replace(",,,", ",")
                .replace(",,", ",")
                .replace("\n,", "\n")
                .trim_start_matches(',')
        );
        let low = lower(&s).unwrap();
        assert!(to_csv(&low).contains("0SEND_F0"), "{name}");
        let plain = simulate(&s, &costs(2)).unwrap();
        let lowered = simulate(&low, &costs(2)).unwrap();
        assert_eq!(
            plain.timeline.makespan(),
            lowered.timeline.makespan(),
            "{name}"
        );
    }
}

#[test]
fn compute_comms_file_is_run_as_written() {
    let (text, s) = read("pytorch_gpipe_p2_m2_compute_comms.csv");
    assert_eq!(to_csv(&s), text, "lossless");
    validate(&s).unwrap();
    // Lowering a schedule that has its transfers changes nothing.
    assert_eq!(lower(&s).unwrap(), s);
    // Its compute order is the compute-only file's.
    let (_, only) = read("pytorch_gpipe_p2_m2_compute_only.csv");
    assert_eq!(compute(&s), compute(&only));
    // Stripped of transfers it is still a valid schedule (UNSHARD/RESHARD/REDUCE_GRAD kept).
    let stripped = strip(&s);
    validate(&stripped).unwrap();
    assert!(to_csv(&stripped).starts_with("0UNSHARD,0F0,0F1,0B0"));
    // GPipe with F = B/2 = 1, latency 0.25: the receives PyTorch placed early wait no longer than
    // a receive right before its consumer, so the step takes what the compute-only file takes.
    let sim = simulate(&s, &costs(2)).unwrap();
    let plain = simulate(&only, &costs(2)).unwrap();
    assert_eq!(sim.timeline.makespan(), plain.timeline.makespan());
    assert_eq!(sim.timeline.transfers.len(), 4);
}

#[test]
fn damaged_comms_are_refused_with_the_place() {
    let (text, _) = read("pytorch_gpipe_p2_m2_compute_comms.csv");
    for (from, to, needle) in [
        ("1RECV_F1,", "", "add `1RECV_F1` before `1F1`"),
        ("0SEND_F0,0F1", "0F1", "no `0SEND_F0`"),
        (
            "0B1,0REDUCE_GRAD",
            "0REDUCE_GRAD,0B1",
            "after 1 of its 2 weight backwards",
        ),
        ("1UNSHARD,", "", "computes while sharded"),
    ] {
        let damaged = text.replacen(from, to, 1);
        assert_ne!(damaged, text, "{from}");
        let s = from_csv(&damaged, "damaged").unwrap();
        let e = validate(&s).expect_err(from).to_string();
        assert!(e.contains(needle), "{from}: wanted `{needle}` in {e}");
    }
}
