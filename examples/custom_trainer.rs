//! A custom trainer: its own stage type, trained through `pipefill-host` alone (no built-in layers).
//!
//! Each stage is a residual block `y = x + tanh(x W)` with its own hand-written math and plain SGD.
//! The trainer implements [`Stage`] for it, picks a schedule family, and lets the executor run the
//! pipeline on one thread per rank; it gets the measured timeline for free.
//!
//! ```sh
//! cargo run --release --example custom_trainer            # zb-h1 on 2 ranks
//! cargo run --release --example custom_trainer -- dualpipev 3
//! ```

use pipefill_host::runtime::{Executor, Stage, StageError, Tensor};
use pipefill_host::schedule::{families, Params};

/// `y = x + tanh(x W)`, `W` is `d x d`.
struct Residual {
    d: usize,
    w: Vec<f32>,
    grad: Vec<f32>,
    lr: f32,
}

/// What backward needs: the input, `t = tanh(x W)`, and after `I` the gradient at `x W`.
struct ResidualStash {
    x: Tensor,
    t: Vec<f32>,
    dz: Option<Vec<f32>>,
}

impl Residual {
    fn new(d: usize, seed: u32, lr: f32) -> Self {
        // A small deterministic pseudo-random init in [-0.3, 0.3).
        let w = (0..d * d)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761);
                (h % 1000) as f32 / 1000.0 * 0.6 - 0.3
            })
            .collect();
        Residual {
            d,
            w,
            grad: vec![0.0; d * d],
            lr,
        }
    }
}

impl Stage for Residual {
    type Stash = ResidualStash;

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, ResidualStash), StageError> {
        let (rows, d) = (x.rows(), self.d);
        if x.cols() != d {
            return Err(StageError::new(format!(
                "expected width {d}, got {}",
                x.cols()
            )));
        }
        let mut t = vec![0.0; rows * d];
        for r in 0..rows {
            for j in 0..d {
                let z: f32 = (0..d)
                    .map(|i| x.data()[r * d + i] * self.w[i * d + j])
                    .sum();
                t[r * d + j] = z.tanh();
            }
        }
        let y: Vec<f32> = x.data().iter().zip(&t).map(|(a, b)| a + b).collect();
        Ok((
            Tensor::new(x.shape().to_vec(), y)?,
            ResidualStash { x, t, dz: None },
        ))
    }

    fn backward_input(&mut self, st: &mut ResidualStash, dy: Tensor) -> Result<Tensor, StageError> {
        let (rows, d) = (st.x.rows(), self.d);
        // dz = dy * (1 - t^2); dx = dy + dz W^T.
        let dz: Vec<f32> = dy
            .data()
            .iter()
            .zip(&st.t)
            .map(|(g, t)| g * (1.0 - t * t))
            .collect();
        let mut dx = dy.data().to_vec();
        for r in 0..rows {
            for i in 0..d {
                dx[r * d + i] += (0..d)
                    .map(|j| dz[r * d + j] * self.w[i * d + j])
                    .sum::<f32>();
            }
        }
        st.dz = Some(dz);
        st.t = Vec::new(); // not needed by W: release it now
        Ok(Tensor::new(dy.shape().to_vec(), dx)?)
    }

    fn backward_weight(&mut self, st: ResidualStash) -> Result<(), StageError> {
        let dz = st.dz.ok_or_else(|| StageError::new("W before I"))?;
        let (rows, d) = (st.x.rows(), self.d);
        for r in 0..rows {
            for i in 0..d {
                let xi = st.x.data()[r * d + i];
                for j in 0..d {
                    self.grad[i * d + j] += xi * dz[r * d + j];
                }
            }
        }
        Ok(())
    }

    fn held_bytes(&self, st: &ResidualStash) -> usize {
        st.x.bytes() + 4 * (st.t.len() + st.dz.as_ref().map_or(0, Vec::len))
    }

    fn zero_grad(&mut self) {
        self.grad.iter_mut().for_each(|g| *g = 0.0);
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        for (w, g) in self.w.iter_mut().zip(&self.grad) {
            *w -= self.lr * g;
        }
        Ok(())
    }
}

/// Half the mean squared error.
fn loss(y: &Tensor, t: &Tensor) -> Result<(f32, Tensor), StageError> {
    let n = y.len() as f32;
    let d: Vec<f32> = y.data().iter().zip(t.data()).map(|(a, b)| a - b).collect();
    let v = d.iter().map(|x| x * x).sum::<f32>() / (2.0 * n);
    Ok((
        v,
        Tensor::new(y.shape().to_vec(), d.iter().map(|x| x / n).collect())?,
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let family = args.next().unwrap_or_else(|| "zb-h1".to_string());
    let ranks: usize = args.next().map_or(Ok(2), |s| s.parse())?;
    let (d, rows, m) = (8, 4, 8);
    let schedule = families::generate(&family, &Params::new(ranks, m))?;
    let stages = (0..schedule.stages())
        .map(|s| Residual::new(d, s as u32 + 1, 0.2))
        .collect();
    let mut ex = Executor::new(schedule, stages)?;
    // The task: map x to a fixed rotation-like mix of its features.
    let data = |step: usize| -> (Vec<Tensor>, Vec<Tensor>) {
        (0..m)
            .map(|k| {
                let x: Vec<f32> = (0..rows * d)
                    .map(|i| (((i + 7 * k + 13 * step) * 37 % 101) as f32 / 50.0) - 1.0)
                    .collect();
                let t: Vec<f32> = (0..rows * d)
                    .map(|i| 0.5 * x[i] + 0.3 * x[(i / d) * d + (i + 1) % d])
                    .collect();
                (
                    Tensor::matrix(rows, d, x).expect("shape"),
                    Tensor::matrix(rows, d, t).expect("shape"),
                )
            })
            .unzip()
    };
    let mut last = None;
    for step in 0..40 {
        let (x, t) = data(step);
        let r = ex.step(x, &t, &loss)?;
        if step % 10 == 0 || step == 39 {
            println!(
                "step {step:>2}: loss {:.5}, step {:.2} ms, bubble {:.1}%, peak stash per rank {:?} bytes",
                r.loss,
                r.seconds * 1e3,
                r.timeline.bubble_fraction() * 100.0,
                r.peak_held_bytes
            );
        }
        last = Some(r.loss);
    }
    println!(
        "{} on {} ranks trained a custom stage type; final loss {:.5}",
        family,
        ranks,
        last.unwrap_or(f32::NAN)
    );
    Ok(())
}
