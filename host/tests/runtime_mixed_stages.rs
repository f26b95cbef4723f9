//! A model of three stage types (embedding, blocks, head) in one `Vec<BoxedStage>`: trained by the
//! executor to the same gradients as a plain loop over the concrete types, and profiled; and the
//! same three as three stream stage types on `CpuStreams` in one `Vec<BoxedStreamStage>`, trained
//! by the stream executor to the same gradients.

use pipefill_host::profile::{profile_layers, ProfileOptions, ProfiledLayer};
use pipefill_host::runtime::streams::{CpuStream, CpuStreams, OnStreams, Pending, StreamExecutor};
use pipefill_host::runtime::{
    AnyStash, BoxedStage, BoxedStreamStage, Executor, Stage, StageError, Tensor,
};
use pipefill_host::schedule::{families, Params};

const D: usize = 3;
const VOCAB: usize = 5;

/// Token ids (`[rows, 1]`, as f32) to rows of a `VOCAB x D` table.
struct Embed {
    table: Vec<f32>,
    grad: Vec<f32>,
}

/// `y = tanh(w * x)` elementwise, one scalar weight.
struct Block {
    w: f32,
    grad: f32,
}

/// `y[r] = sum_j x[r, j] * v[j]`: `[rows, D]` to `[rows, 1]`.
struct Head {
    v: Vec<f32>,
    grad: Vec<f32>,
}

fn ids(x: &Tensor) -> Result<Vec<usize>, StageError> {
    x.data()
        .iter()
        .map(|&t| {
            let i = t as usize;
            (i < VOCAB && t >= 0.0)
                .then_some(i)
                .ok_or_else(|| StageError::new(format!("token {t} out of range")))
        })
        .collect()
}

impl Stage for Embed {
    type Stash = (Vec<usize>, Option<Tensor>);

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        let ids = ids(&x)?;
        let y = ids
            .iter()
            .flat_map(|&i| self.table[i * D..(i + 1) * D].iter().copied())
            .collect();
        Ok((Tensor::matrix(ids.len(), D, y)?, (ids, None)))
    }

    fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
        st.1 = Some(dy);
        Ok(Tensor::empty()) // the first stage: nobody wants the input gradient
    }

    fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
        let dy = st.1.ok_or_else(|| StageError::new("W before I"))?;
        for (r, &i) in st.0.iter().enumerate() {
            for j in 0..D {
                self.grad[i * D + j] += dy.data()[r * D + j];
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
        Ok(())
    }
}

impl Stage for Block {
    /// The input, the output, and after `I` the gradient at `w * x`.
    type Stash = (Tensor, Tensor, Option<Vec<f32>>);

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        let y: Vec<f32> = x.data().iter().map(|v| (self.w * v).tanh()).collect();
        let y = Tensor::new(x.shape().to_vec(), y)?;
        Ok((y.clone(), (x, y, None)))
    }

    fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
        let dz: Vec<f32> = dy
            .data()
            .iter()
            .zip(st.1.data())
            .map(|(g, y)| g * (1.0 - y * y))
            .collect();
        let dx = dz.iter().map(|g| g * self.w).collect();
        st.2 = Some(dz);
        Ok(Tensor::new(dy.shape().to_vec(), dx)?)
    }

    fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
        let dz = st.2.ok_or_else(|| StageError::new("W before I"))?;
        self.grad += st.0.data().iter().zip(&dz).map(|(x, g)| x * g).sum::<f32>();
        Ok(())
    }

    fn held_bytes(&self, st: &Self::Stash) -> usize {
        st.0.bytes() + st.1.bytes() + 4 * st.2.as_ref().map_or(0, Vec::len)
    }

    fn zero_grad(&mut self) {
        self.grad = 0.0;
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        Ok(())
    }
}

impl Stage for Head {
    type Stash = (Tensor, Option<Tensor>);

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        let y = (0..x.rows())
            .map(|r| (0..D).map(|j| x.data()[r * D + j] * self.v[j]).sum())
            .collect();
        Ok((Tensor::matrix(x.rows(), 1, y)?, (x, None)))
    }

    fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
        let rows = st.0.rows();
        let dx = (0..rows * D)
            .map(|i| dy.data()[i / D] * self.v[i % D])
            .collect();
        st.1 = Some(dy);
        Ok(Tensor::matrix(rows, D, dx)?)
    }

    fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
        let dy = st.1.ok_or_else(|| StageError::new("W before I"))?;
        for r in 0..st.0.rows() {
            for j in 0..D {
                self.grad[j] += st.0.data()[r * D + j] * dy.data()[r];
            }
        }
        Ok(())
    }

    fn held_bytes(&self, st: &Self::Stash) -> usize {
        st.0.bytes() + st.1.as_ref().map_or(0, Tensor::bytes)
    }

    fn zero_grad(&mut self) {
        self.grad.iter_mut().for_each(|g| *g = 0.0);
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        Ok(())
    }
}

