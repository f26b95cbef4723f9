//! [`DynStage`]: a [`Stage`] with its stash type erased, so that one executor (or one profiler
//! run) holds stages of different Rust types: an embedding, blocks and a head.

use std::any::{type_name, Any};

use super::{Stage, StageError, Tensor};

/// A stash with its type erased: what a [`BoxedStage`] keeps from `F` to `W`.
pub type AnyStash = Box<dyn Any + Send>;

/// A stage of any type behind one pointer type: `Executor<BoxedStage>` runs a model whose stages
/// are of different Rust types (see [`DynStage`]).
pub type BoxedStage = Box<dyn DynStage>;

/// [`Stage`] with the stash type erased ([`AnyStash`]), so that it can be used as a trait object.
///
/// Every `Stage` whose type and stash live for `'static` is a `DynStage` (a blanket
/// implementation; there is nothing to implement), and [`BoxedStage`] (`Box<dyn DynStage>`) is a
/// [`Stage`] again. So a model mixing stage types is a `Vec<BoxedStage>`, and the executor, the
/// sequential reference and the profiler take it as they take any stage type:
///
/// ```
/// use pipefill_host::runtime::{sequential_step, BoxedStage, Stage, StageError, Tensor};
///
/// /// `y = x + b` (no stash).
/// struct Shift(f32);
/// /// `y = w * x` (keeps `x` for `dW`).
/// struct Scale { w: f32, grad: f32 }
/// # impl Stage for Shift {
/// #     type Stash = ();
/// #     fn forward(&mut self, mut x: Tensor) -> Result<(Tensor, ()), StageError> {
/// #         x.data_mut().iter_mut().for_each(|v| *v += self.0);
/// #         Ok((x, ()))
/// #     }
/// #     fn backward_input(&mut self, _: &mut (), dy: Tensor) -> Result<Tensor, StageError> { Ok(dy) }
/// #     fn backward_weight(&mut self, _: ()) -> Result<(), StageError> { Ok(()) }
/// #     fn held_bytes(&self, _: &()) -> usize { 0 }
/// #     fn zero_grad(&mut self) {}
/// #     fn optimizer_step(&mut self) -> Result<(), StageError> { Ok(()) }
/// # }
/// # impl Stage for Scale {
/// #     type Stash = (Tensor, f32);
/// #     fn forward(&mut self, x: Tensor) -> Result<(Tensor, (Tensor, f32)), StageError> {
/// #         let mut y = x.clone();
/// #         y.scale(self.w);
/// #         Ok((y, (x, 0.0)))
/// #     }
/// #     fn backward_input(&mut self, st: &mut (Tensor, f32), mut dy: Tensor) -> Result<Tensor, StageError> {
/// #         st.1 = st.0.data().iter().zip(dy.data()).map(|(x, d)| x * d).sum();
/// #         dy.scale(self.w);
/// #         Ok(dy)
/// #     }
/// #     fn backward_weight(&mut self, st: (Tensor, f32)) -> Result<(), StageError> {
/// #         self.grad += st.1;
/// #         Ok(())
/// #     }
/// #     fn held_bytes(&self, st: &(Tensor, f32)) -> usize { st.0.bytes() }
/// #     fn zero_grad(&mut self) { self.grad = 0.0; }
/// #     fn optimizer_step(&mut self) -> Result<(), StageError> { Ok(()) }
/// # }
///
/// let mut stages: Vec<BoxedStage> = vec![Box::new(Shift(1.0)), Box::new(Scale { w: 3.0, grad: 0.0 })];
/// let loss = |y: &Tensor, _: &Tensor| Ok((y.data()[0], Tensor::new(vec![1], vec![1.0])?));
/// let x = Tensor::new(vec![1], vec![2.0]).unwrap();
/// let r = sequential_step(&mut stages, vec![x.clone()], &[x], &loss).unwrap();
/// assert_eq!(r.loss, 9.0); // 3 * (2 + 1)
/// // Back to the concrete type, e.g. to read weights or gradients:
/// assert_eq!(stages[1].downcast_ref::<Scale>().map(|s| s.grad), Some(3.0));
/// assert!(stages[0].downcast_ref::<Scale>().is_none());
/// ```
///
/// The cost: one heap allocation per forward for a stash that is not zero-sized, one virtual call
/// per layer call and a type check per backward. A model of one stage type keeps using that type
/// directly and pays none of it.
pub trait DynStage: Send {
    /// [`Stage::forward`], the stash boxed.
    fn forward_dyn(&mut self, input: Tensor) -> Result<(Tensor, AnyStash), StageError>;

    /// [`Stage::backward_input`]; refuses a stash made by another stage type.
    fn backward_input_dyn(
        &mut self,
        stash: &mut AnyStash,
        grad_output: Tensor,
    ) -> Result<Tensor, StageError>;

    /// [`Stage::backward_weight`]; refuses a stash made by another stage type.
    fn backward_weight_dyn(&mut self, stash: AnyStash) -> Result<(), StageError>;

    /// [`Stage::backward`] (the stage's own, fused or not); refuses a stash made by another stage
    /// type.
    fn backward_dyn(&mut self, stash: AnyStash, grad_output: Tensor) -> Result<Tensor, StageError>;

    /// [`Stage::held_bytes`]; 0 for a stash made by another stage type.
    fn held_bytes_dyn(&self, stash: &AnyStash) -> usize;

    /// [`Stage::zero_grad`].
    fn zero_grad_dyn(&mut self);

    /// [`Stage::optimizer_step`].
    fn optimizer_step_dyn(&mut self) -> Result<(), StageError>;

    /// [`Stage::gradients`].
    fn gradients_dyn(&mut self) -> Vec<&mut [f32]>;

