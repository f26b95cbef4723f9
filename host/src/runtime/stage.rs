//! The [`Stage`] trait a trainer implements for one stage's layers, and the [`Loss`] at the end.

use thiserror::Error;

use super::Tensor;

/// An error raised by a trainer's layers (a [`Stage`] or a [`Loss`]). The runtime wraps it with the
/// rank and the action that failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct StageError {
    message: String,
}

impl StageError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        StageError {
            message: message.into(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<super::ShapeError> for StageError {
    fn from(e: super::ShapeError) -> Self {
        StageError::new(e.to_string())
    }
}

/// One pipeline stage: a contiguous run of a trainer's layers, with their weights, weight gradients
/// and optimizer state. This is the one trait a trainer implements to have pipefill run its model;
/// it knows nothing about ranks, schedules or threads, and nothing of how its math is computed
/// (CPU GEMMs, CUDA kernels, anything).
///
/// A model whose stages are of different types (an embedding, blocks, a head) boxes them as
/// [`BoxedStage`](super::BoxedStage)s: see [`DynStage`](super::DynStage).
///
/// # The life of a microbatch
///
/// The runtime calls, for every microbatch `k`, in an order the schedule chooses:
///
/// 1. [`forward`](Stage::forward) (`F`): takes the input activation, returns the output activation and
///    a **stash**: whatever the backward passes need (inputs, pre-activations, ...). The runtime holds
///    the stash, keyed by microbatch, so many microbatches can be in flight at once.
/// 2. either [`backward`](Stage::backward) (`B`) with the gradient of the output, returning the
///    gradient of the input and accumulating weight gradients, after which the stash is dropped;
/// 3. or, for zero-bubble schedules, [`backward_input`](Stage::backward_input) (`I`): returns the
///    gradient of the input and keeps in the stash what the weight gradient needs (typically the
///    gradient at the pre-activation), releasing the rest; later
///    [`backward_weight`](Stage::backward_weight) (`W`) consumes the stash and **adds** this
///    microbatch's weight gradients to the accumulated ones. The stash is freed when `W` returns.
///
/// `B` must equal `I` then `W`; the default [`backward`](Stage::backward) is exactly that.
///
/// Once per training step the runtime calls [`zero_grad`](Stage::zero_grad) before the first
/// microbatch; the step ends with the weight gradients accumulated (and reduced across replicas
/// where a reducer is set). [`optimizer_step`](Stage::optimizer_step) is the trainer's call:
/// every runner's `optimizer_step` (e.g. [`Executor::optimizer_step`](super::Executor::optimizer_step))
/// calls it on every stage, after the trainer read or changed the [`gradients`](Stage::gradients)
/// if it wants to (clip their global norm, skip a step on overflow). The weight gradients stay
/// readable between a step's end and the next step's start.
///
/// Gradients arrive already scaled for the step: the last stage's output gradient is the
/// [`Loss`] gradient times `1 / M`, so accumulating over the `M` microbatches gives the gradient
/// of the mean loss of the step.
///
/// # Memory
///
/// [`held_bytes`](Stage::held_bytes) reports what a stash holds; the runtime sums it over the
/// live stashes of a rank to report the activation memory held (and its peak per step).
///
/// # Example
///
/// A stage that multiplies by one learnable scalar, `y = w * x`, trained with plain SGD:
///
/// ```
/// use pipefill_host::runtime::{Stage, StageError, Tensor};
///
/// struct Scale { w: f32, grad: f32, lr: f32 }
///
/// /// What backward needs: the input (for dW) and, after `I`, the output gradient.
/// struct ScaleStash { x: Tensor, dy: Option<Tensor> }
///
/// impl Stage for Scale {
///     type Stash = ScaleStash;
///
///     fn forward(&mut self, x: Tensor) -> Result<(Tensor, ScaleStash), StageError> {
///         let mut y = x.clone();
///         y.scale(self.w);
///         Ok((y, ScaleStash { x, dy: None }))
///     }
///
///     fn backward_input(&mut self, stash: &mut ScaleStash, dy: Tensor) -> Result<Tensor, StageError> {
///         let mut dx = dy.clone();
///         dx.scale(self.w);
///         stash.dy = Some(dy);
///         Ok(dx)
///     }
///
///     fn backward_weight(&mut self, stash: ScaleStash) -> Result<(), StageError> {
///         let dy = stash.dy.ok_or_else(|| StageError::new("W before I"))?;
///         self.grad += stash.x.data().iter().zip(dy.data()).map(|(x, d)| x * d).sum::<f32>();
///         Ok(())
///     }
///
///     fn held_bytes(&self, stash: &ScaleStash) -> usize {
///         stash.x.bytes() + stash.dy.as_ref().map_or(0, Tensor::bytes)
///     }
///
///     fn zero_grad(&mut self) { self.grad = 0.0; }
///
///     fn optimizer_step(&mut self) -> Result<(), StageError> {
///         self.w -= self.lr * self.grad;
///         Ok(())
///     }
/// }
///
/// # fn main() -> Result<(), StageError> {
/// let mut s = Scale { w: 2.0, grad: 0.0, lr: 0.1 };
/// let (y, stash) = s.forward(Tensor::new(vec![1, 2], vec![1.0, 3.0])?)?;
/// assert_eq!(y.data(), &[2.0, 6.0]);
/// let dx = s.backward(stash, Tensor::new(vec![1, 2], vec![1.0, 1.0])?)?; // I then W
/// assert_eq!(dx.data(), &[2.0, 2.0]);
/// assert_eq!(s.grad, 4.0);
/// s.optimizer_step()?;
/// assert!((s.w - 1.6).abs() < 1e-6);
/// # Ok(())
/// # }
/// ```
pub trait Stage<T: Payload = Tensor>: Send {
    /// What the forward pass keeps for the backward passes of one microbatch.
    type Stash: Send;

    /// `F`: computes this stage's output for one microbatch and the stash its backward needs.
    fn forward(&mut self, input: T) -> Result<(T, Self::Stash), StageError>;

    /// `I`: computes the gradient of the input from the gradient of the output, and keeps in the
    /// stash what [`backward_weight`](Stage::backward_weight) will need (releasing the rest).
    ///
    /// The first stage's input gradient is discarded by the runtime; a stage that knows it is first
    /// may return [`Tensor::empty`] instead of computing it.
    fn backward_input(&mut self, stash: &mut Self::Stash, grad_output: T) -> Result<T, StageError>;

    /// `W`: adds this microbatch's weight gradients to the accumulated ones; consumes the stash.
    fn backward_weight(&mut self, stash: Self::Stash) -> Result<(), StageError>;

    /// `B`: the full backward. Must equal [`backward_input`](Stage::backward_input) then
    /// [`backward_weight`](Stage::backward_weight), which is the default; override it only to fuse
    /// the two for speed.
    fn backward(&mut self, mut stash: Self::Stash, grad_output: T) -> Result<T, StageError> {
        let grad_input = self.backward_input(&mut stash, grad_output)?;
        self.backward_weight(stash)?;
        Ok(grad_input)
    }

    /// Bytes of activation memory `stash` holds.
    fn held_bytes(&self, stash: &Self::Stash) -> usize;

    /// Selective recomputation ([`Recompute::Selective`](crate::cost::Recompute::Selective)),
    /// right after `F`: drops from `stash` what [`rebuild`](Stage::rebuild) can compute again
    /// cheaply from what stays, and says whether it dropped anything. The default drops nothing
    /// (`Ok(false)`: the stage has nothing selective, and runs as without recomputation).
    ///
    /// The runtime calls it on a stage run with selective recomputation, counts
    /// [`held_bytes`](Stage::held_bytes) after it, and calls `rebuild` on the stash right before
    /// the microbatch's `I` or `B`. What the backward computes must not depend on it: the rebuilt
    /// values must equal the dropped ones bit for bit (a deterministic elementwise function of
    /// what the stash keeps, say).
    ///
    /// ```
    /// use pipefill_host::runtime::{Stage, StageError, Tensor};
    ///
    /// /// `y = 2 x`, then `z = y * y`: backward needs `x` and `y`, and `y` is cheap to rebuild.
    /// struct Square;
    /// struct Kept { x: Tensor, y: Option<Tensor> }
    ///
    /// impl Stage for Square {
    ///     type Stash = Kept;
    ///     fn forward(&mut self, x: Tensor) -> Result<(Tensor, Kept), StageError> {
    ///         let mut y = x.clone();
    ///         y.scale(2.0);
    ///         let z: Vec<f32> = y.data().iter().map(|v| v * v).collect();
    ///         Ok((Tensor::new(x.shape().to_vec(), z)?, Kept { x, y: Some(y) }))
    ///     }
    ///     fn backward_input(&mut self, k: &mut Kept, dz: Tensor) -> Result<Tensor, StageError> {
    ///         let y = k.y.as_ref().ok_or_else(|| StageError::new("y not rebuilt"))?;
    ///         let dx = dz.data().iter().zip(y.data()).map(|(d, y)| 4.0 * d * y).collect();
    ///         Ok(Tensor::new(dz.shape().to_vec(), dx)?)
    ///     }
    ///     fn backward_weight(&mut self, _: Kept) -> Result<(), StageError> { Ok(()) }
    ///     fn held_bytes(&self, k: &Kept) -> usize {
    ///         k.x.bytes() + k.y.as_ref().map_or(0, Tensor::bytes)
    ///     }
    ///     fn shrink(&mut self, k: &mut Kept) -> Result<bool, StageError> {
    ///         Ok(k.y.take().is_some())
    ///     }
    ///     fn rebuild(&mut self, k: &mut Kept) -> Result<(), StageError> {
    ///         if k.y.is_none() {
    ///             let mut y = k.x.clone();
    ///             y.scale(2.0);
    ///             k.y = Some(y);
    ///         }
    ///         Ok(())
    ///     }
    ///     fn zero_grad(&mut self) {}
    ///     fn optimizer_step(&mut self) -> Result<(), StageError> { Ok(()) }
    /// }
    ///
    /// # fn main() -> Result<(), StageError> {
    /// let mut s = Square;
    /// let (_, mut k) = s.forward(Tensor::new(vec![1, 2], vec![1.0, 3.0])?)?;
    /// assert_eq!(s.held_bytes(&k), 16);
    /// assert!(s.shrink(&mut k)?);
    /// assert_eq!(s.held_bytes(&k), 8);
    /// s.rebuild(&mut k)?;
    /// let dx = s.backward_input(&mut k, Tensor::new(vec![1, 2], vec![1.0, 1.0])?)?;
    /// assert_eq!(dx.data(), &[8.0, 24.0]);
    /// # Ok(())
    /// # }
    /// ```
    fn shrink(&mut self, stash: &mut Self::Stash) -> Result<bool, StageError> {
        let _ = stash;
        Ok(false)
    }

    /// Selective recomputation, right before `I` or `B`: computes again what
    /// [`shrink`](Stage::shrink) dropped from `stash` (bit for bit what it was). Called on a stash
    /// `shrink` said it dropped something from; on a stash it left whole it must do nothing (a
    /// stage whose stash is filled later, on a stream, says so before it knows). The default does
    /// nothing.
    fn rebuild(&mut self, stash: &mut Self::Stash) -> Result<(), StageError> {
        let _ = stash;
        Ok(())
    }

    /// Sets the accumulated weight gradients to zero (called before a step's first microbatch).
    fn zero_grad(&mut self);

    /// Applies the accumulated weight gradients with the stage's optimizer (called when the
    /// trainer asks a runner for its `optimizer_step`, after a step that succeeded).
    fn optimizer_step(&mut self) -> Result<(), StageError>;

    /// The accumulated weight gradients, as flat buffers: for a data-parallel reduction right after
    /// the stage's last `W`/`B` of a step (see
    /// [`Executor::set_reducer`](super::Executor::set_reducer)), and for a trainer that reads or
    /// changes them between a step and its optimizer step (a global norm, clipping). Every replica
    /// of a stage must return the same buffers in the same order. The default, no buffers, suits a stage without
    /// weights; a stage with weights that keeps the default cannot be trained data-parallel (the
    /// replicas would drift apart), and the reducer refuses it when the replicas disagree.
    fn gradients(&mut self) -> Vec<&mut [f32]> {
        Vec::new()
    }
}

/// The loss at the end of the last stage.
///
/// Given the last stage's output for one microbatch and that microbatch's target, returns the loss
/// value and the gradient of that value with respect to the output. The runtime reports the step's
/// loss as the mean of the microbatch losses and scales each gradient by `1 / M` to match.
///
/// Any `Fn(&Tensor, &Tensor) -> Result<(f32, Tensor), StageError> + Sync` is a `Loss`:
///
/// ```
/// use pipefill_host::runtime::{Loss, StageError, Tensor};
/// // Half the sum of squares of (output - target).
/// let half_sse = |y: &Tensor, t: &Tensor| -> Result<(f32, Tensor), StageError> {
///     let d: Vec<f32> = y.data().iter().zip(t.data()).map(|(a, b)| a - b).collect();
///     let v = 0.5 * d.iter().map(|x| x * x).sum::<f32>();
///     Ok((v, Tensor::new(y.shape().to_vec(), d)?))
/// };
/// let y = Tensor::new(vec![1, 2], vec![1.0, 2.0]).unwrap();
/// let t = Tensor::new(vec![1, 2], vec![0.0, 0.0]).unwrap();
/// let (v, g) = half_sse.loss(&y, &t).unwrap();
/// assert_eq!((v, g.data()), (2.5, &[1.0, 2.0][..]));
/// ```
pub trait Loss<T: Payload = Tensor>: Sync {
    /// Loss value and its gradient with respect to `output` (for a host [`Tensor`], the value is
    /// an `f32`; a device payload returns it where the device holds it, read after the step).
    fn loss(&self, output: &T, target: &T) -> Result<(T::Loss, T), StageError>;
}

impl<T: Payload, F> Loss<T> for F
where
    F: Fn(&T, &T) -> Result<(T::Loss, T), StageError> + Sync,
{
    fn loss(&self, output: &T, target: &T) -> Result<(T::Loss, T), StageError> {
        self(output, target)
    }
}

/// What stages exchange: a host [`Tensor`] on the CPU path, a device buffer on a device backend.
///
/// The runtime moves payloads between stages and ranks without looking inside; it needs only their
/// size (for the transfers it reports), a way to scale the loss gradient by `1 / M`, and how to read
/// a loss value once the step is over (a device computes losses asynchronously).
///
/// ```
/// use pipefill_host::runtime::{Payload, Tensor};
/// let mut t = Tensor::new(vec![1, 2], vec![1.0, 2.0]).unwrap();
/// t.scale_by(0.5).unwrap();
/// assert_eq!((t.data(), Payload::bytes(&t)), (&[0.5, 1.0][..], 8));
/// assert_eq!(Tensor::loss_value(0.25).unwrap(), 0.25);
/// ```
pub trait Payload: Send + Sized + 'static {
    /// A loss value as this payload's device holds it.
    type Loss: Send;

    /// Bytes of data it carries.
    fn bytes(&self) -> usize;

    /// Multiplies every value by `by` (enqueued, on a device).
    fn scale_by(&mut self, by: f32) -> Result<(), StageError>;

    /// The value of a loss, once the step that computed it has finished.
    fn loss_value(loss: Self::Loss) -> Result<f32, StageError>;
}

impl Payload for Tensor {
    type Loss = f32;

    fn bytes(&self) -> usize {
        Tensor::bytes(self)
    }

    fn scale_by(&mut self, by: f32) -> Result<(), StageError> {
        self.scale(by);
        Ok(())
    }

    fn loss_value(loss: f32) -> Result<f32, StageError> {
        Ok(loss)
    }
}
