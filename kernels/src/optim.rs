//! Optimizer updates: SGD with momentum and AdamW, elementwise over a flat parameter buffer.
//!
//! The per-element updates ([`SgdMomentum::update`], [`AdamWStep::update`]) are what the GPU kernels
//! call; the slice functions loop them over a layer's parameters, gradients and optimizer state.
//! Semantics follow PyTorch's `torch.optim.SGD` (no dampening, no Nesterov) and `torch.optim.AdamW`.

use crate::math::{powi, sqrt};

/// SGD with momentum and (L2, coupled) weight decay:
/// `v <- momentum v + (g + weight_decay p)`, then `p <- p - lr v`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdMomentum {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor (`0` gives plain SGD).
    pub momentum: f32,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
}

impl SgdMomentum {
    /// One element: from parameter `p`, gradient `g` and velocity `v`, the new `(p, v)`.
    #[inline]
    pub fn update(&self, p: f32, g: f32, v: f32) -> (f32, f32) {
        let v = self.momentum * v + (g + self.weight_decay * p);
        (p - self.lr * v, v)
    }

    /// Updates `params` and `velocity` in place from `grads`.
    ///
    /// # Panics
    /// If the three slices differ in length.
    #[inline]
    pub fn step(&self, params: &mut [f32], grads: &[f32], velocity: &mut [f32]) {
        assert_eq!(
            params.len(),
            grads.len(),
            "parameter and gradient lengths differ"
        );
        assert_eq!(
            params.len(),
            velocity.len(),
            "parameter and velocity lengths differ"
        );
        for ((p, &g), v) in params.iter_mut().zip(grads).zip(velocity.iter_mut()) {
            (*p, *v) = self.update(*p, g, *v);
        }
    }
}

/// AdamW (decoupled weight decay), the hyper-parameters. [`AdamW::at_step`] turns them into the
/// per-step constants ([`AdamWStep`]) that the per-element update (and the GPU kernel) take.
///
/// At step `t` (from 1): `p <- p (1 - lr wd)`, `m <- b1 m + (1 - b1) g`, `v <- b2 v + (1 - b2) g^2`,
/// `p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first moment (PyTorch default 0.9).
    pub beta1: f32,
    /// Decay of the second moment (PyTorch default 0.999).
    pub beta2: f32,
    /// Added to the root of the second moment (PyTorch default 1e-8).
    pub eps: f32,
    /// Decoupled weight decay (PyTorch default 0.01).
    pub weight_decay: f32,
}

impl AdamW {
    /// PyTorch's defaults with the given learning rate.
    pub const fn with_lr(lr: f32) -> AdamW {
        AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }

    /// The constants of step `t`, counted from 1 (a `t` of 0 is treated as 1).
    #[inline]
    pub fn at_step(&self, t: u32) -> AdamWStep {
        let t = t.max(1);
        AdamWStep {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            decay: 1.0 - self.lr * self.weight_decay,
            inv_bias1: 1.0 / (1.0 - powi(self.beta1, t)),
            inv_bias2: 1.0 / (1.0 - powi(self.beta2, t)),
        }
    }

    /// Step `t` (from 1) over a whole buffer: updates `params`, the first moments `m` and the second
    /// moments `v` in place from `grads`.
    ///
    /// # Panics
    /// If the slices differ in length.
    #[inline]
    pub fn step(&self, t: u32, params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32]) {
        assert_eq!(
            params.len(),
            grads.len(),
            "parameter and gradient lengths differ"
        );
        assert_eq!(
            params.len(),
            m.len(),
            "parameter and first-moment lengths differ"
        );
        assert_eq!(
            params.len(),
            v.len(),
            "parameter and second-moment lengths differ"
        );
        let s = self.at_step(t);
        for (((p, &g), m), v) in params
            .iter_mut()
            .zip(grads)
            .zip(m.iter_mut())
            .zip(v.iter_mut())
        {
            (*p, *m, *v) = s.update(*p, g, *m, *v);
        }
    }
}

/// The constants of one AdamW step: the hyper-parameters plus the decay factor `1 - lr wd` and the
/// inverse bias corrections `1/(1 - b1^t)`, `1/(1 - b2^t)`, computed once per step on the host.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct AdamWStep {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// `1 - lr weight_decay`, the decoupled decay factor.
    pub decay: f32,
    /// `1 / (1 - beta1^t)`.
    pub inv_bias1: f32,
    /// `1 / (1 - beta2^t)`.
    pub inv_bias2: f32,
}

impl AdamWStep {
    /// One element: from parameter `p`, gradient `g` and moments `m`, `v`, the new `(p, m, v)`.
    #[inline]
    pub fn update(&self, p: f32, g: f32, m: f32, v: f32) -> (f32, f32, f32) {
        let m = self.beta1 * m + (1.0 - self.beta1) * g;
        let v = self.beta2 * v + (1.0 - self.beta2) * g * g;
        let m_hat = m * self.inv_bias1;
        let v_hat = v * self.inv_bias2;
        let p = p * self.decay - self.lr * m_hat / (sqrt(v_hat) + self.eps);
        (p, m, v)
    }
}
