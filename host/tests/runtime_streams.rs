//! The stream program on the CPU reference device: every family's step, enqueued from one thread
//! onto one worker per stream that meet only at events, gives the losses and gradients of
//! `sequential_step` (within 1e-5); the static check catches a wait moved before its record and a
//! missing wait; a layer failure is reported, naming its stream.

use pipefill_host::runtime::streams::{
    check, CpuStreams, OnStreams, Pending, StreamError, StreamExecutor, StreamOp, StreamProgram,
};
use pipefill_host::runtime::{sequential_step, RuntimeError, Stage, StageError, Tensor};
use pipefill_host::schedule::families;
use pipefill_host::schedule::{Params, Schedule};

mod streams_support;

use streams_support::{cells, for_every_family_shape, mse, Cell};

fn batch(m: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    let x = |k: usize| Tensor::new(vec![2, 2], vec![0.1 * k as f32, -0.3, 0.7, 0.2]).unwrap();
    let t = |k: usize| Tensor::new(vec![2, 2], vec![0.4, 0.05 * k as f32, -0.2, 0.3]).unwrap();
    ((0..m).map(x).collect(), (0..m).map(t).collect())
}

/// One step on the stream device against `sequential_step`: losses and gradients within 1e-5.
fn agrees(schedule: Schedule) {
    let name = format!(
        "{} P{} V{} M{}",
        schedule.name, schedule.ranks, schedule.chunks, schedule.microbatches
    );
    let m = schedule.microbatches;
    let (xs, ts) = batch(m);
    let mut reference = cells(schedule.stages());
    let seq = sequential_step(&mut reference, xs.clone(), &ts, &mse).unwrap();

    let device = CpuStreams::new();
    let stages: Vec<OnStreams<Cell>> = cells(schedule.stages())
        .into_iter()
        .map(|c| device.stage(c))
        .collect();
    let loss = device.loss(mse);
    let mut ex = StreamExecutor::new(schedule, stages, device).unwrap();
    let inputs = xs.into_iter().map(Pending::ready).collect();
    let targets: Vec<_> = ts.into_iter().map(Pending::ready).collect();
    let report = ex
        .step(inputs, &targets, &loss)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    ex.optimizer_step()
        .unwrap_or_else(|e| panic!("{name}: {e}"));

    for (k, (a, b)) in report.losses.iter().zip(&seq.losses).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5,
            "{name}: loss of microbatch {k}: {a} vs {b}"
        );
    }
    for (s, (st, r)) in ex.stages().iter().zip(&reference).enumerate() {
        let g = st.inner().grads;
        let close = (g.0 - r.grads.0).abs() <= 1e-5 && (g.1 - r.grads.1).abs() <= 1e-5;
        assert!(close, "{name}: stage {s} gradients {g:?} vs {:?}", r.grads);
        let w = st.inner().w;
        assert!(
            (w - r.w).abs() <= 1e-5,
            "{name}: stage {s} weight after the step"
        );
    }
    let spans: usize = report.timeline.spans.iter().map(Vec::len).sum();
    assert!(spans > 0, "{name}: the device marks gave no timeline");
}

#[test]
fn every_family_matches_the_sequential_step_for_p_up_to_4_and_v_up_to_3() {
    for_every_family_shape(agrees);
}

#[test]
fn overlapping_families_get_a_second_stream_per_rank() {
    let schedule = families::generate("dualpipev", &Params::new(4, 8)).unwrap();
    let program = StreamProgram::build(&schedule).unwrap();
    assert!(
        program.streams.iter().any(|s| s.lane == 1),
        "{:?}",
        program.streams
    );
    check(&program, &schedule).unwrap();
}

#[test]
fn a_wait_moved_before_its_record_is_refused() {
    let schedule = families::generate("zb-h1", &Params::new(3, 4)).unwrap();
    let mut program = StreamProgram::build(&schedule).unwrap();
    let at = program
        .ops
        .iter()
        .rposition(|o| matches!(o, StreamOp::Wait { .. }))
        .unwrap();
    let StreamOp::Wait { event, .. } = program.ops[at] else {
        unreachable!()
    };
    let record = program
        .ops
        .iter()
        .position(|o| matches!(o, StreamOp::Record { event: e, .. } if *e == event))
        .unwrap();
    let wait = program.ops.remove(at);
    program.ops.insert(record, wait);
    let err = check(&program, &schedule).unwrap_err();
    assert!(
        matches!(err, StreamError::WaitBeforeRecord { event: e, .. } if e == event),
        "{err}"
    );
}

#[test]
fn a_missing_wait_leaves_a_consumer_unordered() {
    let schedule = families::generate("1f1b", &Params::new(2, 3)).unwrap();
    let mut program = StreamProgram::build(&schedule).unwrap();
    let at = program
        .ops
        .iter()
        .position(|o| matches!(o, StreamOp::Wait { .. }))
        .unwrap();
    program.ops.remove(at);
    let err = check(&program, &schedule).unwrap_err();
    assert!(matches!(err, StreamError::Unordered { .. }), "{err}");
}

#[test]
fn a_rank_out_of_its_list_order_is_refused() {
    let schedule = families::generate("gpipe", &Params::new(2, 2)).unwrap();
    let mut program = StreamProgram::build(&schedule).unwrap();
    let runs: Vec<usize> = (0..program.ops.len())
        .filter(|&i| matches!(program.ops[i], StreamOp::Run { .. }))
        .take(2)
        .collect();
    program.ops.swap(runs[0], runs[1]);
    assert!(matches!(
        check(&program, &schedule),
        Err(StreamError::Order { .. } | StreamError::BeforeProducer { .. })
    ));
}

/// A stage whose forward fails on one microbatch: the step reports it and applies no update.
struct Fails;

impl Stage for Fails {
    type Stash = ();
    fn forward(&mut self, x: Tensor) -> Result<(Tensor, ()), StageError> {
        if x.data()[0] > 0.5 {
            return Err(StageError::new("this input is refused"));
        }
        Ok((x, ()))
    }
    fn backward_input(&mut self, _: &mut (), g: Tensor) -> Result<Tensor, StageError> {
        Ok(g)
    }
    fn backward_weight(&mut self, _: ()) -> Result<(), StageError> {
        Ok(())
    }
    fn held_bytes(&self, _: &()) -> usize {
        0
    }
    fn zero_grad(&mut self) {}
    fn optimizer_step(&mut self) -> Result<(), StageError> {
        Err(StageError::new("must not run after a failed step"))
    }
}

#[test]
fn a_failing_layer_fails_the_step_with_its_message() {
    let schedule = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let device = CpuStreams::new();
    let stages = vec![device.stage(Fails), device.stage(Fails)];
    let loss = device.loss(mse);
    let mut ex = StreamExecutor::new(schedule, stages, device).unwrap();
    let x = |v: f32| Pending::ready(Tensor::new(vec![1, 1], vec![v]).unwrap());
    let err = ex
        .step(vec![x(0.0), x(0.9)], &[x(0.0), x(0.0)], &loss)
        .unwrap_err();
    match err {
        RuntimeError::Device { message } => {
            assert!(message.contains("this input is refused"), "{message}")
        }
        other => panic!("expected a device error, got {other}"),
    }
}
