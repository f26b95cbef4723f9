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
    // Two replicas, two microbatches each.
    let mut two = Replicas::new(vec![executor(2), executor(2)]).unwrap();
    let inputs = vec![vec![t(xs[0]), t(xs[1])], vec![t(xs[2]), t(xs[3])]];
    let targets = vec![vec![t(ts[0]), t(ts[1])], vec![t(ts[2]), t(ts[3])]];
    let reports = two.step(inputs, &targets, &mse).unwrap();
    assert_eq!(reports.len(), 2);
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
    // The replicas were left untouched and a new step works.
    let inputs = vec![vec![t(1.0), t(1.0)], vec![t(2.0), t(1.0)]];
    two.step(inputs, &targets, &mse).unwrap();
}
