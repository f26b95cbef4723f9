//! Waiting told from being descheduled: each rank's time splits into compute (its thread's CPU
//! time in layer calls), descheduled (ready but not running) and waiting for data.
//!
//! A sleeping stage is off the CPU just as a descheduled thread is, so its forwards count as
//! descheduled; a stage that spins for a given CPU time counts that time as compute, whatever the
//! machine's load adds to its wall time. The bounds only ever widen under load.

mod runtime_support;

use std::time::Duration;

use pipefill_host::runtime::{Executor, StepReport, Tensor};
use pipefill_host::schedule::{families, Item, Op, Params};
use runtime_support::{mse, Pace, Scale};

const PACE: Duration = Duration::from_millis(30);

/// One step of GPipe on 2 ranks, M = 2: stage 0's forward sleeps, stage 1's spins, each for
/// [`PACE`].
fn step() -> StepReport {
    let schedule = families::generate("gpipe", &Params::new(2, 2)).unwrap();
    let stages = vec![
        Scale::new(1.0, 0.01).paced(Pace::Sleep(PACE)),
        Scale::new(0.5, 0.01).paced(Pace::Spin(PACE)),
    ];
    let mut ex = Executor::new(schedule, stages).unwrap();
    let x: Vec<Tensor> = (0..2)
        .map(|k| Tensor::new(vec![1, 2], vec![k as f32, 1.0]).unwrap())
        .collect();
    ex.step(x.clone(), &x, &mse).unwrap()
}

#[test]
fn sleeping_is_descheduled_and_spinning_is_compute() {
    let r = step();
    let t = &r.timeline;
    let pace = PACE.as_secs_f64();
    for (rank, lane) in t.spans.iter().enumerate() {
        for s in lane {
            let Item::One(a) = s.item() else { continue };
            if a.op != Op::F {
                continue;
            }
            let (wall, lost) = (s.end - s.start, s.descheduled());
            assert!(
                lost <= wall + 1e-6,
                "{a}: descheduled {lost} beyond its wall time {wall}"
            );
            if rank == 0 {
                // Slept PACE: at most a millisecond of it on the CPU.
                assert!(
                    lost >= pace - 1e-3,
                    "{a} slept {pace} s; descheduled {lost} s"
                );
            } else {
                // Spun PACE of CPU time: that is its compute, the rest of its wall time is lost.
                let cpu = wall - lost;
                assert!(
                    (cpu - pace).abs() < 5e-3,
                    "{a} spun {pace} s of CPU; measured {cpu} s of CPU in {wall} s"
                );
            }
        }
    }
    assert!(
        t.compute(0) < 5e-3,
        "rank 0 only slept and scaled; compute {} s",
        t.compute(0)
    );
    assert!(t.compute(1) >= 2.0 * pace - 2e-3);
}

#[test]
fn a_rank_waiting_for_data_is_waiting_not_descheduled() {
    let r = step();
    let t = &r.timeline;
    let m = t.makespan();
    for rank in 0..2 {
        let (c, d, w) = (t.compute(rank), t.descheduled(rank), t.waiting(rank));
        assert!(c >= 0.0 && d >= 0.0 && w >= 0.0, "rank {rank}: {c} {d} {w}");
        assert!(
            (c + d + w - m).abs() < 1e-5,
            "rank {rank}: compute {c} + descheduled {d} + waiting {w} != makespan {m}"
        );
    }
    // Rank 1 waits for rank 0's first forward (a PACE sleep) before anything: time waiting for
    // data, not time lost to other work, however late its thread wakes afterwards.
    assert!(
        t.waiting(1) >= PACE.as_secs_f64() - 1e-3,
        "rank 1 waited at least {PACE:?} for its first input; waiting {} s, woken late {} s",
        t.waiting(1),
        t.spans[1].iter().map(|s| s.woken_late()).sum::<f64>()
    );
}
