//! The stream path has the threaded path's step hook and data-parallel `Reducer`:
//! - a hook on the `StreamExecutor` over `CpuStreams` is told of every action of the schedule once
//!   per step, in each rank's list order, and of each stage's gradients once, after its last
//!   gradient action; a panicking hook fails the step;
//! - `D = 2` stream replicas reducing through the runtime's `AllReduce` (each replica on its own
//!   thread) end with the losses and weights of the threaded `Replicas`, bit for bit;
//! - PP x DP over the CPU twin of NCCL (`RankStreams` over `CpuPeers`, one thread per rank of
//!   each replica, the rank's gradients reduced over the replicas) gives the threaded replicas'
//!   losses and weights, and each rank's hook sees its actions once, in its list's order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pipefill_host::runtime::streams::{
    CpuPeers, CpuStreams, OnStreams, Pending, PostOrder, RankBatch, RankStreams, StreamExecutor,
};
use pipefill_host::runtime::{
    assemble, last_gradient_actions, AllReduce, Executor, Reducer, Replicas, RuntimeError,
    StepEvent, Tensor,
};
use pipefill_host::schedule::deps::Edge;
use pipefill_host::schedule::{families, Action, Params, Schedule};

mod streams_support;

use streams_support::{cells, mse, Cell};

fn batch(m: usize, shift: f32) -> (Vec<Tensor>, Vec<Tensor>) {
    let x = |k: usize| Tensor::new(vec![2, 2], vec![0.1 * k as f32 + shift, -0.3, 0.7, 0.2]);
    let t = |k: usize| Tensor::new(vec![2, 2], vec![0.4, 0.05 * k as f32, -0.2, shift]);
    let xs = (0..m).map(|k| x(k).unwrap()).collect();
    let ts = (0..m).map(|k| t(k).unwrap()).collect();
    (xs, ts)
}

fn ready(v: Vec<Tensor>) -> Vec<Pending<Tensor>> {
    v.into_iter().map(Pending::ready).collect()
}

fn schedules() -> Vec<Schedule> {
    let two = |v| Params::new(2, 4).with_chunks(v);
    vec![
        families::generate("1f1b", &two(1)).unwrap(),
        families::generate("zb-h1", &two(1)).unwrap(),
        families::generate("interleaved-1f1b", &two(2)).unwrap(),
        families::generate("zbv", &two(2)).unwrap(),
    ]
}

fn stream_executor(schedule: &Schedule) -> StreamExecutor<CpuStreams, OnStreams<Cell>> {
    let device = CpuStreams::new();
    let stages = cells(schedule.stages());
    let stages = stages.into_iter().map(|c| device.stage(c)).collect();
    StreamExecutor::new(schedule.clone(), stages, device).unwrap()
}

#[test]
fn a_hook_on_the_stream_executor_sees_every_action_once_per_step_in_rank_order() {
    for schedule in schedules() {
        let name = &schedule.name;
        let mut ex = stream_executor(&schedule);
        let loss = ex.device().loss(mse);
        let last = last_gradient_actions(&schedule);
        for step in 0..2 {
            let (xs, ts) = batch(schedule.microbatches, step as f32);
            let (report, events) = ex.step_with_events(ready(xs), &ready(ts), &loss).unwrap();
            ex.optimizer_step().unwrap();
            assert_eq!(events.len(), schedule.ranks, "{name}");
            for (rank, told) in events.iter().enumerate() {
                let want: Vec<Action> = schedule.actions[rank]
                    .iter()
                    .flat_map(|item| item.actions())
                    .collect();
                let done: Vec<Action> = told
                    .iter()
                    .filter_map(|e| match *e {
                        StepEvent::ActionDone { action, .. } => Some(action),
                        _ => None,
                    })
                    .collect();
                assert_eq!(done, want, "{name}, step {step}, rank {rank}");
                // Each stage's gradients are ready once, right after its last gradient action.
                for (i, e) in told.iter().enumerate() {
                    if let StepEvent::GradientsReady { stage, at, .. } = *e {
                        let StepEvent::ActionDone { action, end, .. } = told[i - 1] else {
                            panic!("{name}: gradients of stage {stage} ready after no action");
                        };
                        assert_eq!(Some(action), last[stage], "{name}, stage {stage}");
                        assert_eq!(at, end);
                    }
                }
                let ready = told
                    .iter()
                    .filter(|e| matches!(e, StepEvent::GradientsReady { .. }))
                    .count();
                let held = (0..schedule.stages())
                    .filter(|&s| schedule.rank_of(s) == rank)
                    .count();
                assert_eq!(ready, held, "{name}, rank {rank}");
                // The times are the timeline's: every action inside the step.
                for e in told {
                    if let StepEvent::ActionDone { start, end, .. } = *e {
                        assert!(0.0 <= start && start <= end && end <= report.seconds);
                    }
                }
            }
        }
    }
}

