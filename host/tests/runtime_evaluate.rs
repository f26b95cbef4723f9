//! The evaluation step ([`Executor::evaluate`]): the schedule's forwards only, in its ranks' order,
//! with no stash kept, no gradient and no optimizer step; its losses are the training step's, bit
//! for bit, on the same weights.

mod runtime_support;

use pipefill_host::runtime::{Executor, RuntimeError, Tensor};
use pipefill_host::schedule::{families, Item, Op, Params, Schedule};
use runtime_support::{mse, Scale};

fn executor(schedule: &Schedule) -> Executor<Scale> {
    let stages = (0..schedule.stages())
        .map(|s| Scale::new(1.0 - 0.07 * s as f32, 0.01))
        .collect();
    Executor::new(schedule.clone(), stages).unwrap()
}

/// Microbatch `k`: a 1x2 input (8 bytes, the stash of every forward) and its target.
fn batch(m: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    let x = (0..m)
        .map(|k| Tensor::new(vec![1, 2], vec![0.3 + k as f32, 1.0 / (k + 3) as f32]).unwrap())
        .collect();
    let t = (0..m)
        .map(|k| Tensor::new(vec![1, 2], vec![0.5 * k as f32, 0.25]).unwrap())
        .collect();
    (x, t)
}

fn schedules() -> Vec<Schedule> {
    let p = |ranks, m| Params::new(ranks, m);
    vec![
        families::generate("1f1b", &p(3, 5)).unwrap(),
        families::generate("zbv", &p(2, 4)).unwrap(),
        families::generate("interleaved-1f1b", &p(2, 4).with_chunks(2)).unwrap(),
        families::generate("zb-h1", &p(3, 6)).unwrap(),
        families::generate("dualpipev", &p(2, 6)).unwrap(),
    ]
}

#[test]
fn evaluation_losses_are_the_training_steps_forward_losses_bit_for_bit() {
    for schedule in schedules() {
        let name = &schedule.name;
        let m = schedule.microbatches;
        let (x, t) = batch(m);
        let mut ex = executor(&schedule);
        // Train once so the weights are not the initial ones, then evaluate and train again on
        // the same weights.
        ex.step(x.clone(), &t, &mse).unwrap();
        let weights: Vec<f32> = ex.stages().iter().map(|s| s.w).collect();
        let eval = ex.evaluate(x.clone(), &t, &mse).unwrap();
        let after: Vec<f32> = ex.stages().iter().map(|s| s.w).collect();
        assert_eq!(after, weights, "{name}: evaluation changed the weights");
        let train = ex.step(x.clone(), &t, &mse).unwrap();
        let bits = |v: &[f32]| v.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&eval.losses), bits(&train.losses), "{name}");
        assert_eq!(eval.loss.to_bits(), train.loss.to_bits(), "{name}");
        // Each output is the input through every stage in order.
        for (k, y) in eval.outputs.iter().enumerate() {
            let mut want = x[k].clone();
            weights.iter().for_each(|w| want.scale(*w));
            assert_eq!(y, &want, "{name}: output of microbatch {k}");
        }
        // Forwards only, each once, on the ranks that own them.
        let spans: Vec<_> = eval.timeline.spans.iter().flatten().collect();
        let forwards = spans
            .iter()
            .filter(|s| matches!(s.item(), Item::One(a) if a.op == Op::F))
            .count();
        assert_eq!(forwards, schedule.stages() * m, "{name}");
        assert!(
            spans
                .iter()
                .all(|s| s.item().actions().all(|a| a.op == Op::F)),
            "{name}: a backward ran"
        );
    }
}

#[test]
fn an_evaluation_holds_one_stash_at_a_time_and_leaves_gradients_and_steps_alone() {
    for schedule in schedules() {
        let name = &schedule.name;
        let (x, t) = batch(schedule.microbatches);
        let mut ex = executor(&schedule);
        ex.stages_mut().iter_mut().for_each(|s| s.grad = [42.0]);
        let eval = ex.evaluate(x.clone(), &t, &mse).unwrap();
        // Every forward stashes its 1x2 f32 input: 8 bytes, dropped as soon as it returns.
        assert_eq!(eval.peak_held_bytes, vec![8; schedule.ranks], "{name}");
        assert!(
            ex.stages().iter().all(|s| s.grad == [42.0] && s.steps == 0),
            "{name}: zero_grad or optimizer_step ran"
        );
        // Training holds several microbatches on the first rank: the measure tells them apart.
        let train = ex.step(x, &t, &mse).unwrap();
        assert!(
            train.peak_held_bytes[0] > 8,
            "{name}: {:?}",
            train.peak_held_bytes
        );
    }
}

#[test]
fn a_failing_forward_stops_the_evaluation_naming_rank_and_action() {
    let schedule = families::generate("1f1b", &Params::new(3, 4)).unwrap();
    let mut ex = executor(&schedule);
    let (mut x, t) = batch(4);
    x[2] = Tensor::new(vec![1, 2], vec![-9.0, 0.0]).unwrap();
    let w1 = ex.stages()[1].w;
    ex.stages_mut()[1] = Scale::new(w1, 0.01).failing_on(-9.0 * ex.stages()[0].w);
    let e = ex.evaluate(x, &t, &mse).unwrap_err();
    match e {
        RuntimeError::ActionFailed { rank, action, .. } => {
            assert_eq!((rank, action.to_string()), (1, "1F2".to_string()));
        }
        other => panic!("{other}"),
    }
    assert!(ex.stages().iter().all(|s| s.steps == 0));
}

#[test]
fn a_wrong_batch_size_is_refused() {
    let schedule = families::generate("zbv", &Params::new(2, 4)).unwrap();
    let mut ex = executor(&schedule);
    let (x, t) = batch(3);
    assert!(matches!(
        ex.evaluate(x, &t, &mse),
        Err(RuntimeError::BatchCount { .. })
    ));
}
