//! `examples/custom_trainer.rs`, checked: its evaluation step (three stage types, nonlinear math)
//! gives the forward losses of a training step on the same weights, bit for bit, on every schedule
//! family it runs, holds one stash per rank at a time, and leaves the weights alone.

#[allow(dead_code)]
#[path = "../examples/custom_trainer.rs"]
mod example;

use pipefill_host::runtime::Executor;
use pipefill_host::schedule::{families, Params};

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
            example::step(&mut ex, x, &t).unwrap();
        }
        let eval = example::evaluate(&mut ex, 3, rows).unwrap();
        let again = example::evaluate(&mut ex, 3, rows).unwrap();
        assert_eq!(
            eval.losses, again.losses,
            "{family}: evaluation moved the weights"
        );
        let (x, t) = example::data(3, 8, rows).unwrap();
        let (train, _) = example::step(&mut ex, x, &t).unwrap();
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