#[test]
fn a_panicking_hook_fails_the_stream_step() {
    let schedule = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let mut ex = stream_executor(&schedule);
    let loss = ex.device().loss(mse);
    let (xs, ts) = batch(2, 0.0);
    let r = ex.step_with(ready(xs), &ready(ts), &loss, |e| {
        if let StepEvent::GradientsReady { stage: 1, .. } = e {
            panic!("hook down");
        }
    });
    match r {
        Err(RuntimeError::HookPanicked { message, .. }) => assert!(message.contains("hook down")),
        other => panic!("expected HookPanicked, got {other:?}"),
    }
    assert_eq!(ex.optimizer_step(), Err(RuntimeError::NoGradients));
}

/// Replica `d`'s reducer over `ar`.
fn reducer(ar: &Arc<AllReduce>, d: usize) -> Arc<Reducer> {
    let ar = Arc::clone(ar);
    Arc::new(move |stage, grads| ar.reduce(d, stage, grads))
}

/// Each stage's `(w, b)`.
type Weights = Vec<(f32, f32)>;

/// `steps` steps of `D = 2` threaded replicas (`Replicas`): each step's per-replica losses (as
/// bits) and the weights after.
fn threaded(schedule: &Schedule, steps: usize) -> (Vec<Vec<u32>>, Weights) {
    let executors = (0..2)
        .map(|_| Executor::new(schedule.clone(), cells(schedule.stages())).unwrap())
        .collect();
    let mut replicas = Replicas::new(executors).unwrap();
    let mut losses = Vec::new();
    for step in 0..steps {
        let (x, t): (Vec<_>, Vec<_>) = (0..2)
            .map(|d| batch(schedule.microbatches, shift(step, d)))
            .unzip();
        let reports = replicas.step(x, &t, &mse).unwrap();
        replicas.optimizer_step().unwrap();
        losses.push(reports.iter().flat_map(|r| bits(&r.losses)).collect());
    }
    let w = replicas.executors()[0]
        .stages()
        .iter()
        .map(|c| (c.w, c.b))
        .collect();
    (losses, w)
}

fn weights(c: &Cell) -> (f32, f32) {
    (c.w, c.b)
}

fn shift(step: usize, replica: usize) -> f32 {
    0.25 * step as f32 - 0.5 * replica as f32
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|l| l.to_bits()).collect()
}

