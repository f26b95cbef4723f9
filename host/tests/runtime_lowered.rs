//! The runtime executes the lowered schedule: the same step whether it is given a compute-only
//! schedule (lowered inside), its lowering, or a file in PyTorch's compute+comms form whose receives
//! sit earlier than their consumers.

use pipefill_host::runtime::{Executor, Stage, StageError, StepReport, Tensor};
use pipefill_host::schedule::format::from_csv;
use pipefill_host::schedule::lower::lower;
use pipefill_host::schedule::{families, Item, Params, Schedule};

/// `y = w * x + b` with learnable `w` and `b` (stash: the input, then the output gradient).
struct Affine {
    w: f32,
    b: f32,
    grads: (f32, f32),
}

impl Stage for Affine {
    type Stash = (Tensor, Option<Tensor>);

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        let mut y = x.clone();
        y.data_mut()
            .iter_mut()
            .for_each(|v| *v = self.w * *v + self.b);
        Ok((y, (x, None)))
    }

    fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
        let mut dx = dy.clone();
        dx.scale(self.w);
        st.1 = Some(dy);
        Ok(dx)
    }

    fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
        let dy = st.1.ok_or_else(|| StageError::new("W before I"))?;
        self.grads.0 +=
            st.0.data()
                .iter()
                .zip(dy.data())
                .map(|(x, d)| x * d)
                .sum::<f32>();
        self.grads.1 += dy.data().iter().sum::<f32>();
        Ok(())
    }

    fn held_bytes(&self, st: &Self::Stash) -> usize {
        st.0.bytes()
    }

    fn zero_grad(&mut self) {
        self.grads = (0.0, 0.0);
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        self.w -= 0.05 * self.grads.0;
        self.b -= 0.05 * self.grads.1;
        Ok(())
    }
}

/// Three steps of `schedule`; the losses and the final weights.
fn train(schedule: Schedule) -> (Vec<f32>, Vec<(f32, f32)>, StepReport) {
    let m = schedule.microbatches;
    let stages = (0..schedule.stages())
        .map(|s| Affine {
            w: 1.0 + 0.1 * s as f32,
            b: 0.0,
            grads: (0.0, 0.0),
        })
        .collect();
    let mut ex = Executor::new(schedule, stages).unwrap();
    let loss = |y: &Tensor, t: &Tensor| -> Result<(f32, Tensor), StageError> {
        let d: Vec<f32> = y.data().iter().zip(t.data()).map(|(a, b)| a - b).collect();
        let v = 0.5 * d.iter().map(|x| x * x).sum::<f32>();
        Ok((v, Tensor::new(y.shape().to_vec(), d)?))
    };
    let x =
        |k: usize| Tensor::new(vec![1, 2], vec![k as f32 * 0.1, 1.0 - k as f32 * 0.05]).unwrap();
    let t = |k: usize| Tensor::new(vec![1, 2], vec![0.5, k as f32 * 0.2]).unwrap();
    let mut losses = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let r = ex
            .step(
                (0..m).map(x).collect(),
                &(0..m).map(t).collect::<Vec<_>>(),
                &loss,
            )
            .unwrap();
        ex.optimizer_step().unwrap();
        losses.push(r.loss);
        last = Some(r);
    }
    let weights = ex.stages().iter().map(|s| (s.w, s.b)).collect();
    (losses, weights, last.unwrap())
}

#[test]
fn compute_only_and_lowered_schedules_train_the_same() {
    let mut checked = 0;
    for name in ["1f1b", "zb-h1", "interleaved-1f1b", "zbv", "dualpipev"] {
        let Ok(s) = families::generate(name, &Params::new(2, 4)) else {
            continue;
        };
        let low = lower(&s).unwrap();
        let (a, wa, ra) = train(s.clone());
        let (b, wb, rb) = train(low.clone());
        assert_eq!(a, b, "{name}: losses");
        assert_eq!(wa, wb, "{name}: weights");
        // A compute-only schedule's timeline has its own items; a lowered one has every item.
        for r in 0..2 {
            assert_eq!(ra.timeline.spans[r].len(), s.actions[r].len(), "{name}");
            assert_eq!(rb.timeline.spans[r].len(), low.actions[r].len(), "{name}");
        }
        assert_eq!(
            ra.timeline.transfers.len(),
            rb.timeline.transfers.len(),
            "{name}"
        );
        checked += 1;
    }
    assert_eq!(checked, 5);
}

#[test]
fn a_pytorch_compute_comms_file_trains_like_its_compute_only_form() {
    let read = |name: &str| {
        let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
        from_csv(&std::fs::read_to_string(path).unwrap(), name).unwrap()
    };
    let comms = read("pytorch_gpipe_p2_m2_compute_comms.csv");
    let only = read("pytorch_gpipe_p2_m2_compute_only.csv");
    let (a, wa, ra) = train(comms.clone());
    let (b, wb, _) = train(only);
    assert_eq!((a, wa), (b, wb));
    assert!(ra.losses.iter().all(|l| l.is_finite()));
    let items: Vec<Item> = ra.timeline.spans[1].iter().map(|s| s.item()).collect();
    assert_eq!(items, comms.actions[1]);
}
