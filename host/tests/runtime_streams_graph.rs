//! Whole-step capture and replay (`StreamExecutor::capture` / `replay`) on the CPU reference device:
//! for every family, a plain step, a captured step and replayed steps give the same losses and
//! weights as plain steps on the same batches; replay refuses to run before a capture, capture
//! refuses to run twice, and a device without capture support says so. With one device per rank
//! (`CpuStreams::with_devices`, the twin of `--devices per-rank --graph`) replayed steps give the
//! plain steps' losses bit for bit; the twin refuses a capture that leaves a stream unjoined or
//! gives work to a stream that never joined, as CUDA does.

use pipefill_host::runtime::streams::{
    CpuStreams, Device, OnStreams, Pending, StreamExecutor, StreamId,
};
use pipefill_host::runtime::{RuntimeError, Tensor};
use pipefill_host::schedule::families::{self, FAMILIES};
use pipefill_host::schedule::{Params, Schedule};

mod streams_support;

use streams_support::{cells, mse, Cell};

type Batch = (Vec<Pending<Tensor>>, Vec<Pending<Tensor>>);

/// Step `step`'s batch: different values every step, so a replay that kept old inputs would differ.
fn batch(m: usize, step: usize) -> Batch {
    let s = step as f32;
    let x = |k: usize| {
        let v = vec![0.1 * k as f32 - 0.2 * s, -0.3 + 0.1 * s, 0.7, 0.2 * s];
        Pending::ready(Tensor::new(vec![2, 2], v).unwrap())
    };
    let t = |k: usize| {
        let v = vec![0.4 - 0.1 * s, 0.05 * k as f32, -0.2 * s, 0.3];
        Pending::ready(Tensor::new(vec![2, 2], v).unwrap())
    };
    ((0..m).map(x).collect(), (0..m).map(t).collect())
}

type Ex = StreamExecutor<CpuStreams, OnStreams<Cell>>;

fn executor(schedule: &Schedule) -> Ex {
    let device = CpuStreams::new();
    let stages = cells(schedule.stages())
        .into_iter()
        .map(|c| device.stage(c))
        .collect();
    StreamExecutor::new(schedule.clone(), stages, device).unwrap()
}

const STEPS: usize = 4;

/// Plain steps against: one plain step, a capture, then replays, on the same batches.
fn agrees(schedule: &Schedule) {
    let name = format!(
        "{} P{} V{} M{}",
        schedule.name, schedule.ranks, schedule.chunks, schedule.microbatches
    );
    let m = schedule.microbatches;
    let mut plain = executor(schedule);
    let mut graph = executor(schedule);
    let (plain_loss, graph_loss) = (plain.device().loss(mse), graph.device().loss(mse));
    for step in 0..STEPS {
        let (x, t) = batch(m, step);
        let want = plain.step(x, &t, &plain_loss).unwrap();
        plain.optimizer_step().unwrap();
        let (x, t) = batch(m, step);
        let got = match step {
            0 => graph.step(x, &t, &graph_loss),
            1 => graph.capture(x, t, &graph_loss),
            _ => graph.replay(x, t),
        }
        .unwrap_or_else(|e| panic!("{name}: step {step}: {e}"));
        graph
            .optimizer_step()
            .unwrap_or_else(|e| panic!("{name}: step {step}: {e}"));
        for (k, (a, b)) in got.losses.iter().zip(&want.losses).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5,
                "{name}: step {step} microbatch {k}: loss {a} vs {b}"
            );
        }
        assert_eq!(got.losses.len(), m, "{name}: step {step}");
    }
    assert!(graph.is_captured(), "{name}");
    for (s, (g, p)) in graph.stages().iter().zip(plain.stages()).enumerate() {
        let (g, p) = (g.inner(), p.inner());
        let close = (g.w - p.w).abs() <= 1e-5 && (g.b - p.b).abs() <= 1e-5;
        assert!(
            close,
            "{name}: stage {s}: ({}, {}) vs ({}, {})",
            g.w, g.b, p.w, p.b
        );
    }
}

#[test]
fn replayed_steps_equal_plain_steps_for_every_family() {
    let mut ran = 0;
    for family in FAMILIES {
        let mut count = 0;
        let shapes = [(1, 1), (2, 1), (2, 2), (3, 1), (4, 1), (4, 2)];
        for (p, v, m) in shapes
            .into_iter()
            .flat_map(|(p, v)| [(p, v, p), (p, v, 2 * p + 1)])
        {
            let params = Params::new(p, m).with_chunks(v);
            let Ok(schedule) = families::generate(family.name, &params) else {
                continue;
            };
            agrees(&schedule);
            count += 1;
        }
        assert!(count >= 1, "{}: no shape generated", family.name);
        ran += 1;
    }
    assert_eq!(ran, FAMILIES.len());
}

#[test]
fn replay_before_a_capture_is_refused() {
    let schedule = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let mut ex = executor(&schedule);
    let (x, t) = batch(2, 0);
    let err = ex.replay(x, t).unwrap_err();
    assert!(matches!(err, RuntimeError::Device { .. }), "{err}");
    assert!(err.to_string().contains("capture"), "{err}");
    assert!(!ex.is_captured());
}

