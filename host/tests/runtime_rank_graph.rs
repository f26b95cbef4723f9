//! Whole-step capture for ranks in separate processes (`RankStreams::capture` / `replay`, what
//! `train --backend cuda --launcher mpi --graph` runs in each process), on the CPU twin: each rank
//! on its own `CpuStreams`, the ranks' sends and receives over `CpuPeers` (kept by each link's
//! thread during the capture and run again on each replay), with and without `D = 2` replicas
//! reducing their gradients. Replayed steps give the plain steps' losses and weights bit for bit,
//! for 1f1b, zb-h1 and zbv; a link whose join was never waited on is refused at replay, as CUDA
//! refuses a capture with a stream not joined back.

use std::sync::Arc;
use std::time::Duration;

use pipefill_host::runtime::streams::{
    CpuPeer, CpuPeers, CpuStreams, Device, OnStreams, Pending, PostOrder, RankBatch, RankStreams,
    StreamId,
};
use pipefill_host::runtime::{assemble, AllReduce, RankOutcome, Reducer, Tensor, Transport};
use pipefill_host::schedule::deps::Edge;
use pipefill_host::schedule::{families, Params, Schedule};

mod streams_support;

use streams_support::{cells, mse, Cell};

type Runner = RankStreams<CpuStreams, OnStreams<Cell>>;

/// `D` replicas of `P` ranks: one runner and one link per (replica, rank), replica-major.
struct Job {
    runners: Vec<(usize, usize, Runner)>,
    peers: Vec<CpuPeer>,
}

fn job(schedule: &Schedule, replicas: usize) -> Job {
    let p = schedule.ranks;
    let ar = (replicas > 1).then(|| Arc::new(AllReduce::new(replicas, schedule.stages())));
    let mut runners = Vec::new();
    for d in 0..replicas {
        for rank in 0..p {
            let device = CpuStreams::new();
            let mine = (cells(schedule.stages()).into_iter().enumerate())
                .filter(|(s, _)| schedule.rank_of(*s) == rank)
                .map(|(s, c)| (s, device.stage(c)))
                .collect();
            let mut r =
                RankStreams::new(schedule.clone(), rank, mine, device, PostOrder::Sender).unwrap();
            r.set_reducer(ar.as_ref().map(|ar| {
                let ar = Arc::clone(ar);
                Arc::new(move |s, g: Vec<&mut [f32]>| ar.reduce(d, s, g)) as Arc<Reducer>
            }));
            runners.push((d, rank, r));
        }
    }
    let peers = (0..replicas)
        .flat_map(|_| CpuPeers::connect(p, Duration::from_secs(20)))
        .collect();
    Job { runners, peers }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    Capture,
    Replay,
}

fn same_shape(_: Edge) -> Vec<usize> {
    vec![2, 2]
}

/// Replica `d`'s microbatches at `step`: different every step and replica.
fn batch(m: usize, step: usize, d: usize) -> (Vec<Pending<Tensor>>, Vec<Pending<Tensor>>) {
    let s = 0.25 * step as f32 - 0.5 * d as f32;
    let x = |k: usize| Tensor::new(vec![2, 2], vec![0.1 * k as f32 + s, -0.3, 0.7, 0.2 * s]);
    let t = |k: usize| Tensor::new(vec![2, 2], vec![0.4 - s, 0.05 * k as f32, -0.2, s]);
    let ready = |v: Tensor| Pending::ready(v);
    (
        (0..m).map(|k| ready(x(k).unwrap())).collect(),
        (0..m).map(|k| ready(t(k).unwrap())).collect(),
    )
}

