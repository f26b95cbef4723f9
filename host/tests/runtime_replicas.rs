//! In-process data parallelism: replicas end a step with the same weights, equal to one replica's
//! step on the union of their microbatches; a failing replica stops the others instead of leaving
//! them waiting in the reduction.

mod runtime_support;

use pipefill_host::runtime::{Executor, Replicas, Tensor};
use pipefill_host::schedule::{families, Params};
use runtime_support::{mse, Scale};

fn executor(m: usize) -> Executor<Scale> {
    let schedule = families::generate("zb-h1", &Params::new(2, m)).unwrap();
    let stages = (0..2)
        .map(|s| Scale::new(1.0 + 0.5 * s as f32, 0.5).failing_on(13.0))
        .collect();
    Executor::new(schedule, stages).unwrap()
}

fn t(v: f32) -> Tensor {
    Tensor::new(vec![1, 1], vec![v]).unwrap()
}

#[test]
fn replicas_average_to_one_replica_on_all_microbatches() {
    let xs: Vec<f32> = vec![0.5, -1.0, 2.0, 0.25];
    let ts: Vec<f32> = vec![1.0, 0.0, 1.5, -0.5];
    // One replica, four microbatches.
    let mut one = executor(4);
    one.step(
        xs.iter().map(|&v| t(v)).collect(),
        &ts.iter().map(|&v| t(v)).collect::<Vec<_>>(),
        &mse,
    )
    .unwrap();
    one.optimizer_step().unwrap();
    // Two replicas, two microbatches each.
    let mut two = Replicas::new(vec![executor(2), executor(2)]).unwrap();
    let inputs = vec![vec![t(xs[0]), t(xs[1])], vec![t(xs[2]), t(xs[3])]];
    let targets = vec![vec![t(ts[0]), t(ts[1])], vec![t(ts[2]), t(ts[3])]];
    let reports = two.step(inputs, &targets, &mse).unwrap();
    assert_eq!(reports.len(), 2);
    // The step ends with every replica holding the mean gradient, equal to one replica's.
    for s in 0..2 {
        let g1 = one.stages()[s].grad[0];
        for ex in two.executors() {
            let g = ex.stages()[s].grad[0];
            assert!((g - g1).abs() < 1e-6, "stage {s}: gradient {g} vs {g1}");
        }
    }
    two.optimizer_step().unwrap();
    for s in 0..2 {
        let w1 = one.stages()[s].w;
        for ex in two.executors() {
            let w = ex.stages()[s].w;
            assert!((w - w1).abs() < 1e-6, "stage {s}: {w} vs {w1}");
        }
    }
    assert_ne!(one.stages()[0].w, 1.0, "the step must move the weights");
}

#[test]
fn a_failing_replica_stops_the_step_without_a_hang() {
    let mut two = Replicas::new(vec![executor(2), executor(2)]).unwrap();
    let inputs = vec![vec![t(1.0), t(1.0)], vec![t(13.0), t(1.0)]];
    let targets = vec![vec![t(0.0), t(0.0)], vec![t(0.0), t(0.0)]];
    let err = two.step(inputs, &targets, &mse).unwrap_err().to_string();
    assert!(err.contains("unlucky input"), "{err}");
    assert!(
        two.optimizer_step().is_err(),
        "a failed step's gradients are refused"
    );
    // The replicas were left untouched and a new step works.
    let inputs = vec![vec![t(1.0), t(1.0)], vec![t(2.0), t(1.0)]];
    two.step(inputs, &targets, &mse).unwrap();
    two.optimizer_step().unwrap();
}

#[test]
fn the_reduction_runs_at_the_schedules_reduce_grad() {
    use pipefill_host::runtime::StepEvent;
    use pipefill_host::schedule::format::{from_csv, to_csv};
    use pipefill_host::schedule::lower::lower;
    use std::sync::{Arc, Mutex};
    // Rank 0 holds stages 0 and 2; stage 2's gradients are final before stage 0's last backward.
    let plain = families::generate("interleaved-1f1b", &Params::new(2, 2).with_chunks(2)).unwrap();
    let low = to_csv(&lower(&plain).unwrap());
    let row0 = low.lines().next().unwrap().to_string();
    // Stage 2's reduction moved to the end of rank 0's list, behind stage 0's.
    let moved: Vec<&str> = row0
        .split(',')
        .filter(|c| !c.starts_with("2REDUCE_GRAD") && !c.starts_with("2WAIT_REDUCE_GRAD"))
        .collect();
    let moved = moved.join(",") + ",2REDUCE_GRAD,2WAIT_REDUCE_GRAD";
    assert_ne!(moved, row0);
    let late = from_csv(&low.replacen(&row0, &moved, 1), "late").unwrap();
    let order = |schedule| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let stages = (0..4)
            .map(|s| Scale::new(1.0 + 0.1 * s as f32, 0.5))
            .collect();
        let mut ex = Executor::new(schedule, stages).unwrap();
        let l = log.clone();
        ex.set_reducer(Some(Arc::new(move |stage, _| {
            l.lock().unwrap().push(format!("reduce {stage}"));
            Ok(())
        })));
        let l = log.clone();
        let hook = move |e: StepEvent| {
            if let StepEvent::ActionDone {
                rank: 0, action, ..
            } = e
            {
                l.lock().unwrap().push(action.to_string());
            }
        };
        ex.step_with(vec![t(0.5), t(-1.0)], &[t(1.0), t(0.0)], &mse, hook)
            .unwrap();
        let log = log.lock().unwrap().clone();
        let at = |x: &str| log.iter().position(|e| e == x).unwrap();
        at("reduce 2") < at("0B1")
    };
    assert!(order(plain.clone()), "without REDUCE_GRAD: right after 2B1");
    assert!(
        order(lower(&plain).unwrap()),
        "lowered: right after 2B1 too"
    );
    assert!(!order(late), "at the schedule's REDUCE_GRAD, after 0B1");
}
