//! The profiler measures through the `Stage` trait: memory fields exactly, every time positive, the
//! calls in the right order. (How fast anything runs is for the benches, not these tests.)

use pipefill_host::profile::{profile_layers, ProfileError, ProfileOptions, ProfiledLayer};
use pipefill_host::runtime::{Stage, StageError, Tensor};

/// `y = x` after `work` rounds of arithmetic per element; the stash keeps the input (and a gradient
/// copy after I), so its sizes are known exactly.
struct Busy {
    work: usize,
    sink: f32,
}

struct Stash {
    x: Tensor,
    dy: Option<Tensor>,
}

impl Busy {
    fn spin(&mut self, t: &Tensor) {
        let mut acc = 0.0f32;
        for r in 0..self.work {
            for v in t.data() {
                acc = acc.mul_add(0.999, v + r as f32);
            }
        }
        self.sink += std::hint::black_box(acc);
    }
}

impl Stage for Busy {
    type Stash = Stash;
    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Stash), StageError> {
        self.spin(&x);
        Ok((x.clone(), Stash { x, dy: None }))
    }
    fn backward_input(&mut self, stash: &mut Stash, dy: Tensor) -> Result<Tensor, StageError> {
        self.spin(&dy);
        // Keep only half of the input after I: frees half the bytes.
        let half = stash.x.len() / 2;
        stash.x = Tensor::new(vec![half], stash.x.data()[..half].to_vec())?;
        stash.dy = Some(dy.clone());
        Ok(dy)
    }
    fn backward_weight(&mut self, stash: Stash) -> Result<(), StageError> {
        self.spin(&stash.x);
        Ok(())
    }
    fn held_bytes(&self, stash: &Stash) -> usize {
        stash.x.bytes() + stash.dy.as_ref().map_or(0, Tensor::bytes)
    }
    fn zero_grad(&mut self) {}
    fn optimizer_step(&mut self) -> Result<(), StageError> {
        Ok(())
    }
}

#[test]
fn memory_fields_are_exact_and_times_are_measured() {
    let mut light = Busy { work: 2, sink: 0.0 };
    let mut heavy = Busy {
        work: 200,
        sink: 0.0,
    };
    let input = Tensor::new(vec![4, 256], vec![0.5; 1024]).unwrap();
    let layers = vec![
        ProfiledLayer {
            name: "light".into(),
            stage: &mut light,
            parameter_bytes: 10.0,
        },
        ProfiledLayer {
            name: "heavy".into(),
            stage: &mut heavy,
            parameter_bytes: 20.0,
        },
    ];
    let opts = ProfileOptions {
        warmup: 1,
        repeats: 5,
        ..ProfileOptions::default()
    };
    let costs = profile_layers(layers, input, opts).unwrap();
    assert_eq!(costs.len(), 2);
    for c in &costs {
        // F stash: the 1024-float input. After I: half of it plus a 1024-float gradient.
        assert_eq!(c.activation_bytes, 4096.0);
        assert_eq!(c.released_at_input, 0.0, "I keeps more than it frees here");
        assert_eq!(c.output_bytes, 4096.0);
        assert!(c.forward > 0.0 && c.backward_input > 0.0 && c.backward_weight > 0.0);
        assert!(c.backward > 0.0, "B is measured on its own");
        c.check("layer").unwrap();
    }
    assert_eq!(
        (costs[0].parameter_bytes, costs[1].parameter_bytes),
        (10.0, 20.0)
    );
}

#[test]
fn zero_repeats_is_refused() {
    let mut l = Busy { work: 1, sink: 0.0 };
    let layers = vec![ProfiledLayer {
        name: "l".into(),
        stage: &mut l,
        parameter_bytes: 0.0,
    }];
    let e = profile_layers(
        layers,
        Tensor::zeros(vec![1, 4]),
        ProfileOptions {
            warmup: 0,
            repeats: 0,
            ..ProfileOptions::default()
        },
    );
    assert!(matches!(e, Err(ProfileError::NoRepeats)));
}

/// Records every call (layer, op, first value of the tensor it got) into a shared log.
struct Recorder {
    id: usize,
    log: std::sync::Arc<std::sync::Mutex<Vec<(usize, char, f32)>>>,
}

impl Stage for Recorder {
    type Stash = ();
    fn forward(&mut self, x: Tensor) -> Result<(Tensor, ()), StageError> {
        self.log.lock().unwrap().push((self.id, 'F', x.data()[0]));
        let y = x.data().iter().map(|v| v + 1.0).collect();
        Ok((Tensor::new(x.shape().to_vec(), y)?, ()))
    }
    fn backward_input(&mut self, _: &mut (), dy: Tensor) -> Result<Tensor, StageError> {
        self.log.lock().unwrap().push((self.id, 'I', dy.data()[0]));
        let dx = dy.data().iter().map(|v| v * 2.0).collect();
        Ok(Tensor::new(dy.shape().to_vec(), dx)?)
    }
    fn backward_weight(&mut self, _: ()) -> Result<(), StageError> {
        self.log.lock().unwrap().push((self.id, 'W', 0.0));
        Ok(())
    }
    fn held_bytes(&self, _: &()) -> usize {
        0
    }
    fn zero_grad(&mut self) {}
    fn optimizer_step(&mut self) -> Result<(), StageError> {
        Ok(())
    }
}

#[test]
fn each_round_is_a_fused_and_a_split_pass_over_the_model() {
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut stages: Vec<Recorder> = (0..3)
        .map(|id| Recorder {
            id,
            log: log.clone(),
        })
        .collect();
    let layers = stages
        .iter_mut()
        .enumerate()
        .map(|(i, stage)| ProfiledLayer {
            name: format!("l{i}"),
            stage,
            parameter_bytes: 0.0,
        })
        .collect();
    let opts = ProfileOptions {
        warmup: 1,
        repeats: 2,
        ..ProfileOptions::default()
    };
    let costs = profile_layers(layers, Tensor::zeros(vec![1, 2]), opts).unwrap();
    assert_eq!(costs.len(), 3);
    // Inputs 0, 1, 2 forward; upstream gradient 1 at the last layer, doubled by each I on the way
    // back. First pass: B per layer (the trait's default B is I then W); second: every I, then every W.
    let round = [
        (0, 'F', 0.0),
        (1, 'F', 1.0),
        (2, 'F', 2.0),
        (2, 'I', 1.0),
        (2, 'W', 0.0),
        (1, 'I', 2.0),
        (1, 'W', 0.0),
        (0, 'I', 4.0),
        (0, 'W', 0.0),
        (0, 'F', 0.0),
        (1, 'F', 1.0),
        (2, 'F', 2.0),
        (2, 'I', 1.0),
        (1, 'I', 2.0),
        (0, 'I', 4.0),
        (2, 'W', 0.0),
        (1, 'W', 0.0),
        (0, 'W', 0.0),
    ];
    let want: Vec<_> = (0..3).flat_map(|_| round).collect();
    assert_eq!(*log.lock().unwrap(), want);
}
