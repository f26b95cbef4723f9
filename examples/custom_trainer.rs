//! A custom trainer: its own stage types, trained through `pipefill-host` alone (no built-in layers).
//!
//! The model mixes three stage types, each with its own hand-written math and plain SGD:
//! an [`Embedding`] (token ids to vectors) first, residual blocks `y = x + tanh(x W)` in the
//! middle, and a linear [`Head`] last. Each implements [`Stage`] with its own stash type; boxed as
//! [`BoxedStage`]s they sit in one `Vec` and one [`Executor`] runs them on one thread per rank.
//!
//! The trainer runs each step with [`Executor::step_with`]: its hook hears, as the step runs, when
//! a stage's weight gradients are final ([`StepEvent::GradientsReady`]). A data-parallel trainer
//! would start that stage's gradient all-reduce there, overlapping it with the rest of the
//! pipeline; this one hands the stage to a "reducer" thread that records when it could start.
//!
//! The step ends with the gradients ready, not applied: the optimizer is the trainer's call. This
//! trainer clips the global gradient norm (over every stage's [`Stage::gradients`]) to
//! [`MAX_NORM`] first, then calls [`Executor::optimizer_step`].
//!
//! After training it runs an evaluation step ([`Executor::evaluate`]): the same schedule's
//! forwards only, on a batch it never trained on, with no stash kept and no gradient.
//!
//! ```sh
//! cargo run --release --example custom_trainer            # zbv on 2 ranks: 4 stages
//! cargo run --release --example custom_trainer -- dualpipev 3
//! ```

use std::sync::mpsc;

use pipefill_host::runtime::{
    BoxedStage, Evaluation, Executor, Stage, StageError, StepEvent, StepReport, Tensor,
};
use pipefill_host::schedule::{families, Params};

/// Width of the hidden vectors.
const D: usize = 8;
/// Token ids are `0..VOCAB`.
const VOCAB: usize = 16;
/// Outputs per token.
const OUT: usize = 2;
/// The trainer clips the global gradient norm to this.
pub const MAX_NORM: f32 = 0.05;

