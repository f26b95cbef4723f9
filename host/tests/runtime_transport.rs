//! The per-rank runner over a transport: ranks run by hand with `run_rank` over `Channels` (or a
//! transport wrapping it) give the threaded `Executor`'s step, and every crossing goes through the
//! transport exactly at the lowered schedule's sends and receives.

mod runtime_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pipefill_host::runtime::{
    assemble, optimizer_steps, run_rank, Channels, Executor, Parcel, RankOutcome, RankProgram,
    RankStep, Tensor, Transport, TransportError,
};
use pipefill_host::schedule::deps::Edge;
use pipefill_host::schedule::lower::lower;
use pipefill_host::schedule::{families, Item, Params, Schedule};
use runtime_support::{mse, Scale};

/// Counts what goes through the transport.
struct Counted<'a> {
    inner: &'a mut Channels,
    sends: &'a AtomicUsize,
    recvs: &'a AtomicUsize,
}

impl Transport for Counted<'_> {
    fn send(
        &mut self,
        edge: Edge,
        to: usize,
        parcel: Parcel,
        _after: (),
    ) -> Result<(), TransportError> {
        self.sends.fetch_add(1, Ordering::SeqCst);
        self.inner.send(edge, to, parcel, ())
    }
    fn recv(
        &mut self,
        edge: Edge,
        from: usize,
        shape: Option<&[usize]>,
    ) -> Result<(Parcel, ()), TransportError> {
        self.recvs.fetch_add(1, Ordering::SeqCst);
        self.inner.recv(edge, from, shape)
    }
    fn abort(&mut self) {
        self.inner.abort();
    }
    fn aborted(&self) -> bool {
        self.inner.aborted()
    }
    fn finish(&mut self, ok: bool) -> bool {
        self.inner.finish(ok)
    }
}

fn stages(n: usize) -> Vec<Scale> {
    (0..n)
        .map(|s| Scale::new(1.0 + 0.05 * s as f32, 0.1))
        .collect()
}

fn data(m: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    let x = |k: usize| Tensor::new(vec![1, 2], vec![0.3 + 0.1 * k as f32, -0.5]).unwrap();
    let t = |k: usize| Tensor::new(vec![1, 2], vec![0.1, 0.02 * k as f32]).unwrap();
    ((0..m).map(x).collect(), (0..m).map(t).collect())
}

/// One step run rank by rank with `run_rank` on threads of our own; losses, weights and counts.
fn by_hand(schedule: &Schedule, sends: &AtomicUsize, recvs: &AtomicUsize) -> (Vec<f32>, Vec<f32>) {
    let p = schedule.ranks;
    let program = RankProgram::of(schedule);
    let (xs, ts) = data(schedule.microbatches);
    let mut all = stages(schedule.stages());
    let mut channels = Channels::connect(p, Duration::from_micros(50));
    let mut local: Vec<Vec<(usize, &mut Scale)>> = (0..p).map(|_| Vec::new()).collect();
    for (s, st) in all.iter_mut().enumerate() {
        local[schedule.rank_of(s)].push((s, st));
    }
    let epoch = Instant::now();
    let first = schedule.rank_of(0);
    let mut inputs = Some(xs);
    let outcomes = std::thread::scope(|scope| {
        let handles: Vec<_> = local
            .into_iter()
            .zip(channels.iter_mut())
            .enumerate()
            .map(|(rank, (stages, ch))| {
                let step = RankStep {
                    schedule,
                    program: &program,
                    rank,
                    stages,
                    inputs: if rank == first {
                        inputs.take().unwrap()
                    } else {
                        Vec::new()
                    },
                    targets: &ts,
                    loss: &mse,
                    epoch,
                    exclusive: None,
                    hook: None,
                    reduce: None,
                    recompute: &[],
                };
                let mut t = Counted {
                    inner: ch,
                    sends,
                    recvs,
                };
                scope.spawn(move || run_rank(step, &mut t))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    // Outcomes travel between processes as serde data (what `train --launcher mpi` sends): the
    // report assembled from them is the same.
    let wired: Vec<RankOutcome> = outcomes
        .iter()
        .map(|o| serde_json::from_slice(&serde_json::to_vec(o).unwrap()).unwrap())
        .collect();
    let seconds = epoch.elapsed().as_secs_f64();
    let report = assemble(schedule, outcomes, seconds).unwrap();
    let back = assemble(schedule, wired, seconds).unwrap();
    // Losses travel as bits; times as JSON numbers (serde_json's parse may differ in the last bit).
    assert_eq!(back.losses, report.losses);
    assert_eq!(back.peak_held_bytes, report.peak_held_bytes);
    assert_eq!(back.action_seconds.len(), report.action_seconds.len());
    // Every rank succeeded: the optimizer steps are the caller's.
    optimizer_steps(all.iter_mut().enumerate(), |s| schedule.rank_of(s)).unwrap();
    (report.losses, all.iter().map(|s| s.w).collect())
}

#[test]
fn a_rank_outcome_travels_as_serde_data_with_exact_losses() {
    let mut out = RankOutcome::empty(Ok(()));
    out.losses = vec![(0, f32::NAN), (1, 0.1), (2, f32::from_bits(1))];
    out.peak_held = 48;
    out.action_seconds = vec![("1I2".parse().unwrap(), 0.25)];
    let json = serde_json::to_string(&out).unwrap();
    let back: RankOutcome = serde_json::from_str(&json).unwrap();
    let bits = |o: &RankOutcome| -> Vec<(usize, u32)> {
        o.losses.iter().map(|&(k, l)| (k, l.to_bits())).collect()
    };
    assert_eq!(bits(&back), bits(&out));
    assert_eq!(
        (back.peak_held, back.action_seconds),
        (48, out.action_seconds)
    );
    assert!(back.result.is_ok());
}

#[test]
fn ranks_run_by_hand_over_a_transport_equal_the_executor() {
    for name in [
        "gpipe",
        "1f1b",
        "interleaved-1f1b",
        "zb-h1",
        "zbv",
        "dualpipev",
    ] {
        let Ok(schedule) = families::generate(name, &Params::new(3, 6)) else {
            let schedule = families::generate(name, &Params::new(2, 4)).unwrap();
            check(schedule);
            continue;
        };
        check(schedule);
    }
}

fn check(schedule: Schedule) {
    let (sends, recvs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let (losses, weights) = by_hand(&schedule, &sends, &recvs);
    let (xs, ts) = data(schedule.microbatches);
    let mut ex = Executor::new(schedule.clone(), stages(schedule.stages())).unwrap();
    let report = ex.step(xs, &ts, &mse).unwrap();
    ex.optimizer_step().unwrap();
    assert_eq!(losses, report.losses, "{}", schedule.name);
    let ex_w: Vec<f32> = ex.stages().iter().map(|s| s.w).collect();
    assert_eq!(weights, ex_w, "{}", schedule.name);
    // One send and one receive per crossing of the lowered schedule (a send's wait moves nothing).
    let lowered = lower(&schedule).unwrap();
    let comms = lowered
        .actions
        .iter()
        .flatten()
        .filter(|i| matches!(i, Item::Comm(c) if !c.op.is_wait()))
        .count();
    assert!(comms > 0, "{}", schedule.name);
    assert_eq!(sends.load(Ordering::SeqCst) * 2, comms, "{}", schedule.name);
    assert_eq!(recvs.load(Ordering::SeqCst) * 2, comms, "{}", schedule.name);
}