#[test]
fn stream_replicas_reduce_through_the_reducer_as_the_threaded_replicas() {
    for schedule in schedules() {
        let name = &schedule.name;
        let steps = 3;
        let (want, want_w) = threaded(&schedule, steps);
        let ar = Arc::new(AllReduce::new(2, schedule.stages()));
        let mut replicas: Vec<_> = (0..2).map(|_| stream_executor(&schedule)).collect();
        for (d, ex) in replicas.iter_mut().enumerate() {
            ex.set_reducer(Some(reducer(&ar, d)));
        }
        for (step, want) in want.iter().enumerate() {
            // Each replica on a thread of its own: the reduction waits for both.
            let losses: Vec<Vec<u32>> = std::thread::scope(|scope| {
                let handles: Vec<_> = replicas
                    .iter_mut()
                    .enumerate()
                    .map(|(d, ex)| {
                        scope.spawn(move || {
                            let loss = ex.device().loss(mse);
                            let (xs, ts) = batch(schedule.microbatches, shift(step, d));
                            let r = ex.step(ready(xs), &ready(ts), &loss).unwrap();
                            ex.optimizer_step().unwrap();
                            bits(&r.losses)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(&losses.concat(), want, "{name}, step {step}");
        }
        for ex in &replicas {
            let w: Weights = ex.stages().iter().map(|s| weights(&s.inner())).collect();
            assert_eq!(w, want_w, "{name}: the replicas' weights");
        }
        // Without the reduction the replicas drift apart: the comparison above can fail.
        let mut alone = stream_executor(&schedule);
        let loss = alone.device().loss(mse);
        let (xs, ts) = batch(schedule.microbatches, shift(0, 1));
        alone.step(ready(xs), &ready(ts), &loss).unwrap();
        alone.optimizer_step().unwrap();
        let w: Weights = alone.stages().iter().map(|s| weights(&s.inner())).collect();
        assert_ne!(w, want_w, "{name}");
    }
}

fn same_shape(_: Edge) -> Vec<usize> {
    vec![2, 2]
}

#[test]
fn pp_by_dp_over_cpu_peers_trains_as_the_threaded_replicas() {
    for schedule in schedules() {
        let name = &schedule.name;
        let (p, steps) = (schedule.ranks, 3);
        let schedule = &schedule;
        let (want, want_w) = threaded(schedule, steps);
        let ar = Arc::new(AllReduce::new(2, schedule.stages()));
        // One runner per (replica, rank), each with its own device, its rank's stages and its
        // replica's reducer.
        let mut runners: Vec<(usize, usize, RankStreams<CpuStreams, OnStreams<Cell>>)> = Vec::new();
        for d in 0..2 {
            for rank in 0..p {
                let device = CpuStreams::new();
                let mine = cells(schedule.stages())
                    .into_iter()
                    .enumerate()
                    .filter(|(s, _)| schedule.rank_of(*s) == rank)
                    .map(|(s, c)| (s, device.stage(c)))
                    .collect();
                let mut r =
                    RankStreams::new(schedule.clone(), rank, mine, device, PostOrder::Sender)
                        .unwrap();
                r.set_reducer(Some(reducer(&ar, d)));
                runners.push((d, rank, r));
            }
        }
        for (step, want) in want.iter().enumerate() {
            let mut peers: Vec<_> = (0..2)
                .flat_map(|_| CpuPeers::connect(p, Duration::from_secs(20)))
                .collect();
            let outcomes = std::thread::scope(|scope| {
                let handles: Vec<_> = runners
                    .iter_mut()
                    .zip(peers.iter_mut())
                    .map(|((d, rank, runner), peer)| {
                        let (d, rank) = (*d, *rank);
                        scope.spawn(move || {
                            let loss = runner.device().loss(mse);
                            let (xs, ts) = batch(schedule.microbatches, shift(step, d));
                            let first = rank == schedule.rank_of(0);
                            let inputs = if first { ready(xs) } else { Vec::new() };
                            let targets = ready(ts);
                            let batch = RankBatch {
                                inputs,
                                targets: &targets,
                                loss: &loss,
                                shape: &same_shape,
                            };
                            // The rank's hook: each of its actions once, in its list's order.
                            let told = Mutex::new(Vec::new());
                            let out = runner.step_with(batch, peer, |e| {
                                if let StepEvent::ActionDone { action, .. } = e {
                                    told.lock().unwrap().push(action);
                                }
                            });
                            runner.optimizer_step().unwrap();
                            let want: Vec<Action> = schedule.actions[rank]
                                .iter()
                                .flat_map(|item| item.actions())
                                .collect();
                            assert_eq!(told.into_inner().unwrap(), want, "rank {rank}");
                            out
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            });
            let mut losses = Vec::new();
            for replica in outcomes.chunks(p) {
                let report = assemble(schedule, replica.to_vec(), 0.0).unwrap();
                losses.extend(bits(&report.losses));
            }
            assert_eq!(&losses, want, "{name}, step {step}");
        }
        for d in 0..2 {
            let mut w: Vec<(usize, (f32, f32))> = runners
                .iter()
                .filter(|(r, _, _)| *r == d)
                .flat_map(|(_, _, runner)| runner.stages())
                .map(|(s, st)| (*s, weights(&st.inner())))
                .collect();
            w.sort_by_key(|(s, _)| *s);
            let w: Weights = w.into_iter().map(|(_, w)| w).collect();
            assert_eq!(w, want_w, "{name}: replica {d}'s weights");
        }
    }
}
