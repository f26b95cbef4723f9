//! Payloads other than `f32`: a two-stage pipeline whose first stage is an embedding lookup that
//! takes `i64` token ids (a [`Tensor::from_i64`] input, never a float), trained by the threaded
//! runner over `Channels`, is bit-equal to `sequential_step` on the same stages; an id of another
//! type is refused by name.

mod runtime_support;

use pipefill_host::runtime::{
    sequential_step, BoxedStage, Dtype, Executor, Stage, StageError, Tensor,
};
use pipefill_host::schedule::{families, Params};
use runtime_support::{mse, Scale};

const DIM: usize = 3;
const VOCAB: usize = 7;

/// Rows of a `VOCAB x DIM` table, looked up by `i64` token ids; plain SGD.
struct Embed {
    table: Vec<f32>,
    grad: Vec<f32>,
}

impl Embed {
    fn new() -> Self {
        Embed {
            table: (0..VOCAB * DIM).map(|i| 0.1 * i as f32 - 0.7).collect(),
            grad: vec![0.0; VOCAB * DIM],
        }
    }
}

impl Stage for Embed {
    /// The ids; after `I`, the output gradient.
    type Stash = (Vec<usize>, Option<Tensor>);

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        let ids = x
            .as_i64()
            .ok_or_else(|| StageError::new(format!("token ids are i64, got {}", x.dtype())))?;
        let ids: Vec<usize> = ids
            .iter()
            .map(|&t| {
                usize::try_from(t)
                    .ok()
                    .filter(|&i| i < VOCAB)
                    .ok_or_else(|| StageError::new(format!("token {t} out of range")))
            })
            .collect::<Result<_, _>>()?;
        let y = ids
            .iter()
            .flat_map(|&i| self.table[i * DIM..(i + 1) * DIM].iter().copied())
            .collect();
        Ok((Tensor::matrix(ids.len(), DIM, y)?, (ids, None)))
    }

    fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
        st.1 = Some(dy);
        Ok(Tensor::empty()) // token ids have no gradient
    }

    fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
        let dy = st.1.ok_or_else(|| StageError::new("W before I"))?;
        for (r, &i) in st.0.iter().enumerate() {
            for j in 0..DIM {
                self.grad[i * DIM + j] += dy.data()[r * DIM + j];
            }
        }
        Ok(())
    }

    fn held_bytes(&self, st: &Self::Stash) -> usize {
        8 * st.0.len() + st.1.as_ref().map_or(0, Tensor::bytes)
    }

    fn zero_grad(&mut self) {
        self.grad.iter_mut().for_each(|g| *g = 0.0);
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        for (w, g) in self.table.iter_mut().zip(&self.grad) {
            *w -= 0.5 * g;
        }
        Ok(())
    }
}

fn model() -> Vec<BoxedStage> {
    vec![Box::new(Embed::new()), Box::new(Scale::new(1.5, 0.1))]
}

/// Microbatch `k` of step `step`: two `i64` token ids and a target row per id.
fn data(step: usize, m: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    (0..m)
        .map(|k| {
            let ids = vec![((k + step) % VOCAB) as i64, ((3 * k + 1) % VOCAB) as i64];
            let t = (0..2 * DIM).map(|j| 0.05 * (j + k) as f32 - 0.2).collect();
            (
                Tensor::from_i64(vec![2], ids).unwrap(),
                Tensor::matrix(2, DIM, t).unwrap(),
            )
        })
        .unzip()
}

fn table(stages: &[BoxedStage]) -> Vec<f32> {
    stages[0].downcast_ref::<Embed>().unwrap().table.clone()
}

#[test]
fn an_embedding_of_i64_token_ids_trains_threaded_bit_equal_to_sequential() {
    let m = 4;
    for family in ["gpipe", "1f1b", "zb-h1"] {
        let schedule = families::generate(family, &Params::new(2, m)).unwrap();
        let mut ex = Executor::new(schedule, model()).unwrap();
        let mut plain = model();
        for step in 0..3 {
            let (x, t) = data(step, m);
            assert_eq!(x[0].dtype(), Dtype::I64);
            let threaded = ex.step(x.clone(), &t, &mse).unwrap();
            ex.optimizer_step().unwrap();
            let sequential = sequential_step(&mut plain, x, &t, &mse).unwrap();
            assert_eq!(threaded.losses, sequential.losses, "{family} step {step}");
        }
        let trained = table(ex.stages());
        assert_eq!(trained, table(&plain), "{family}");
        assert_ne!(trained, Embed::new().table, "{family}: the table learned");
    }
}

#[test]
fn token_ids_of_another_type_are_refused_by_name() {
    let schedule = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let mut ex = Executor::new(schedule, model()).unwrap();
    let (_, t) = data(0, 2);
    let floats = vec![Tensor::new(vec![2], vec![1.0, 2.0]).unwrap(); 2];
    let e = ex.step(floats, &t, &mse).unwrap_err().to_string();
    assert!(e.contains("token ids are i64, got f32"), "{e}");
}
