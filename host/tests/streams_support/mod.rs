//! What the stream-runtime tests share: a small nonlinear stage, its initial weights, the loss,
//! and the sweep over every family's small shapes.
#![allow(dead_code)]

use pipefill_host::runtime::{Stage, StageError, Tensor};
use pipefill_host::schedule::families::{self, FAMILIES};
use pipefill_host::schedule::{Params, Schedule};

/// `y = tanh(w * x + b)` per element, with learnable `w` and `b` (a nonlinearity, so the order of
/// work matters to the numbers).
#[derive(Clone)]
pub struct Cell {
    pub w: f32,
    pub b: f32,
    pub grads: (f32, f32),
}

impl Stage for Cell {
    /// The input and the output; after `I`, the gradient at the pre-activation.
    type Stash = (Tensor, Tensor, Option<Tensor>);

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        let mut y = x.clone();
        y.data_mut()
            .iter_mut()
            .for_each(|v| *v = (self.w * *v + self.b).tanh());
        Ok((y.clone(), (x, y, None)))
    }

    fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
        let dz: Vec<f32> = dy
            .data()
            .iter()
            .zip(st.1.data())
            .map(|(d, y)| d * (1.0 - y * y))
            .collect();
        let dz = Tensor::new(dy.shape().to_vec(), dz)?;
        let mut dx = dz.clone();
        dx.scale(self.w);
        st.2 = Some(dz);
        Ok(dx)
    }

    fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
        let dz = st.2.ok_or_else(|| StageError::new("W before I"))?;
        let xs = st.0.data().iter().zip(dz.data());
        self.grads.0 += xs.map(|(x, d)| x * d).sum::<f32>();
        self.grads.1 += dz.data().iter().sum::<f32>();
        Ok(())
    }

    fn held_bytes(&self, st: &Self::Stash) -> usize {
        st.0.bytes() + st.1.bytes()
    }

    fn zero_grad(&mut self) {
        self.grads = (0.0, 0.0);
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        self.w -= 0.1 * self.grads.0;
        self.b -= 0.1 * self.grads.1;
        Ok(())
    }

    /// `dw` and `db`, for a data-parallel reducer.
    fn gradients(&mut self) -> Vec<&mut [f32]> {
        let (w, b) = &mut self.grads;
        vec![std::slice::from_mut(w), std::slice::from_mut(b)]
    }
}

pub fn cells(n: usize) -> Vec<Cell> {
    (0..n)
        .map(|s| Cell {
            w: 0.9 + 0.07 * s as f32,
            b: 0.05 * s as f32 - 0.1,
            grads: (0.0, 0.0),
        })
        .collect()
}

pub fn mse(y: &Tensor, t: &Tensor) -> Result<(f32, Tensor), StageError> {
    let d: Vec<f32> = y.data().iter().zip(t.data()).map(|(a, b)| a - b).collect();
    let v = 0.5 * d.iter().map(|x| x * x).sum::<f32>();
    Ok((v, Tensor::new(y.shape().to_vec(), d)?))
}

/// Calls `check` on every family's schedule for P in 1..=4, V in 1..=3 and M in {P, 2P + 1}
/// (the shapes a family cannot generate are skipped); every family must generate at least two.
pub fn for_every_family_shape(mut check: impl FnMut(Schedule)) {
    let mut ran = Vec::new();
    for family in FAMILIES {
        let mut count = 0;
        for p in 1..=4 {
            for v in 1..=3 {
                for m in [p, 2 * p + 1] {
                    let params = Params::new(p, m).with_chunks(v);
                    let Ok(schedule) = families::generate(family.name, &params) else {
                        continue;
                    };
                    check(schedule);
                    count += 1;
                }
            }
        }
        assert!(count >= 2, "{}: only {count} shapes generated", family.name);
        ran.push((family.name, count));
    }
    assert_eq!(ran.len(), FAMILIES.len());
}
