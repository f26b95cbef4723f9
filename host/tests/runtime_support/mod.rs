//! What the host runtime tests share: a scalar-weight stage `y = w x` and the squared-error loss.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use pipefill_host::cpu_time::thread_cpu_seconds;
use pipefill_host::runtime::{Stage, StageError, Tensor};

/// What a [`Scale`] stage's forward does besides its math: nothing, sleep (off the CPU, as a
/// descheduled thread is), or spin until the thread has used this much CPU time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// Just the math.
    None,
    /// Sleeps this long.
    Sleep(Duration),
    /// Spins until the thread's CPU clock has advanced this much (10 s of wall time at most).
    Spin(Duration),
}

impl Pace {
    fn run(self) {
        match self {
            Pace::None => {}
            Pace::Sleep(d) => std::thread::sleep(d),
            Pace::Spin(d) => {
                let (wall, cpu) = (Instant::now(), thread_cpu_seconds());
                let mut x = 1u64;
                while let (Some(a), Some(b)) = (cpu, thread_cpu_seconds()) {
                    if b - a >= d.as_secs_f64() || wall.elapsed() > Duration::from_secs(10) {
                        break;
                    }
                    for _ in 0..1000 {
                        x = std::hint::black_box(x.wrapping_mul(6364136223846793005) ^ 1);
                    }
                }
            }
        }
    }
}

/// `y = w x` per element with a learnable scalar `w`, stepped by plain SGD at rate `lr`; counts
/// its optimizer steps and, when `fail_on` is set, fails the forward of an input holding that value.
pub struct Scale {
    /// The weight.
    pub w: f32,
    /// The accumulated gradient of `w` (a slice, so data parallelism can reduce it).
    pub grad: [f32; 1],
    /// The SGD learning rate.
    pub lr: f32,
    /// Optimizer steps taken.
    pub steps: usize,
    /// An input value whose forward fails.
    pub fail_on: Option<f32>,
    /// What its forward does besides the math.
    pub pace: Pace,
}

impl Scale {
    /// A stage with weight `w`, learning rate `lr`, no gradient, no steps, never failing.
    pub fn new(w: f32, lr: f32) -> Self {
        Scale {
            w,
            grad: [0.0],
            lr,
            steps: 0,
            fail_on: None,
            pace: Pace::None,
        }
    }

    /// The same stage, its forward paced by `pace`.
    pub fn paced(self, pace: Pace) -> Self {
        Scale { pace, ..self }
    }

    /// The same stage, failing the forward of any input holding `v`.
    pub fn failing_on(self, v: f32) -> Self {
        Scale {
            fail_on: Some(v),
            ..self
        }
    }
}

impl Stage for Scale {
    /// The input; after `I`, the output gradient.
    type Stash = (Tensor, Option<Tensor>);

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        if let Some(v) = self.fail_on {
            if x.data().contains(&v) {
                return Err(StageError::new("unlucky input"));
            }
        }
        self.pace.run();
        let mut y = x.clone();
        y.scale(self.w);
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
        self.grad[0] +=
            st.0.data()
                .iter()
                .zip(dy.data())
                .map(|(x, d)| x * d)
                .sum::<f32>();
        Ok(())
    }

    fn held_bytes(&self, st: &Self::Stash) -> usize {
        st.0.bytes()
    }

    fn zero_grad(&mut self) {
        self.grad = [0.0];
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        self.w -= self.lr * self.grad[0];
        self.steps += 1;
        Ok(())
    }

    fn gradients(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.grad[..]]
    }
}

/// `0.5 * |y - t|^2` and its gradient `y - t`.
pub fn mse(y: &Tensor, t: &Tensor) -> Result<(f32, Tensor), StageError> {
    let d: Vec<f32> = y.data().iter().zip(t.data()).map(|(a, b)| a - b).collect();
    Ok((
        0.5 * d.iter().map(|x| x * x).sum::<f32>(),
        Tensor::new(y.shape().to_vec(), d)?,
    ))
}
