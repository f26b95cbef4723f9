//! Whole-step capture and replay (`StreamExecutor::capture` / `replay`) on the CPU reference device:
//! for every family, a plain step, a captured step and replayed steps give the same losses and
//! weights as plain steps on the same batches; replay refuses to run before a capture, capture
//! refuses to run twice, and a device without capture support says so.

use pipefill_host::runtime::streams::{CpuStreams, OnStreams, Pending, StreamExecutor};
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
