//! `examples/custom_trainer.rs`, checked: the step leaves the gradients to the trainer, and the
//! trainer's global-norm clipping changes the update exactly as an `f64` reference says.

#[allow(dead_code)]
#[path = "../examples/custom_trainer.rs"]
mod example;

use example::{clip_global_norm, data, model, step, weights, MAX_NORM};
use pipefill_host::runtime::{BoxedStage, Executor, Stage};
use pipefill_host::schedule::{families, Params};

/// The learning rate of the example's SGD.
const LR: f64 = 0.5;

fn executor() -> Executor<BoxedStage> {
    let schedule = families::generate("zbv", &Params::new(2, 4)).unwrap();
    let stages = model(schedule.stages());
    Executor::new(schedule, stages).unwrap()
}

/// Every gradient of the model, stage by stage, as `f64`.
fn gradients(ex: &mut Executor<BoxedStage>) -> Vec<f64> {
    let mut all = Vec::new();
    for stage in ex.stages_mut() {
        for g in stage.gradients() {
            all.extend(g.iter().map(|&v| f64::from(v)));
        }
    }
    all
}

#[test]
fn clipping_scales_the_update_as_the_f64_reference_says() {
    let (x, t) = data(0, 4, 4).unwrap();
    let mut ex = executor();
    let before = weights(ex.stages());
    ex.step(x.clone(), &t, &example::loss).unwrap();
    // The step applied nothing: the gradients wait for the trainer.
    assert_eq!(weights(ex.stages()), before);
    let g = gradients(&mut ex);
    assert_eq!(g.len(), before.len(), "one gradient per weight");
    let norm = g.iter().map(|v| v * v).sum::<f64>().sqrt();
    // Clip to half the norm: every gradient scales by exactly 1/2 in the reference.
    let max = (norm / 2.0) as f32;
    let reported = clip_global_norm(ex.stages_mut(), max);
    assert_eq!(reported, norm as f32, "the norm before clipping");
    let clipped = gradients(&mut ex);
    let clipped_norm = clipped.iter().map(|v| v * v).sum::<f64>().sqrt();
    assert!(
        (clipped_norm - f64::from(max)).abs() <= 1e-6 * f64::from(max),
        "clipped norm {clipped_norm} vs {max}"
    );
    ex.optimizer_step().unwrap();
    let after = weights(ex.stages());
    let scale = f64::from(max) / norm;
    let mut moved = 0;
    for (i, ((w0, w1), g)) in before.iter().zip(&after).zip(&g).enumerate() {
        let want = f64::from(*w0) - LR * g * scale;
        let ulp = f64::from(f32::EPSILON) * want.abs().max(1.0);
        assert!(
            (f64::from(*w1) - want).abs() <= 2.0 * ulp,
            "weight {i}: {w1} vs the reference {want}"
        );
        moved += usize::from(w1 != w0);
    }
    assert!(moved > 0, "the clipped step must move the weights");
}

#[test]
fn clipping_changes_the_result_only_above_the_limit() {
    let (x, t) = data(3, 4, 4).unwrap();
    let run = |max_norm: f32| {
        let mut ex = executor();
        let (_, _, norm) = step(&mut ex, x.clone(), &t, max_norm).unwrap();
        (weights(ex.stages()), norm)
    };
    let (free, norm) = run(f32::INFINITY);
    let (same, _) = run(norm * 2.0);
    assert_eq!(free, same, "a norm below the limit is left alone");
    let (clipped, _) = run(norm / 4.0);
    assert_ne!(free, clipped, "a norm above the limit is clipped");
    assert!(
        norm > MAX_NORM,
        "the example's limit clips its first steps ({norm})"
    );
}