    /// The name of the concrete stage type. Prefer the inherent
    /// [`stage_type`](trait.DynStage.html#method.stage_type) of `dyn DynStage`.
    fn stage_type_dyn(&self) -> &'static str;

    /// The concrete stage as [`Any`] (through any number of boxes). Prefer the inherent
    /// [`downcast_ref`](trait.DynStage.html#method.downcast_ref) of `dyn DynStage`.
    fn as_any_dyn(&self) -> &dyn Any;

    /// The concrete stage as mutable [`Any`] (see [`as_any_dyn`](DynStage::as_any_dyn)).
    fn as_any_mut_dyn(&mut self) -> &mut dyn Any;
}

/// The stash of a `S`, or an error naming both types.
fn stash_of<S: Stage + 'static>(stash: AnyStash) -> Result<S::Stash, StageError>
where
    S::Stash: 'static,
{
    stash
        .downcast::<S::Stash>()
        .map(|b| *b)
        .map_err(|_| wrong_stash::<S>())
}

fn wrong_stash<S>() -> StageError {
    StageError::new(format!(
        "stage `{}` was given a stash it did not make (made by another stage type)",
        type_name::<S>()
    ))
}

impl<S> DynStage for S
where
    S: Stage + 'static,
    S::Stash: 'static,
{
    fn forward_dyn(&mut self, input: Tensor) -> Result<(Tensor, AnyStash), StageError> {
        let (output, stash) = self.forward(input)?;
        Ok((output, Box::new(stash)))
    }

    fn backward_input_dyn(
        &mut self,
        stash: &mut AnyStash,
        grad_output: Tensor,
    ) -> Result<Tensor, StageError> {
        let stash = stash
            .downcast_mut::<S::Stash>()
            .ok_or_else(wrong_stash::<S>)?;
        self.backward_input(stash, grad_output)
    }

    fn backward_weight_dyn(&mut self, stash: AnyStash) -> Result<(), StageError> {
        self.backward_weight(stash_of::<S>(stash)?)
    }

    fn backward_dyn(&mut self, stash: AnyStash, grad_output: Tensor) -> Result<Tensor, StageError> {
        self.backward(stash_of::<S>(stash)?, grad_output)
    }

    fn held_bytes_dyn(&self, stash: &AnyStash) -> usize {
        stash
            .downcast_ref::<S::Stash>()
            .map_or(0, |s| self.held_bytes(s))
    }

    fn zero_grad_dyn(&mut self) {
        self.zero_grad();
    }

    fn optimizer_step_dyn(&mut self) -> Result<(), StageError> {
        self.optimizer_step()
    }

    fn gradients_dyn(&mut self) -> Vec<&mut [f32]> {
        self.gradients()
    }

    // A `BoxedStage` is itself a `Stage`, so it meets this impl too (when a method is called on
    // the box rather than on `dyn DynStage`, or a boxed stage is boxed again): these three look
    // through it to the concrete stage.
    fn stage_type_dyn(&self) -> &'static str {
        match (self as &dyn Any).downcast_ref::<BoxedStage>() {
            Some(inner) => (**inner).stage_type_dyn(),
            None => type_name::<S>(),
        }
    }

    fn as_any_dyn(&self) -> &dyn Any {
        match (self as &dyn Any).downcast_ref::<BoxedStage>() {
            Some(inner) => (**inner).as_any_dyn(),
            None => self,
        }
    }

    fn as_any_mut_dyn(&mut self) -> &mut dyn Any {
        // Checked first, then downcast: returning `self` after a failed `downcast_mut` would
        // keep the borrow alive (the borrow checker cannot tell the paths apart).
        if !(self as &dyn Any).is::<BoxedStage>() {
            return self;
        }
        match (self as &mut dyn Any).downcast_mut::<BoxedStage>() {
            Some(inner) => (**inner).as_any_mut_dyn(),
            None => unreachable!("`is` just found a boxed stage"),
        }
    }
}

impl dyn DynStage {
    /// The stage as a `T`, if it is one.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.as_any_dyn().downcast_ref()
    }

    /// The stage as a mutable `T`, if it is one.
    pub fn downcast_mut<T: Any>(&mut self) -> Option<&mut T> {
        self.as_any_mut_dyn().downcast_mut()
    }

    /// `true` if the stage is a `T`.
    pub fn is<T: Any>(&self) -> bool {
        self.as_any_dyn().is::<T>()
    }

    /// The name of the concrete stage type (for messages).
    pub fn stage_type(&self) -> &'static str {
        self.stage_type_dyn()
    }
}

// The calls go through `**self` (the boxed stage): on the box itself they would reach this impl
// again through the blanket `DynStage` impl.
impl Stage for BoxedStage {
    type Stash = AnyStash;

    fn forward(&mut self, input: Tensor) -> Result<(Tensor, AnyStash), StageError> {
        (**self).forward_dyn(input)
    }

    fn backward_input(
        &mut self,
        stash: &mut AnyStash,
        grad_output: Tensor,
    ) -> Result<Tensor, StageError> {
        (**self).backward_input_dyn(stash, grad_output)
    }

    fn backward_weight(&mut self, stash: AnyStash) -> Result<(), StageError> {
        (**self).backward_weight_dyn(stash)
    }

    fn backward(&mut self, stash: AnyStash, grad_output: Tensor) -> Result<Tensor, StageError> {
        (**self).backward_dyn(stash, grad_output)
    }

    fn held_bytes(&self, stash: &AnyStash) -> usize {
        (**self).held_bytes_dyn(stash)
    }

    fn zero_grad(&mut self) {
        (**self).zero_grad_dyn();
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        (**self).optimizer_step_dyn()
    }

    fn gradients(&mut self) -> Vec<&mut [f32]> {
        (**self).gradients_dyn()
    }
}
