//! Several devices on the CPU reference device (`CpuStreams::with_devices`), the CPU twin of one GPU
//! per rank: every family's step, with one device per rank and with four ranks on two devices
//! (round robin), gives the losses, gradients and weights of `sequential_step` (within 1e-5); the
//! bytes copied between devices are exactly the lowered schedule's crossings between ranks on
//! different devices (0 when every rank shares one device); a device that does not adopt payloads
//! fails the step with `RuntimeError::WrongDevice`, as does a target on the wrong device; capture
//! and replay copy on every replay.

use pipefill_host::runtime::streams::{
    CpuStreams, Device, DeviceError, EventRole, Pending, StreamExecutor, StreamId, StreamStage,
};
use pipefill_host::runtime::{sequential_step, RuntimeError, Tensor};
use pipefill_host::schedule::families::{self, FAMILIES};
use pipefill_host::schedule::{Params, Schedule};

mod streams_support;

use streams_support::{cells, mse, Cell};

/// Every payload of these tests is a 2 x 2 `f32` tensor.
const PAYLOAD_BYTES: usize = 16;

fn batch(m: usize, step: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    let s = step as f32;
    let x = |k: usize| Tensor::new(vec![2, 2], vec![0.1 * k as f32 - 0.1 * s, -0.3, 0.7, 0.2]);
    let t = |k: usize| Tensor::new(vec![2, 2], vec![0.4, 0.05 * k as f32, -0.2 * s, 0.3]);
    (
        (0..m).map(|k| x(k).unwrap()).collect(),
        (0..m).map(|k| t(k).unwrap()).collect(),
    )
}

/// How ranks map to devices in these tests.
#[derive(Debug, Clone, Copy)]
enum Map {
    /// Every rank on device 0.
    One,
    /// Rank `r` on device `r`.
    PerRank,
    /// Rank `r` on device `r % 2`.
    RoundRobin2,
}

impl Map {
    fn devices(self, ranks: usize) -> Vec<usize> {
        (0..ranks)
            .map(|r| match self {
                Map::One => 0,
                Map::PerRank => r,
                Map::RoundRobin2 => r % 2,
            })
            .collect()
    }
}

/// The bytes one step must copy: each lowered crossing between ranks on different devices.
fn crossing_bytes(ex: &Ex, schedule: &Schedule, devices: &[usize]) -> usize {
    let crossings = ex
        .program()
        .events
        .iter()
        .filter(|e| match e {
            EventRole::Transfer(edge) => {
                let (from, to) = (schedule.rank_of(edge.from), schedule.rank_of(edge.to()));
                devices[from] != devices[to]
            }
            _ => false,
        })
        .count();
    crossings * PAYLOAD_BYTES
}

type Ex = StreamExecutor<CpuStreams, OnStreamsCell>;
type OnStreamsCell = pipefill_host::runtime::streams::OnStreams<Cell>;

fn executor(schedule: &Schedule, devices: Vec<usize>) -> Ex {
    let device = CpuStreams::with_devices(devices);
    let stages = cells(schedule.stages())
        .into_iter()
        .map(|c| device.stage(c))
        .collect();
    StreamExecutor::new(schedule.clone(), stages, device).unwrap()
}

/// A step's inputs on stage 0's device and targets on the last stage's.
fn placed<D: Device, S: StreamStage<D::Stream, D::Payload>>(
    ex: &StreamExecutor<D, S>,
    stages: usize,
    x: Vec<Tensor>,
    t: Vec<Tensor>,
) -> (Vec<Pending<Tensor>>, Vec<Pending<Tensor>>) {
    let (first, last) = (
        ex.stage_device(0).unwrap(),
        ex.stage_device(stages - 1).unwrap(),
    );
    (
        x.into_iter().map(|v| Pending::ready_on(first, v)).collect(),
        t.into_iter().map(|v| Pending::ready_on(last, v)).collect(),
    )
}

/// One step with `map` against `sequential_step`; returns the bytes copied.
fn agrees(schedule: &Schedule, map: Map) {
    let name = format!(
        "{} P{} V{} M{} {map:?}",
        schedule.name, schedule.ranks, schedule.chunks, schedule.microbatches
    );
    let (xs, ts) = batch(schedule.microbatches, 0);
    let mut reference = cells(schedule.stages());
    let seq = sequential_step(&mut reference, xs.clone(), &ts, &mse).unwrap();

    let devices = map.devices(schedule.ranks);
    let mut ex = executor(schedule, devices.clone());
    let loss = ex.device().loss(mse);
    let (inputs, targets) = placed(&ex, schedule.stages(), xs, ts);
    let report = ex
        .step(inputs, &targets, &loss)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    ex.optimizer_step()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    for (k, (a, b)) in report.losses.iter().zip(&seq.losses).enumerate() {
        assert!((a - b).abs() <= 1e-5, "{name}: loss {k}: {a} vs {b}");
    }
    for (s, (st, r)) in ex.stages().iter().zip(&reference).enumerate() {
        let (g, w) = {
            let inner = st.inner();
            (inner.grads, inner.w)
        };
        let close = (g.0 - r.grads.0).abs() <= 1e-5 && (g.1 - r.grads.1).abs() <= 1e-5;
        assert!(close, "{name}: stage {s} gradients {g:?} vs {:?}", r.grads);
        assert!((w - r.w).abs() <= 1e-5, "{name}: stage {s} weight");
    }
    let want = crossing_bytes(&ex, schedule, &devices);
    assert_eq!(ex.device().copied_bytes(), want, "{name}: bytes copied");
    if matches!(map, Map::One) {
        assert_eq!(want, 0, "{name}");
    }
}