fn embed() -> Embed {
    Embed {
        table: (0..VOCAB * D).map(|i| 0.1 * i as f32 - 0.7).collect(),
        grad: vec![0.0; VOCAB * D],
    }
}

fn block(s: usize) -> Block {
    Block {
        w: 0.8 + 0.1 * s as f32,
        grad: 0.0,
    }
}

fn head() -> Head {
    Head {
        v: vec![0.5, -0.25, 1.0],
        grad: vec![0.0; D],
    }
}

/// Embedding, `n` blocks, head.
fn model(n: usize) -> Vec<BoxedStage> {
    let mut stages: Vec<BoxedStage> = vec![Box::new(embed())];
    stages.extend((0..n).map(|s| Box::new(block(s)) as BoxedStage));
    stages.push(Box::new(head()));
    stages
}

fn loss(y: &Tensor, t: &Tensor) -> Result<(f32, Tensor), StageError> {
    let d: Vec<f32> = y.data().iter().zip(t.data()).map(|(a, b)| a - b).collect();
    let v = 0.5 * d.iter().map(|x| x * x).sum::<f32>();
    Ok((v, Tensor::new(y.shape().to_vec(), d)?))
}

/// Microbatch `k`: two tokens, and a target per token.
fn data(m: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    (0..m)
        .map(|k| {
            let x = vec![(k % VOCAB) as f32, ((3 * k + 1) % VOCAB) as f32];
            let t = vec![0.3 * k as f32 - 0.5, 0.2];
            (
                Tensor::matrix(2, 1, x).unwrap(),
                Tensor::matrix(2, 1, t).unwrap(),
            )
        })
        .unzip()
}

/// The reference: a plain loop over the concrete types (no trait objects, no schedule).
fn reference_grads(n: usize, m: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut e, mut bs, mut h) = (embed(), (0..n).map(block).collect::<Vec<_>>(), head());
    let (xs, ts) = data(m);
    for (x, t) in xs.into_iter().zip(&ts) {
        let (mut y, se) = e.forward(x).unwrap();
        let mut sb = Vec::new();
        for b in &mut bs {
            let (z, s) = b.forward(y).unwrap();
            sb.push(s);
            y = z;
        }
        let (out, sh) = h.forward(y).unwrap();
        let (_, mut g) = loss(&out, t).unwrap();
        g.scale(1.0 / m as f32);
        let mut g = h.backward(sh, g).unwrap();
        for (b, s) in bs.iter_mut().zip(sb).rev() {
            g = b.backward(s, g).unwrap();
        }
        e.backward(se, g).unwrap();
    }
    (e.grad, bs.iter().map(|b| b.grad).collect(), h.grad)
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * (1.0 + b.abs())
}

#[test]
fn three_stage_types_train_in_one_executor_to_the_reference_gradients() {
    let m = 6;
    for (family, ranks, chunks) in [("zb-h1", 4, 1), ("interleaved-1f1b", 2, 2), ("zbv", 2, 2)] {
        let params = Params::new(ranks, m).with_chunks(chunks);
        let schedule = families::generate(family, &params).unwrap();
        let n = schedule.stages() - 2;
        let mut ex = Executor::new(schedule, model(n)).unwrap();
        let (x, t) = data(m);
        let report = ex.step(x, &t, &loss).unwrap();
        assert!(report.peak_held_bytes.iter().all(|&b| b > 0), "{family}");
        let (ge, gb, gh) = reference_grads(n, m);
        let stages = ex.stages();
        let e = stages[0]
            .downcast_ref::<Embed>()
            .expect("stage 0 is the embedding");
        let h = stages[n + 1]
            .downcast_ref::<Head>()
            .expect("the last stage is the head");
        assert!(
            e.grad.iter().zip(&ge).all(|(a, b)| close(*a, *b)),
            "{family}"
        );
        assert!(
            h.grad.iter().zip(&gh).all(|(a, b)| close(*a, *b)),
            "{family}"
        );
        for (s, want) in gb.iter().enumerate() {
            let b = stages[s + 1].downcast_ref::<Block>().expect("a block");
            assert!(
                close(b.grad, *want),
                "{family} block {s}: {} vs {want}",
                b.grad
            );
        }
        assert!(ge.iter().any(|g| *g != 0.0) && gb.iter().all(|g| *g != 0.0));
    }
}

/// A stream stage on `CpuStreams`, boxed.
type OnCpu = BoxedStreamStage<CpuStream, Pending<Tensor>>;

