//! One process per rank, modelled by threads: each rank runs only its own stages on its own
//! `CpuStreams` device with the per-rank runner (`RankStreams`), and the data crosses ranks through
//! `CpuPeers`, the CPU twin of NCCL point-to-point (in-order matching per pair, rendezvous,
//! deadlines). Every family's step equals `sequential_step` within 1e-5; posting the receives in
//! the receiver's own order instead of the sender's is caught for `zbv` (the twin names both
//! edges); a rank that never comes, a wrong receive shape and a failing layer are reported.

use std::time::Duration;

use pipefill_host::runtime::streams::{
    CpuPeer, CpuPeers, CpuStreams, OnStreams, Pending, PostOrder, RankBatch, RankStreams,
};
use pipefill_host::runtime::{
    assemble, sequential_step, RankOutcome, RankStop, RuntimeError, Stage, StageError, StepReport,
    Tensor, TransportError,
};
use pipefill_host::schedule::deps::Edge;
use pipefill_host::schedule::families;
use pipefill_host::schedule::{Params, Schedule};

mod streams_support;

use streams_support::{cells, for_every_family_shape, mse, Cell};

fn batch(m: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    let x = |k: usize| Tensor::new(vec![2, 2], vec![0.1 * k as f32, -0.3, 0.7, 0.2]).unwrap();
    let t = |k: usize| Tensor::new(vec![2, 2], vec![0.4, 0.05 * k as f32, -0.2, 0.3]).unwrap();
    ((0..m).map(x).collect(), (0..m).map(t).collect())
}

/// Per stage: `(stage, grads, w)` after the step.
type States = Vec<(usize, (f32, f32), f32)>;

/// What one rank thread hands back: its outcome and its own stages' states.
type RankResult = (RankOutcome, States);

/// One rank of `schedule` as a thread would run it: its own device, its own stages (`stage` makes
/// stage `s`), the runner, one step over `peer`.
fn run_rank<S: Stage + 'static>(
    schedule: &Schedule,
    rank: usize,
    peer: &mut CpuPeer,
    order: PostOrder,
    stage: impl Fn(usize) -> S,
    shape: &dyn Fn(Edge) -> Vec<usize>,
    read: impl Fn(&S) -> ((f32, f32), f32),
) -> Result<RankResult, RuntimeError>
where
    S::Stash: 'static,
{
    let (xs, ts) = batch(schedule.microbatches);
    let device = CpuStreams::new();
    let mine: Vec<(usize, OnStreams<S>)> = (0..schedule.stages())
        .filter(|&s| schedule.rank_of(s) == rank)
        .map(|s| (s, device.stage(stage(s))))
        .collect();
    let loss = device.loss(mse);
    let holds_first = schedule.rank_of(0) == rank;
    let mut runner = RankStreams::new(schedule.clone(), rank, mine, device, order)?;
    let inputs = if holds_first {
        xs.into_iter().map(Pending::ready).collect()
    } else {
        Vec::new()
    };
    let targets: Vec<_> = ts.into_iter().map(Pending::ready).collect();
    let outcome = runner.step(
        RankBatch {
            inputs,
            targets: &targets,
            loss: &loss,
            shape,
        },
        peer,
    );
    // The trainer's optimizer step: applied after a step every rank finished, refused otherwise.
    let applied = runner.optimizer_step();
    if outcome.result.is_ok() {
        applied?;
    } else {
        assert_eq!(applied, Err(RuntimeError::NoGradients), "rank {rank}");
    }
    let states = runner
        .stages()
        .iter()
        .map(|(s, st)| {
            let (g, w) = read(&st.inner());
            (*s, g, w)
        })
        .collect();
    Ok((outcome, states))
}