/// A small deterministic pseudo-random init in `[-scale, scale)`.
fn init(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761);
            ((h % 1000) as f32 / 1000.0 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `out[r, j] += sum_i a[r, i] * b[i, j]` for `a: rows x k`, `b: k x n`.
fn matmul_add(a: &[f32], b: &[f32], out: &mut [f32], k: usize, n: usize) {
    for (row, o) in a.chunks(k).zip(out.chunks_mut(n)) {
        for (i, &x) in row.iter().enumerate() {
            for (o, w) in o.iter_mut().zip(&b[i * n..(i + 1) * n]) {
                *o += x * w;
            }
        }
    }
}

/// `g[i, j] += sum_r a[r, i] * d[r, j]`: the weight gradient of `a b`, `d` the output gradient.
fn outer_add(a: &[f32], d: &[f32], g: &mut [f32], k: usize, n: usize) {
    for (row, drow) in a.chunks(k).zip(d.chunks(n)) {
        for (i, &x) in row.iter().enumerate() {
            for (g, dy) in g[i * n..(i + 1) * n].iter_mut().zip(drow) {
                *g += x * dy;
            }
        }
    }
}

/// SGD: `w -= lr * g`.
fn sgd(w: &mut [f32], g: &[f32], lr: f32) {
    w.iter_mut().zip(g).for_each(|(w, g)| *w -= lr * g);
}

/// Token ids (a `[rows, 1]` tensor of whole numbers) to rows of a `VOCAB x D` table.
pub struct Embedding {
    /// The table.
    pub table: Vec<f32>,
    grad: Vec<f32>,
    lr: f32,
}

impl Stage for Embedding {
    /// The ids, and after `I` the output gradient.
    type Stash = (Vec<usize>, Option<Tensor>);

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        let ids = x
            .data()
            .iter()
            .map(|&t| match t as usize {
                i if i < VOCAB && t >= 0.0 => Ok(i),
                _ => Err(StageError::new(format!("token {t} is not in 0..{VOCAB}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let y = ids
            .iter()
            .flat_map(|&i| self.table[i * D..(i + 1) * D].iter().copied())
            .collect();
        Ok((Tensor::matrix(ids.len(), D, y)?, (ids, None)))
    }

    fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
        st.1 = Some(dy);
        Ok(Tensor::empty()) // the first stage: no one needs the gradient of token ids
    }

    fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
        let dy = st.1.ok_or_else(|| StageError::new("W before I"))?;
        for (&i, d) in st.0.iter().zip(dy.data().chunks(D)) {
            self.grad[i * D..(i + 1) * D]
                .iter_mut()
                .zip(d)
                .for_each(|(g, d)| *g += d);
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
        sgd(&mut self.table, &self.grad, self.lr);
        Ok(())
    }

    fn gradients(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.grad]
    }
}

/// `y = x + tanh(x W)`, `W` is `D x D`.
pub struct Residual {
    /// `W`.
    pub w: Vec<f32>,
    grad: Vec<f32>,
    lr: f32,
}

/// What backward needs: the input, `t = tanh(x W)`, and after `I` the gradient at `x W`.
pub struct ResidualStash {
    x: Tensor,
    t: Vec<f32>,
    dz: Option<Vec<f32>>,
}

impl Stage for Residual {
    type Stash = ResidualStash;

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, ResidualStash), StageError> {
        if x.cols() != D {
            return Err(StageError::new(format!(
                "expected width {D}, got {}",
                x.cols()
            )));
        }
        let mut t = vec![0.0; x.rows() * D];
        matmul_add(x.data(), &self.w, &mut t, D, D);
        t.iter_mut().for_each(|v| *v = v.tanh());
        let y: Vec<f32> = x.data().iter().zip(&t).map(|(a, b)| a + b).collect();
        let y = Tensor::new(x.shape().to_vec(), y)?;
        Ok((y, ResidualStash { x, t, dz: None }))
    }

    fn backward_input(&mut self, st: &mut ResidualStash, dy: Tensor) -> Result<Tensor, StageError> {
        // dz = dy * (1 - t^2); dx = dy + dz W^T.
        let dz: Vec<f32> = dy
            .data()
            .iter()
            .zip(&st.t)
            .map(|(g, t)| g * (1.0 - t * t))
            .collect();
        let mut dx = dy.data().to_vec();
        for (o, d) in dx.chunks_mut(D).zip(dz.chunks(D)) {
            for (i, o) in o.iter_mut().enumerate() {
                *o += d
                    .iter()
                    .zip(&self.w[i * D..(i + 1) * D])
                    .map(|(a, b)| a * b)
                    .sum::<f32>();
            }
        }
        st.dz = Some(dz);
        st.t = Vec::new(); // not needed by W: release it now
        Ok(Tensor::new(dy.shape().to_vec(), dx)?)
    }

    fn backward_weight(&mut self, st: ResidualStash) -> Result<(), StageError> {
        let dz = st.dz.ok_or_else(|| StageError::new("W before I"))?;
        outer_add(st.x.data(), &dz, &mut self.grad, D, D);
        Ok(())
    }

    fn held_bytes(&self, st: &ResidualStash) -> usize {
        st.x.bytes() + 4 * (st.t.len() + st.dz.as_ref().map_or(0, Vec::len))
    }

    fn zero_grad(&mut self) {
        self.grad.iter_mut().for_each(|g| *g = 0.0);
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        sgd(&mut self.w, &self.grad, self.lr);
        Ok(())
    }

    fn gradients(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.grad]
    }
}

/// `y = x V`, `V` is `D x OUT`.
pub struct Head {
    /// `V`.
    pub v: Vec<f32>,
    grad: Vec<f32>,
    lr: f32,
}

impl Stage for Head {
    /// The input, and after `I` the output gradient.
    type Stash = (Tensor, Option<Tensor>);

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        let mut y = vec![0.0; x.rows() * OUT];
        matmul_add(x.data(), &self.v, &mut y, D, OUT);
        Ok((Tensor::matrix(x.rows(), OUT, y)?, (x, None)))
    }

    fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
        let dx = dy
            .data()
            .chunks(OUT)
            .flat_map(|d| (0..D).map(move |i| (i, d)))
            .map(|(i, d)| {
                d.iter()
                    .zip(&self.v[i * OUT..(i + 1) * OUT])
                    .map(|(a, b)| a * b)
                    .sum()
            })
            .collect();
        st.1 = Some(dy);
        Ok(Tensor::matrix(st.0.rows(), D, dx)?)
    }

    fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
        let dy = st.1.ok_or_else(|| StageError::new("W before I"))?;
        outer_add(st.0.data(), dy.data(), &mut self.grad, D, OUT);
        Ok(())
    }

    fn held_bytes(&self, st: &Self::Stash) -> usize {
        st.0.bytes() + st.1.as_ref().map_or(0, Tensor::bytes)
    }

    fn zero_grad(&mut self) {
        self.grad.iter_mut().for_each(|g| *g = 0.0);
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        sgd(&mut self.v, &self.grad, self.lr);
        Ok(())
    }

    fn gradients(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.grad]
    }
}