#[test]
fn three_stream_stage_types_train_in_one_stream_executor_to_the_reference_gradients() {
    let m = 6;
    for (family, ranks, chunks) in [("zb-h1", 4, 1), ("zbv", 2, 2)] {
        let params = Params::new(ranks, m).with_chunks(chunks);
        let schedule = families::generate(family, &params).unwrap();
        let n = schedule.stages() - 2;
        let device = CpuStreams::new();
        // `OnStreams<Embed>`, `OnStreams<Block>` and `OnStreams<Head>`: three stream stage types.
        let mut stages: Vec<OnCpu> = vec![Box::new(device.stage(embed()))];
        stages.extend((0..n).map(|s| Box::new(device.stage(block(s))) as OnCpu));
        stages.push(Box::new(device.stage(head())));
        let mut ex = StreamExecutor::new(schedule, stages, device).unwrap();
        let l = ex.device().loss(loss);
        let (x, t) = data(m);
        let ready = |v: Vec<Tensor>| v.into_iter().map(Pending::ready).collect::<Vec<_>>();
        ex.step(ready(x), &ready(t), &l).unwrap();
        let (ge, gb, gh) = reference_grads(n, m);
        let stages = ex.stages();
        let e = stages[0]
            .downcast_ref::<OnStreams<Embed>>()
            .expect("the embedding");
        let h = (stages[n + 1].downcast_ref::<OnStreams<Head>>()).expect("the head");
        assert!(stages[0].downcast_ref::<OnStreams<Head>>().is_none());
        assert!(
            stages[0].stage_type().contains("Embed"),
            "{}",
            stages[0].stage_type()
        );
        let e_grad = e.inner().grad.clone();
        assert!(
            e_grad.iter().zip(&ge).all(|(a, b)| close(*a, *b)),
            "{family}"
        );
        let h_grad = h.inner().grad.clone();
        assert!(
            h_grad.iter().zip(&gh).all(|(a, b)| close(*a, *b)),
            "{family}"
        );
        for (s, want) in gb.iter().enumerate() {
            let b = stages[s + 1]
                .downcast_ref::<OnStreams<Block>>()
                .expect("a block");
            let got = b.inner().grad;
            assert!(close(got, *want), "{family} block {s}: {got} vs {want}");
        }
        assert!(ge.iter().any(|g| *g != 0.0) && gb.iter().all(|g| *g != 0.0));
    }
    // A box in a box still reaches the stage.
    let device = CpuStreams::new();
    let inner: OnCpu = Box::new(device.stage(block(0)));
    let twice: OnCpu = Box::new(inner);
    assert!(twice.is::<OnStreams<Block>>() && twice.stage_type().contains("Block"));
}

#[test]
fn a_stash_of_another_stage_type_is_refused_not_misread() {
    let mut e: BoxedStage = Box::new(embed());
    let mut b: BoxedStage = Box::new(block(0));
    let x = Tensor::matrix(1, 1, vec![2.0]).unwrap();
    let (y, mut stash) = e.forward(x).unwrap();
    assert_eq!(b.held_bytes(&stash), 0);
    let err = b.backward_input(&mut stash, y.clone()).unwrap_err();
    assert!(err.message().contains("Block"), "{err}");
    assert!(err.message().contains("did not make"), "{err}");
    let err = b.backward(stash, y).unwrap_err();
    assert!(err.message().contains("Block"), "{err}");
    let wrong: AnyStash = Box::new(7u8);
    assert!(e.backward_weight(wrong).is_err());
    assert!(e.is::<Embed>() && !e.is::<Block>());
    assert!(b.stage_type().ends_with("Block"), "{}", b.stage_type());
    if let Some(b) = b.downcast_mut::<Block>() {
        b.w = 2.5;
    }
    assert_eq!(b.downcast_ref::<Block>().map(|b| b.w), Some(2.5));
    // The trait's own methods, called on the box (or on a box in a box), still reach the stage.
    assert!(b.as_any_dyn().is::<Block>());
    let mut twice: BoxedStage = Box::new(b);
    assert!(twice.is::<Block>() && twice.stage_type().ends_with("Block"));
    if let Some(b) = twice.downcast_mut::<Block>() {
        b.w = 3.5;
    }
    assert_eq!(twice.downcast_ref::<Block>().map(|b| b.w), Some(3.5));
}

#[test]
fn the_profiler_takes_mixed_stage_types() {
    let mut stages = model(2);
    let layers = stages
        .iter_mut()
        .enumerate()
        .map(|(i, stage)| ProfiledLayer {
            name: format!("layer{i}"),
            stage,
            parameter_bytes: 0.0,
        })
        .collect();
    let x = Tensor::matrix(4, 1, vec![0.0, 1.0, 2.0, 3.0]).unwrap();
    let options = ProfileOptions {
        warmup: 0,
        repeats: 1,
        ..ProfileOptions::default()
    };
    let costs = profile_layers(layers, x, options).unwrap();
    assert_eq!(costs.len(), 4);
    // What the concrete stashes hold after F: 4 ids; x and y of [4, 3]; x of [4, 3].
    let held: Vec<f64> = costs.iter().map(|c| c.activation_bytes).collect();
    assert_eq!(held, vec![32.0, 96.0, 96.0, 48.0]);
    assert_eq!(costs[3].output_bytes, 16.0);
}