#[test]
fn every_family_on_several_devices_matches_the_sequential_step() {
    let mut copied_somewhere = 0;
    for family in FAMILIES {
        let mut count = 0;
        for p in 1..=4 {
            for v in 1..=3 {
                let params = Params::new(p, 2 * p + 1).with_chunks(v);
                let Ok(schedule) = families::generate(family.name, &params) else {
                    continue;
                };
                for map in [Map::PerRank, Map::RoundRobin2, Map::One] {
                    agrees(&schedule, map);
                }
                if p > 1 {
                    copied_somewhere += 1;
                }
                count += 1;
            }
        }
        assert!(count >= 1, "{}: no shape generated", family.name);
    }
    assert!(copied_somewhere > 0);
}

#[test]
fn per_rank_devices_copy_every_crossing_and_one_device_copies_nothing() {
    let schedule = families::generate("1f1b", &Params::new(4, 4)).unwrap();
    // 3 boundaries x 4 microbatches x (activation + gradient).
    let mut ex = executor(&schedule, Map::PerRank.devices(4));
    assert_eq!(
        crossing_bytes(&ex, &schedule, &Map::PerRank.devices(4)),
        24 * 16
    );
    let loss = ex.device().loss(mse);
    let (x, t) = batch(4, 0);
    let (x, t) = placed(&ex, 4, x, t);
    ex.step(x, &t, &loss).unwrap();
    assert_eq!(ex.device().copied_bytes(), 24 * 16);
    // Round robin over two devices: every boundary still joins two devices.
    let rr = Map::RoundRobin2.devices(4);
    assert_eq!(crossing_bytes(&ex, &schedule, &rr), 24 * 16);
    // Ranks 0, 1 on device 0 and 2, 3 on device 1: only the middle boundary copies.
    assert_eq!(crossing_bytes(&ex, &schedule, &[0, 0, 1, 1]), 8 * 16);
}

/// A device that never moves payloads: `adopt` keeps the default (identity).
struct NoAdopt(CpuStreams);

impl Device for NoAdopt {
    type Payload = Pending<Tensor>;
    type Stream = <CpuStreams as Device>::Stream;
    type Event = <CpuStreams as Device>::Event;
    type Mark = <CpuStreams as Device>::Mark;

    fn make_streams(&mut self, streams: &[StreamId]) -> Result<(), DeviceError> {
        self.0.make_streams(streams)
    }
    fn stream(&self, index: usize) -> Option<&Self::Stream> {
        self.0.stream(index)
    }
    fn record(&mut self, stream: usize) -> Result<Self::Event, DeviceError> {
        self.0.record(stream)
    }
    fn wait(&mut self, stream: usize, event: &Self::Event) -> Result<(), DeviceError> {
        self.0.wait(stream, event)
    }
    fn mark(&mut self, stream: usize) -> Result<Self::Mark, DeviceError> {
        self.0.mark(stream)
    }
    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.0.synchronize()
    }
    fn seconds(&self, origin: &Self::Mark, mark: &Self::Mark) -> Result<f64, DeviceError> {
        self.0.seconds(origin, mark)
    }
    fn stream_device(&self, stream: usize) -> usize {
        self.0.stream_device(stream)
    }
    fn payload_device(&self, payload: &Pending<Tensor>) -> Option<usize> {
        self.0.payload_device(payload)
    }
}

