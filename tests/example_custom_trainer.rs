//! `examples/custom_trainer.rs`, checked: its evaluation step (three stage types, nonlinear math)
//! gives the forward losses of a training step on the same weights, bit for bit, on every schedule
//! family it runs, holds one stash per rank at a time, and leaves the weights alone; the step leaves
//! the gradients to the trainer, and the trainer's global-norm clipping changes the update exactly as
//! an `f64` reference says.

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

#[test]
fn the_examples_evaluation_matches_its_training_forward_bit_for_bit() {
    let rows = 4;
    for (family, ranks) in [
        ("zbv", 2),
        ("1f1b", 3),
        ("interleaved-1f1b", 2),
        ("dualpipev", 2),
    ] {
        let schedule = families::generate(family, &Params::new(ranks, 8)).unwrap();
        let mut ex = Executor::new(schedule.clone(), example::model(schedule.stages())).unwrap();
        for i in 0..3 {
            let (x, t) = example::data(i, 8, rows).unwrap();
            example::step(&mut ex, x, &t, MAX_NORM).unwrap();
        }
        let eval = example::evaluate(&mut ex, 3, rows).unwrap();
        let again = example::evaluate(&mut ex, 3, rows).unwrap();
        assert_eq!(
            eval.losses, again.losses,
            "{family}: evaluation moved the weights"
        );
        let (x, t) = example::data(3, 8, rows).unwrap();
        let (train, _, _) = example::step(&mut ex, x, &t, MAX_NORM).unwrap();
        let bits = |v: &[f32]| v.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&eval.losses), bits(&train.losses), "{family}");
        for (r, (e, t)) in eval
            .peak_held_bytes
            .iter()
            .zip(&train.peak_held_bytes)
            .enumerate()
        {
            assert!(
                e <= t,
                "{family} rank {r}: evaluation held {e} bytes, training {t}"
            );
        }
        // The first rank holds several microbatches in training, one in evaluation.
        let (e, t) = (eval.peak_held_bytes[0], train.peak_held_bytes[0]);
        assert!(
            e < t,
            "{family}: evaluation held {e} bytes on rank 0, training {t}"
        );
    }
}