/// One step of every rank of `job` in `mode`; every replica's losses as bits.
fn run(schedule: &Schedule, job: &mut Job, step: usize, mode: Mode) -> Vec<u32> {
    let outcomes: Vec<RankOutcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = (job.runners.iter_mut().zip(job.peers.iter_mut()))
            .map(|((d, rank, runner), peer)| {
                let (d, rank) = (*d, *rank);
                scope.spawn(move || {
                    let loss = runner.device().loss(mse);
                    let (xs, ts) = batch(schedule.microbatches, step, d);
                    let first = rank == schedule.rank_of(0);
                    let inputs = if first { xs } else { Vec::new() };
                    let out = match mode {
                        Mode::Plain => {
                            let batch = RankBatch {
                                inputs,
                                targets: &ts,
                                loss: &loss,
                                shape: &same_shape,
                            };
                            runner.step(batch, peer)
                        }
                        Mode::Capture => runner.capture((inputs, ts), &loss, &same_shape, peer),
                        Mode::Replay => runner.replay(inputs, ts, peer),
                    };
                    if let Err(e) = &out.result {
                        panic!("step {step} ({mode:?}), replica {d} rank {rank}: {e:?}");
                    }
                    runner.optimizer_step().unwrap();
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let p = schedule.ranks;
    outcomes
        .chunks(p)
        .flat_map(|replica| assemble(schedule, replica.to_vec(), 0.0).unwrap().losses)
        .map(f32::to_bits)
        .collect()
}

/// Every stage's `(w, b)` of every replica, by (replica, stage).
fn weights(job: &Job) -> Vec<(usize, usize, u32, u32)> {
    let mut w: Vec<_> = (job.runners.iter())
        .flat_map(|(d, _, r)| r.stages().iter().map(move |(s, st)| (*d, *s, st.inner())))
        .map(|(d, s, c)| (d, s, c.w.to_bits(), c.b.to_bits()))
        .collect();
    w.sort_unstable();
    w
}

#[test]
fn replayed_rank_steps_over_cpu_peers_equal_plain_steps_with_and_without_replicas() {
    for (family, v) in [("1f1b", 1), ("zb-h1", 1), ("zbv", 2)] {
        let schedule = families::generate(family, &Params::new(2, 4).with_chunks(v)).unwrap();
        for replicas in [1, 2] {
            let name = format!("{family}, D = {replicas}");
            let (mut plain, mut graph) = (job(&schedule, replicas), job(&schedule, replicas));
            for step in 0..5 {
                let want = run(&schedule, &mut plain, step, Mode::Plain);
                let mode = match step {
                    0 => Mode::Plain,
                    1 => Mode::Capture,
                    _ => Mode::Replay,
                };
                let got = run(&schedule, &mut graph, step, mode);
                assert_eq!(got, want, "{name}: step {step} ({mode:?})");
                assert_eq!(got.len(), replicas * schedule.microbatches, "{name}");
            }
            assert!(graph.runners.iter().all(|(_, _, r)| r.is_captured()));
            assert_eq!(weights(&graph), weights(&plain), "{name}: weights");
            // The replays ran the captured transfers: the links moved data on every step.
            let sent = graph.peers[0].sent_bytes();
            assert_eq!(sent, plain.peers[0].sent_bytes(), "{name}: bytes sent");
        }
    }
}

#[test]
fn a_link_never_joined_back_is_refused_at_replay() {
    for joined in [false, true] {
        let mut device = CpuStreams::new();
        device
            .make_streams(&[StreamId { rank: 0, lane: 0 }])
            .unwrap();
        let mut peer = CpuPeers::connect(1, Duration::from_secs(5)).remove(0);
        device.begin_capture().unwrap();
        let fork = device.record(0).unwrap();
        peer.begin_capture(fork).unwrap();
        let join = peer.end_capture().unwrap();
        if joined {
            device.wait(0, &join).unwrap();
        }
        device.end_capture().unwrap();
        device.replay().unwrap();
        let replayed = peer.replay();
        device.synchronize().unwrap();
        match (joined, replayed) {
            (true, r) => r.unwrap(),
            (false, Err(e)) => {
                let e = e.to_string();
                assert!(
                    e.contains("CAPTURE_UNJOINED") && e.contains("rank 0"),
                    "{e}"
                );
            }
            (false, Ok(())) => panic!("an unjoined link replayed"),
        }
    }
}