/// The model for `stages` pipeline stages: an embedding, `stages - 2` residual blocks, a head.
pub fn model(stages: usize) -> Vec<BoxedStage> {
    let lr = 0.5;
    let mut model: Vec<BoxedStage> = vec![Box::new(Embedding {
        table: init(VOCAB * D, 7, 1.0),
        grad: vec![0.0; VOCAB * D],
        lr,
    })];
    for s in 1..stages.saturating_sub(1) {
        model.push(Box::new(Residual {
            w: init(D * D, s as u32, 0.3),
            grad: vec![0.0; D * D],
            lr,
        }));
    }
    model.push(Box::new(Head {
        v: init(D * OUT, 99, 0.3),
        grad: vec![0.0; D * OUT],
        lr,
    }));
    model
}

/// Half the mean squared error.
pub fn loss(y: &Tensor, t: &Tensor) -> Result<(f32, Tensor), StageError> {
    let n = y.len() as f32;
    let d: Vec<f32> = y.data().iter().zip(t.data()).map(|(a, b)| a - b).collect();
    let v = d.iter().map(|x| x * x).sum::<f32>() / (2.0 * n);
    let grad = Tensor::new(y.shape().to_vec(), d.iter().map(|x| x / n).collect())?;
    Ok((v, grad))
}

/// Step `step`'s `m` microbatches of `rows` tokens; the task: token `i` maps to
/// `(cos(i / 3), sin(i / 3)) / 2`.
pub fn data(step: usize, m: usize, rows: usize) -> Result<(Vec<Tensor>, Vec<Tensor>), StageError> {
    let mut inputs = Vec::with_capacity(m);
    let mut targets = Vec::with_capacity(m);
    for k in 0..m {
        let ids: Vec<usize> = (0..rows)
            .map(|r| (r * 5 + k * 3 + step * 7) % VOCAB)
            .collect();
        let t = ids
            .iter()
            .flat_map(|&i| {
                let a = i as f32 / 3.0;
                [0.5 * a.cos(), 0.5 * a.sin()]
            })
            .collect();
        inputs.push(Tensor::matrix(
            rows,
            1,
            ids.iter().map(|&i| i as f32).collect(),
        )?);
        targets.push(Tensor::matrix(rows, OUT, t)?);
    }
    Ok((inputs, targets))
}

/// Every weight of the model, stage by stage (what a test compares).
pub fn weights(stages: &[BoxedStage]) -> Vec<f32> {
    let of = |s: &BoxedStage| -> Vec<f32> {
        let e = s.downcast_ref::<Embedding>().map(|e| &e.table);
        let r = s.downcast_ref::<Residual>().map(|r| &r.w);
        let h = s.downcast_ref::<Head>().map(|h| &h.v);
        e.or(r).or(h).cloned().unwrap_or_default()
    };
    stages.iter().flat_map(of).collect()
}

/// The global norm of every stage's gradients (summed in `f64`); when it exceeds `max_norm`,
/// scales every gradient by `max_norm / norm`. Returns the norm before clipping.
pub fn clip_global_norm(stages: &mut [BoxedStage], max_norm: f32) -> f32 {
    let mut squares = 0.0f64;
    for stage in stages.iter_mut() {
        for g in stage.gradients() {
            squares += g.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
        }
    }
    let norm = squares.sqrt();
    if norm > f64::from(max_norm) {
        let scale = (f64::from(max_norm) / norm) as f32;
        for stage in stages.iter_mut() {
            for g in stage.gradients() {
                g.iter_mut().for_each(|v| *v *= scale);
            }
        }
    }
    norm as f32
}

/// `(stage, seconds into the step)` for each stage, in the order their gradients became ready.
type Ready = Vec<(usize, f64)>;

