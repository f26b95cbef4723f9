//! The evaluation step on the stream path ([`StreamExecutor::evaluate`] over `CpuStreams`, one
//! device and one device per rank): for every family's small shape, after a training step, its
//! losses and last-stage outputs equal the threaded [`Executor::evaluate`]'s bit for bit on the
//! same weights, it runs forwards only, leaves the weights and a step's pending gradients alone,
//! holds at most one stash per rank, and a batch of the wrong size is refused.

use pipefill_host::runtime::streams::{CpuStreams, OnStreams, Pending, StreamExecutor};
use pipefill_host::runtime::{Executor, RuntimeError, Tensor};
use pipefill_host::schedule::{Item, Op, Schedule};

mod streams_support;

use pipefill_host::schedule::{families, Params};
use streams_support::{cells, for_every_family_shape, mse, Cell};

fn batch(m: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    let x = |k: usize| Tensor::new(vec![2, 2], vec![0.1 * k as f32 - 0.2, -0.3, 0.7, 0.2]);
    let t = |k: usize| Tensor::new(vec![2, 2], vec![0.4, 0.05 * k as f32, -0.2, 0.3]);
    (
        (0..m).map(|k| x(k).unwrap()).collect(),
        (0..m).map(|k| t(k).unwrap()).collect(),
    )
}

fn ready(v: &[Tensor]) -> Vec<Pending<Tensor>> {
    v.iter().cloned().map(Pending::ready).collect()
}

/// The inputs on stage 0's device and the targets on the last stage's.
fn placed(
    ex: &Streams,
    x: &[Tensor],
    t: &[Tensor],
) -> (Vec<Pending<Tensor>>, Vec<Pending<Tensor>>) {
    let first = ex.stage_device(0).unwrap();
    let last = ex.stage_device(ex.stages().len() - 1).unwrap();
    let on = |d: usize, v: &[Tensor]| v.iter().map(|y| Pending::ready_on(d, y.clone())).collect();
    (on(first, x), on(last, t))
}

type Streams = StreamExecutor<CpuStreams, OnStreams<Cell>>;

fn stream_executor(schedule: &Schedule, per_rank: bool) -> Streams {
    let device = if per_rank {
        CpuStreams::with_devices((0..schedule.ranks).collect())
    } else {
        CpuStreams::new()
    };
    let stages = cells(schedule.stages())
        .into_iter()
        .map(|c| device.stage(c))
        .collect();
    StreamExecutor::new(schedule.clone(), stages, device).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn weights(stages: &[OnStreams<Cell>]) -> Vec<(u32, u32)> {
    stages
        .iter()
        .map(|s| {
            let c = s.inner();
            (c.w.to_bits(), c.b.to_bits())
        })
        .collect()
}

#[test]
fn stream_evaluation_equals_the_threaded_evaluation_bit_for_bit() {
    for_every_family_shape(|schedule| {
        for per_rank in [false, true] {
            let name = format!("{} (per-rank devices: {per_rank})", schedule.name);
            let m = schedule.microbatches;
            let (x, t) = batch(m);
            let mut threads = Executor::new(schedule.clone(), cells(schedule.stages())).unwrap();
            let mut streams = stream_executor(&schedule, per_rank);
            let loss = streams.device().loss(mse);
            threads.step(x.clone(), &t, &mse).unwrap();
            threads.optimizer_step().unwrap();
            let (px, pt) = placed(&streams, &x, &t);
            streams.step(px, &pt, &loss).unwrap();
            streams.optimizer_step().unwrap();

            let want = threads.evaluate(x.clone(), &t, &mse).unwrap();
            let before = weights(streams.stages());
            let (px, pt) = placed(&streams, &x, &t);
            let got = streams.evaluate(px, &pt, &loss).unwrap();
            assert_eq!(weights(streams.stages()), before, "{name}: weights changed");
            assert_eq!(bits(&got.losses), bits(&want.losses), "{name}: losses");
            assert_eq!(got.loss.to_bits(), want.loss.to_bits(), "{name}: mean loss");
            assert_eq!(got.outputs.len(), m, "{name}");
            for (k, (y, w)) in got.outputs.into_iter().zip(&want.outputs).enumerate() {
                let y = y.into_inner().expect("an evaluated output");
                assert_eq!(bits(y.data()), bits(w.data()), "{name}: output {k}");
            }
            let spans: Vec<_> = got.timeline.spans.iter().flatten().collect();
            let forwards = spans
                .iter()
                .filter(|s| s.item().actions().all(|a| a.op == Op::F))
                .count();
            assert_eq!(forwards, schedule.stages() * m, "{name}: forwards timed");
            assert!(
                spans.iter().all(|s| match s.item() {
                    Item::One(a) => a.op == Op::F,
                    _ => false,
                }),
                "{name}: a backward or overlapped pair ran"
            );
            // One 2x2 stash (input and output, 32 bytes) at a time on a rank that ran a forward.
            assert!(
                got.peak_held_bytes.iter().all(|&b| b <= 32),
                "{name}: {:?}",
                got.peak_held_bytes
            );
        }
    });
}

#[test]
fn a_stream_evaluation_between_step_and_optimizer_step_leaves_the_gradients_ready() {
    let schedule = families::generate("zbv", &Params::new(2, 4)).unwrap();
    let (x, t) = batch(schedule.microbatches);
    let mut plain = stream_executor(&schedule, false);
    let mut evaluated = stream_executor(&schedule, false);
    let loss = plain.device().loss(mse);
    plain.step(ready(&x), &ready(&t), &loss).unwrap();
    plain.optimizer_step().unwrap();
    evaluated.step(ready(&x), &ready(&t), &loss).unwrap();
    evaluated.evaluate(ready(&x), &ready(&t), &loss).unwrap();
    evaluated.optimizer_step().unwrap();
    assert_eq!(weights(evaluated.stages()), weights(plain.stages()));
}

#[test]
fn a_stream_evaluation_of_the_wrong_batch_size_is_refused() {
    let schedule = families::generate("1f1b", &Params::new(2, 3)).unwrap();
    let (x, t) = batch(schedule.microbatches + 1);
    let mut ex = stream_executor(&schedule, false);
    let loss = ex.device().loss(mse);
    let Err(err) = ex.evaluate(ready(&x), &ready(&t), &loss) else {
        panic!("a batch of M + 1 microbatches was evaluated");
    };
    assert!(matches!(err, RuntimeError::BatchCount { .. }), "{err}");
}