#[test]
fn without_adopt_a_crossing_payload_is_refused_on_the_other_device() {
    for family in ["1f1b", "zbv", "interleaved-1f1b"] {
        let params =
            Params::new(2, 4).with_chunks(if family == "interleaved-1f1b" { 2 } else { 1 });
        let params = if family == "zbv" {
            Params::new(2, 4)
        } else {
            params
        };
        let schedule = families::generate(family, &params).unwrap();
        let inner = CpuStreams::with_devices(vec![0, 1]);
        let loss = inner.loss(mse);
        let stages = cells(schedule.stages())
            .into_iter()
            .map(|c| inner.stage(c))
            .collect::<Vec<_>>();
        let mut ex = StreamExecutor::new(schedule.clone(), stages, NoAdopt(inner)).unwrap();
        let (x, t) = batch(4, 0);
        let (x, t) = placed(&ex, schedule.stages(), x, t);
        let err = ex.step(x, &t, &loss).unwrap_err();
        match err {
            RuntimeError::WrongDevice { misplaced, .. } => {
                assert_ne!(
                    misplaced.stream_device, misplaced.payload_device,
                    "{family}"
                );
            }
            other => panic!("{family}: expected WrongDevice, got {other}"),
        }
        // The same schedule on the adopting device runs.
        let mut ok = executor(&schedule, vec![0, 1]);
        let loss = ok.device().loss(mse);
        let (x, t) = batch(4, 0);
        let (x, t) = placed(&ok, schedule.stages(), x, t);
        ok.step(x, &t, &loss).unwrap();
    }
}

#[test]
fn a_target_on_another_device_than_the_last_stage_is_refused() {
    let schedule = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let mut ex = executor(&schedule, vec![0, 1]);
    let loss = ex.device().loss(mse);
    let (x, t) = batch(2, 0);
    let x = x.into_iter().map(Pending::ready).collect();
    let t: Vec<_> = t.into_iter().map(Pending::ready).collect(); // device 0, last stage on 1
    let err = ex.step(x, &t, &loss).unwrap_err();
    assert!(
        matches!(
            &err,
            RuntimeError::WrongDevice { misplaced, .. }
                if misplaced.payload_device == 0 && misplaced.stream_device == 1
        ),
        "{err}"
    );
}

#[test]
fn a_stage_refuses_a_payload_from_another_device() {
    let mut device = CpuStreams::with_devices(vec![0]);
    device
        .make_streams(&[StreamId { rank: 0, lane: 0 }])
        .unwrap();
    let mut stage = device.stage(cells(1).remove(0));
    let x = Tensor::new(vec![2, 2], vec![0.0; 4]).unwrap();
    let on = device.stream(0).unwrap(); // a stream of device 0
    let err = stage.forward(on, Pending::ready_on(1, x)).err().unwrap();
    assert!(err.message().contains("device 1"), "{}", err.message());
}

#[test]
fn a_device_map_that_misses_a_rank_is_refused() {
    let schedule = families::generate("1f1b", &Params::new(3, 3)).unwrap();
    let device = CpuStreams::with_devices(vec![0, 1]);
    let stages = cells(3).into_iter().map(|c| device.stage(c)).collect();
    let err = StreamExecutor::new(schedule, stages, device).err().unwrap();
    assert!(err.to_string().contains("rank 2 has no device"), "{err}");
}

/// Capture and replay on per-rank devices: the copies are part of the captured step, so each
/// replay copies again, and the steps equal plain ones.
#[test]
fn captured_steps_adopt_on_every_replay() {
    for (family, v) in [
        ("1f1b", 1),
        ("zbv", 2),
        ("interleaved-1f1b", 2),
        ("dualpipev", 2),
    ] {
        let params = Params::new(3, 6);
        let params = if family == "interleaved-1f1b" {
            params.with_chunks(v)
        } else {
            params
        };
        let schedule = families::generate(family, &params).unwrap();
        let devices = Map::PerRank.devices(3);
        let mut plain = executor(&schedule, devices.clone());
        let mut graph = executor(&schedule, devices.clone());
        let per_step = crossing_bytes(&graph, &schedule, &devices);
        assert!(per_step > 0, "{family}");
        let (pl, gl) = (plain.device().loss(mse), graph.device().loss(mse));
        let s = schedule.stages();
        for step in 0..4 {
            let (x, t) = batch(6, step);
            let (px, pt) = placed(&plain, s, x.clone(), t.clone());
            let want = plain.step(px, &pt, &pl).unwrap();
            plain.optimizer_step().unwrap();
            let (gx, gt) = placed(&graph, s, x, t);
            let got = match step {
                0 => graph.step(gx, &gt, &gl),
                1 => graph.capture(gx, gt, &gl),
                _ => graph.replay(gx, gt),
            }
            .unwrap_or_else(|e| panic!("{family} step {step}: {e}"));
            graph.optimizer_step().unwrap();
            for (a, b) in got.losses.iter().zip(&want.losses) {
                assert!((a - b).abs() <= 1e-5, "{family} step {step}: {a} vs {b}");
            }
            assert_eq!(
                graph.device().copied_bytes(),
                per_step * (step + 1),
                "{family} step {step}"
            );
        }
        for (g, p) in graph.stages().iter().zip(plain.stages()) {
            assert!((g.inner().w - p.inner().w).abs() <= 1e-5, "{family}");
        }
    }
}