#[test]
fn a_second_capture_is_refused() {
    let schedule = families::generate("zb-h1", &Params::new(2, 3)).unwrap();
    let mut ex = executor(&schedule);
    let loss = ex.device().loss(mse);
    let (x, t) = batch(3, 0);
    ex.step(x, &t, &loss).unwrap();
    let (x, t) = batch(3, 1);
    ex.capture(x, t, &loss).unwrap();
    let (x, t) = batch(3, 2);
    let err = ex.capture(x, t, &loss).unwrap_err();
    assert!(err.to_string().contains("already captured"), "{err}");
    // The first capture still replays.
    let (x, t) = batch(3, 3);
    assert_eq!(ex.replay(x, t).unwrap().losses.len(), 3);
}

#[test]
fn a_wrong_batch_size_is_refused_before_replaying() {
    let schedule = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let mut ex = executor(&schedule);
    let loss = ex.device().loss(mse);
    let (x, t) = batch(2, 0);
    ex.capture(x, t, &loss).unwrap();
    let (x, t) = batch(3, 1);
    let err = ex.replay(x, t).unwrap_err();
    assert!(matches!(err, RuntimeError::BatchCount { .. }), "{err}");
}

/// `schedule` on one twin device per rank: the batch's targets on the last stage's device.
fn on_devices(schedule: &Schedule) -> Ex {
    let device = CpuStreams::with_devices((0..schedule.ranks).collect());
    let stages = cells(schedule.stages())
        .into_iter()
        .map(|c| device.stage(c))
        .collect();
    StreamExecutor::new(schedule.clone(), stages, device).unwrap()
}

fn placed(ex: &Ex, (x, t): Batch) -> Batch {
    let last = ex.stage_device(ex.stages().len() - 1).unwrap_or(0);
    let on = |d: usize, v: Vec<Pending<Tensor>>| {
        v.into_iter()
            .map(|p| Pending::ready_on(d, p.into_inner().unwrap()))
            .collect()
    };
    (on(0, x), on(last, t))
}

#[test]
fn replayed_steps_across_devices_equal_plain_steps_bit_for_bit() {
    for (family, p, v) in [
        ("1f1b", 3, 1),
        ("zb-h1", 2, 1),
        ("zbv", 2, 2),
        ("dualpipev", 2, 2),
    ] {
        let params = Params::new(p, 2 * p + 1).with_chunks(v);
        let schedule = families::generate(family, &params).unwrap();
        let m = schedule.microbatches;
        let (mut plain, mut graph) = (on_devices(&schedule), on_devices(&schedule));
        let (pl, gl) = (plain.device().loss(mse), graph.device().loss(mse));
        for step in 0..STEPS {
            let (x, t) = placed(&plain, batch(m, step));
            let want = plain.step(x, &t, &pl).unwrap();
            plain.optimizer_step().unwrap();
            let (x, t) = placed(&graph, batch(m, step));
            let got = match step {
                0 => graph.step(x, &t, &gl),
                1 => graph.capture(x, t, &gl),
                _ => graph.replay(x, t),
            }
            .unwrap_or_else(|e| panic!("{family}: step {step}: {e}"));
            graph.optimizer_step().unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got.losses),
                bits(&want.losses),
                "{family}: step {step}"
            );
        }
        assert!(
            graph.device().copied_bytes() > 0,
            "{family}: nothing crossed devices"
        );
    }
}

/// A device with two streams, capturing.
fn capturing() -> CpuStreams {
    let mut d = CpuStreams::new();
    let ids = [StreamId { rank: 0, lane: 0 }, StreamId { rank: 1, lane: 0 }];
    d.make_streams(&ids).unwrap();
    d.begin_capture().unwrap();
    d
}

#[test]
fn the_twin_refuses_a_stream_left_unjoined_or_never_forked_as_cuda_does() {
    // Forked and joined back: captured and replayed.
    let mut d = capturing();
    let fork = d.record(0).unwrap();
    d.wait(1, &fork).unwrap();
    d.mark(1).unwrap();
    let join = d.record(1).unwrap();
    d.wait(0, &join).unwrap();
    d.end_capture().unwrap();
    d.replay().unwrap();
    d.synchronize().unwrap();
    // Forked, never joined back: the capture fails, named as CUDA names it.
    let mut d = capturing();
    let fork = d.record(0).unwrap();
    d.wait(1, &fork).unwrap();
    d.mark(1).unwrap();
    let e = d.end_capture().unwrap_err().message;
    assert!(
        e.contains("CUDA_ERROR_STREAM_CAPTURE_UNJOINED") && e.contains("stream 1"),
        "{e}"
    );
    assert!(d.replay().is_err(), "a refused capture must not replay");
    // Joined back, then more work after the join: unjoined again.
    let mut d = capturing();
    let fork = d.record(0).unwrap();
    d.wait(1, &fork).unwrap();
    let join = d.record(1).unwrap();
    d.wait(0, &join).unwrap();
    d.mark(1).unwrap();
    assert!(d.end_capture().unwrap_err().message.contains("UNJOINED"));
    // Never forked: its work would not be captured, so it is refused at once.
    let mut d = capturing();
    let e = d
        .mark(1)
        .err()
        .expect("work on a stream never forked")
        .message;
    assert!(e.contains("stream 1") && e.contains("fork"), "{e}");
}