/// One training step, telling a "reducer" (here: a channel) each stage whose gradients are final;
/// then the global gradient norm clipped to `max_norm` and the optimizer step. Returns the report,
/// when each stage became ready and the norm before clipping.
pub fn step(
    ex: &mut Executor<BoxedStage>,
    inputs: Vec<Tensor>,
    targets: &[Tensor],
    max_norm: f32,
) -> Result<(StepReport, Ready, f32), Box<dyn std::error::Error>> {
    let (ready, reducer) = mpsc::channel();
    let report = ex.step_with(inputs, targets, &loss, |event| {
        if let StepEvent::GradientsReady { stage, at, .. } = event {
            // A data-parallel trainer would start this stage's all-reduce here.
            let _ = ready.send((stage, at));
        }
    })?;
    drop(ready);
    // The step left the gradients ready: clip, then apply them.
    let norm = clip_global_norm(ex.stages_mut(), max_norm);
    ex.optimizer_step()?;
    Ok((report, reducer.into_iter().collect(), norm))
}

/// An evaluation step on the batch of step `step` (a batch no training step used when `step` is
/// past the last one): forwards only, no stash kept, no gradient, the weights untouched.
pub fn evaluate(
    ex: &mut Executor<BoxedStage>,
    step: usize,
    rows: usize,
) -> Result<Evaluation, Box<dyn std::error::Error>> {
    let (x, t) = data(step, ex.schedule().microbatches, rows)?;
    Ok(ex.evaluate(x, &t, &loss)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let family = args.next().unwrap_or_else(|| "zbv".to_string());
    let ranks: usize = args.next().map_or(Ok(2), |s| s.parse())?;
    let (rows, m, steps) = (4, 8, 60);
    let schedule = families::generate(&family, &Params::new(ranks, m))?;
    if schedule.stages() < 2 {
        return Err(
            "this model needs at least 2 stages (an embedding and a head): use 2 ranks \
                    or more, or a family with 2 stages per rank"
                .into(),
        );
    }
    let mut ex = Executor::new(schedule.clone(), model(schedule.stages()))?;
    let kinds: Vec<&str> = ex.stages().iter().map(|s| short(s.stage_type())).collect();
    println!("{family} on {ranks} ranks, stages {kinds:?}");
    let (mut last, mut clipped) = (None, 0);
    for i in 0..steps {
        let (x, t) = data(i, m, rows)?;
        let (r, ready, norm) = step(&mut ex, x, &t, MAX_NORM)?;
        clipped += usize::from(norm > MAX_NORM);
        if i % 15 == 0 || i == steps - 1 {
            println!(
                "step {i:>2}: loss {:.5}, gradient norm {norm:.4}, step {:.2} ms, bubble {:.1}%, peak stash per rank {:?} bytes",
                r.loss,
                r.seconds * 1e3,
                r.timeline.bubble_fraction() * 100.0,
                r.peak_held_bytes
            );
        }
        if i == steps - 1 {
            let spans = r.timeline.spans.iter().flatten();
            let (items, busy) = spans.fold((0usize, 0.0), |(n, b), s| (n + 1, b + s.end - s.start));
            println!(
                "  (the bubble is high because the stages are tiny: an action computes for {:.1} us on \
                 average, while the runtime's own cost per action is 0.5 to 2.5 us (docs/measurements.md, \
                 executor overhead), so at this size it measures the runtime's hand-offs, not the schedule; give the stages \
                 milliseconds of work and it approaches the schedule's own)",
                busy / items.max(1) as f64 * 1e6
            );
            for (stage, at) in ready {
                println!(
                    "  stage {stage} ({}) gradients ready at {:.3} ms of {:.3} ms: its all-reduce could start",
                    kinds[stage],
                    at * 1e3,
                    r.seconds * 1e3
                );
            }
        }
        last = Some(r.loss);
    }
    let eval = evaluate(&mut ex, steps, rows)?;
    println!(
        "evaluation on an unseen batch: loss {:.5}, {:.2} ms, peak stash per rank {:?} bytes \
         (one forward's: each is dropped as its forward returns)",
        eval.loss,
        eval.seconds * 1e3,
        eval.peak_held_bytes
    );
    let head = ex.stages().last().and_then(|s| s.downcast_ref::<Head>());
    let norm = head.map_or(0.0, |h| h.v.iter().map(|v| v * v).sum::<f32>().sqrt());
    println!(
        "{family} on {ranks} ranks trained an embedding, {} residual blocks and a head; final loss \
         {:.5}, head weight norm {norm:.3}; the gradient norm was clipped to {MAX_NORM} in \
         {clipped} of {steps} steps",
        schedule.stages().saturating_sub(2),
        last.unwrap_or(f32::NAN)
    );
    Ok(())
}

/// The last path segment of a type name.
fn short(type_name: &str) -> &str {
    type_name.rsplit("::").next().unwrap_or(type_name)
}