/// Every rank of `schedule` on its own thread over `CpuPeers`: the assembled report (or the first
/// cause) and every stage's `(stage, grads, w)`.
fn run_ranks(
    schedule: &Schedule,
    order: PostOrder,
    peers: Vec<CpuPeer>,
    shape: &(dyn Fn(Edge) -> Vec<usize> + Sync),
) -> (Result<StepReport, RuntimeError>, States) {
    let results: Vec<Result<RankResult, RuntimeError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = peers
            .into_iter()
            .enumerate()
            .map(|(rank, mut peer)| {
                scope.spawn(move || {
                    let start = cells(schedule.stages());
                    run_rank(
                        schedule,
                        rank,
                        &mut peer,
                        order,
                        |s| start[s].clone(),
                        shape,
                        |c: &Cell| (c.grads, c.w),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut outcomes = Vec::new();
    let mut states = Vec::new();
    for r in results {
        match r {
            Ok((o, s)) => {
                outcomes.push(o);
                states.extend(s);
            }
            Err(e) => return (Err(e), states),
        }
    }
    states.sort_by_key(|s| s.0);
    (assemble(schedule, outcomes, 0.0), states)
}

fn same_shape(_: Edge) -> Vec<usize> {
    vec![2, 2]
}

/// One step, every rank a thread, against `sequential_step`: losses, gradients and weights; with
/// rendezvous sends and with eager ones.
fn agrees(schedule: Schedule) {
    agrees_over(
        &schedule,
        CpuPeers::connect(schedule.ranks, Duration::from_secs(20)),
    );
    agrees_over(
        &schedule,
        CpuPeers::eager(schedule.ranks, Duration::from_secs(20)),
    );
}

fn agrees_over(schedule: &Schedule, peers: Vec<CpuPeer>) {
    let name = format!(
        "{} P{} V{} M{}",
        schedule.name, schedule.ranks, schedule.chunks, schedule.microbatches
    );
    let (xs, ts) = batch(schedule.microbatches);
    let mut reference = cells(schedule.stages());
    let seq = sequential_step(&mut reference, xs, &ts, &mse).unwrap();
    let (report, states) = run_ranks(schedule, PostOrder::Sender, peers, &same_shape);
    let report = report.unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(report.losses.len(), seq.losses.len(), "{name}");
    for (k, (a, b)) in report.losses.iter().zip(&seq.losses).enumerate() {
        assert!((a - b).abs() <= 1e-5, "{name}: loss {k}: {a} vs {b}");
    }
    assert_eq!(states.len(), schedule.stages(), "{name}");
    for ((s, g, w), r) in states.iter().zip(&reference) {
        let close = (g.0 - r.grads.0).abs() <= 1e-5 && (g.1 - r.grads.1).abs() <= 1e-5;
        assert!(close, "{name}: stage {s} gradients {g:?} vs {:?}", r.grads);
        assert!(
            (w - r.w).abs() <= 1e-5,
            "{name}: stage {s} weight {w} vs {}",
            r.w
        );
    }
    let spans: usize = report.timeline.spans.iter().map(Vec::len).sum();
    let items: usize = schedule
        .actions
        .iter()
        .flatten()
        .filter(|i| i.is_compute())
        .count();
    assert_eq!(spans, items, "{name}: one span per compute item");
}

#[test]
fn every_family_over_rank_threads_matches_the_sequential_step() {
    for_every_family_shape(agrees);
}

/// The peer error that stopped a step.
fn peer_error(report: Result<StepReport, RuntimeError>) -> TransportError {
    match report {
        Err(RuntimeError::Peer { error, .. }) => *error,
        Err(e) => panic!("expected a transfer error, got: {e}"),
        Ok(_) => panic!("expected a transfer error, the step succeeded"),
    }
}

/// `schedule` with each receive right before its consumer and each send right after its producer:
/// receives in the order the receiver consumes (lowering puts them in the sender's order).
fn consumer_order(schedule: &Schedule) -> Schedule {
    use pipefill_host::schedule::lower::{receives_before, sends_after};
    use pipefill_host::schedule::Item;
    let actions = schedule
        .actions
        .iter()
        .map(|list| {
            let mut out = Vec::new();
            for item in list {
                out.extend(receives_before(schedule, item).into_iter().map(Item::Comm));
                out.push(*item);
                out.extend(sends_after(schedule, item).into_iter().map(Item::Comm));
            }
            out
        })
        .collect();
    Schedule {
        actions,
        ..schedule.clone()
    }
}

/// Posting the receives where the receiver consumes them: for `zbv` rank 0 sends to rank 1 in
/// another order than rank 1 consumes. With small (eager) messages the twin hands a receive the
/// wrong edge's message and names both; with rendezvous the two ranks deadlock (in every case
/// tried) and the deadline reports it. Posted in the sender's order, both run.
#[test]
fn receives_posted_in_the_receivers_order_swap_messages_for_zbv() {
    for (p, m) in [(2, 4), (3, 7), (4, 9)] {
        let zbv = families::generate("zbv", &Params::new(p, m)).unwrap();
        let schedule = consumer_order(&zbv);
        // Eager: the swap shows as soon as the wrong message comes (the long deadline only
        // keeps a loaded machine from turning it into a timeout). Rendezvous: the deadlock is
        // the deadline running out.
        let (long, short) = (Duration::from_secs(20), Duration::from_millis(500));
        let eager = CpuPeers::eager(p, long);
        let (report, _) = run_ranks(&schedule, PostOrder::Receiver, eager, &same_shape);
        let error = peer_error(report);
        let TransportError::Mismatch { expected, got, .. } = &error else {
            panic!("zbv P{p} M{m}: expected a mismatch, got: {error}");
        };
        assert_ne!(expected, got);
        let text = error.to_string();
        assert!(
            text.contains(&expected.send().to_string()) && text.contains(&got.send().to_string()),
            "{text}"
        );
        let strict = CpuPeers::connect(p, short);
        let (report, _) = run_ranks(&schedule, PostOrder::Receiver, strict, &same_shape);
        let error = peer_error(report);
        // A deadlock every time here; which of the two a wrong order meets first could depend
        // on timing, and either is caught.
        assert!(
            matches!(
                error,
                TransportError::Deadline { .. } | TransportError::Mismatch { .. }
            ),
            "zbv P{p} M{m}: expected a deadlock, got: {error}"
        );
        for peers in [CpuPeers::connect(p, long), CpuPeers::eager(p, long)] {
            let (ok, _) = run_ranks(&schedule, PostOrder::Sender, peers, &same_shape);
            ok.unwrap_or_else(|e| panic!("zbv P{p} M{m} in the sender's order: {e}"));
        }
    }
}

#[test]
fn a_rank_that_never_comes_is_reported_by_the_deadline_not_hung() {
    let schedule = families::generate("1f1b", &Params::new(2, 3)).unwrap();
    let mut peers = CpuPeers::connect(2, Duration::from_millis(300));
    let _absent = peers.pop();
    let mut peer = peers.pop().unwrap();
    let start = std::time::Instant::now();
    let start_cells = cells(2);
    let (outcome, _) = run_rank(
        &schedule,
        0,
        &mut peer,
        PostOrder::Sender,
        |s| start_cells[s].clone(),
        &same_shape,
        |c: &Cell| (c.grads, c.w),
    )
    .unwrap();
    assert!(start.elapsed() < Duration::from_secs(10));
    match outcome.result {
        Err(RankStop::Failed(RuntimeError::Peer { rank: 0, error })) => match *error {
            TransportError::Deadline { sending, peer, .. } => assert!(sending && peer == 1),
            other => panic!("expected a send deadline, got {other:?}"),
        },
        other => panic!("expected a send deadline, got {other:?}"),
    }
}

#[test]
fn a_receive_posted_with_another_shape_is_refused() {
    let schedule = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let wrong = |_: Edge| vec![4, 1];
    let peers = CpuPeers::connect(2, Duration::from_secs(5));
    let (report, _) = run_ranks(&schedule, PostOrder::Sender, peers, &wrong);
    match peer_error(report) {
        TransportError::Shape { expected, got, .. } => {
            assert_eq!((expected, got), (vec![4, 1], vec![2, 2]))
        }
        other => panic!("expected a shape error, got: {other}"),
    }
}

/// A cell whose forward fails on one stage.
struct Failing {
    cell: Cell,
    fail: bool,
}

impl Stage for Failing {
    type Stash = <Cell as Stage>::Stash;

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        if self.fail {
            return Err(StageError::new("boom"));
        }
        self.cell.forward(x)
    }
    fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
        self.cell.backward_input(st, dy)
    }
    fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
        self.cell.backward_weight(st)
    }
    fn held_bytes(&self, st: &Self::Stash) -> usize {
        self.cell.held_bytes(st)
    }
    fn zero_grad(&mut self) {
        self.cell.zero_grad()
    }
    fn optimizer_step(&mut self) -> Result<(), StageError> {
        self.cell.optimizer_step()
    }
}

#[test]
fn a_failing_layer_fails_its_rank_and_stops_the_others_without_an_optimizer_step() {
    let schedule = families::generate("zbv", &Params::new(2, 4)).unwrap();
    let peers = CpuPeers::connect(2, Duration::from_secs(20));
    let start = cells(schedule.stages());
    let outcomes: Vec<RankResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = peers
            .into_iter()
            .enumerate()
            .map(|(rank, mut peer)| {
                let (schedule, start) = (&schedule, &start);
                scope.spawn(move || {
                    let make = |s: usize| Failing {
                        cell: start[s].clone(),
                        fail: s == 2,
                    };
                    run_rank(
                        schedule,
                        rank,
                        &mut peer,
                        PostOrder::Sender,
                        make,
                        &same_shape,
                        |f: &Failing| (f.cell.grads, f.cell.w),
                    )
                    .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Stage 2 of zbv P2 is on rank 1.
    let failed = &outcomes[1].0.result;
    match failed {
        Err(RankStop::Failed(RuntimeError::Device { message })) => {
            assert!(message.contains("boom"), "{message}")
        }
        other => panic!("rank 1: expected its layer's failure, got {other:?}"),
    }
    assert!(
        matches!(outcomes[0].0.result, Err(RankStop::Aborted)),
        "rank 0: {:?}",
        outcomes[0].0.result
    );
    for (s, _, w) in outcomes.iter().flat_map(|o| &o.1) {
        assert_eq!(*w, start[*s].w, "stage {s} stepped its optimizer");
    }
}
