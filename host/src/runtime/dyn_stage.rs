//! [`DynStage`]: a [`Stage`] with its stash type erased, so that one executor (or one profiler
//! run) holds stages of different Rust types: an embedding, blocks and a head. The same for the
//! stream path: [`DynStreamStage`], a [`StreamStage`] with its stash type erased, so that one
//! [`StreamExecutor`](super::streams::StreamExecutor) (CUDA stages included) runs a model whose
//! stream stages are of different types ([`BoxedStreamStage`]). `DynStage` is `DynStreamStage` on
//! the host: no stream (`()`), host tensors.

use std::any::{type_name, Any};

use super::streams::{GradientsFn, StreamStage};
use super::{Payload, Stage, StageError, Tensor};

/// A stash with its type erased: what a [`BoxedStage`] keeps from `F` to `W`.
pub type AnyStash = Box<dyn Any + Send>;

/// A stage of any type behind one pointer type: `Executor<BoxedStage>` runs a model whose stages
/// are of different Rust types (see [`DynStage`]).
pub type BoxedStage = Box<dyn DynStage>;

/// A stream stage of any type behind one pointer type, on streams `St` with payloads `P`: a
/// `StreamExecutor` over `BoxedStreamStage`s runs a model whose stream stages are of different
/// types (see [`DynStreamStage`]). It is a [`StreamStage`] for the devices that declare it with
/// [`boxed_stream_stage!`](crate::boxed_stream_stage) (`CpuStreams` and the CUDA streams do).
pub type BoxedStreamStage<St, P> = Box<dyn DynStreamStage<St, P>>;

/// [`Stage`] with the stash type erased ([`AnyStash`]), so that it can be used as a trait object:
/// [`DynStreamStage`] on the host (no stream, host tensors), with nothing of its own.
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
pub trait DynStage: DynStreamStage<(), Tensor> {}

impl<T: DynStreamStage<(), Tensor> + ?Sized> DynStage for T {}

/// [`StreamStage`] on streams `St` with payloads `P`, the stash type erased ([`AnyStash`]), so that
/// it can be used as a trait object. Every `StreamStage` whose type and stash live for `'static`
/// is one (a blanket implementation; every host [`Stage`] too, as a `StreamStage`), and
/// [`BoxedStreamStage`] is a `StreamStage` again on the devices that declare it
/// ([`boxed_stream_stage!`](crate::boxed_stream_stage)).
///
/// The cost: one heap allocation per forward for a stash that is not zero-sized, one virtual call
/// per layer call and a type check per backward. A model of one stage type keeps using that type
/// directly and pays none of it.
pub trait DynStreamStage<St, P: Payload>: Send {
    /// [`StreamStage::forward`], the stash boxed.
    fn forward_dyn(&mut self, on: &St, input: P) -> Result<(P, AnyStash), StageError>;

    /// [`StreamStage::backward_input`]; refuses a stash made by another stage type.
    fn backward_input_dyn(
        &mut self,
        on: &St,
        stash: &mut AnyStash,
        grad_output: P,
    ) -> Result<P, StageError>;

    /// [`StreamStage::backward_weight`]; refuses a stash made by another stage type.
    fn backward_weight_dyn(&mut self, on: &St, stash: AnyStash) -> Result<(), StageError>;

    /// [`StreamStage::backward`] (the stage's own, fused or not); refuses a stash made by another
    /// stage type.
    fn backward_dyn(&mut self, on: &St, stash: AnyStash, grad_output: P) -> Result<P, StageError>;

    /// [`StreamStage::held_bytes`]; 0 for a stash made by another stage type.
    fn held_bytes_dyn(&self, stash: &AnyStash) -> usize;

    /// [`StreamStage::shrink`]; refuses a stash made by another stage type.
    fn shrink_dyn(&mut self, on: &St, stash: &mut AnyStash) -> Result<bool, StageError>;

    /// [`StreamStage::rebuild`]; refuses a stash made by another stage type.
    fn rebuild_dyn(&mut self, on: &St, stash: &mut AnyStash) -> Result<(), StageError>;

    /// [`StreamStage::zero_grad`].
    fn zero_grad_dyn(&mut self, on: &St);

    /// [`StreamStage::optimizer_step`].
    fn optimizer_step_dyn(&mut self, on: &St) -> Result<(), StageError>;

    /// [`StreamStage::gradients`].
    fn gradients_dyn(&mut self) -> Vec<&mut [f32]>;

    /// [`StreamStage::with_gradients`].
    fn with_gradients_dyn(&mut self, on: &St, f: &mut GradientsFn<'_>) -> Result<(), StageError>;

    /// The name of the concrete stage type. Prefer the inherent
    /// [`stage_type`](trait.DynStage.html#method.stage_type) of `dyn DynStage`.
    fn stage_type_dyn(&self) -> &'static str;

    /// The concrete stage as [`Any`] (through any number of boxes). Prefer the inherent
    /// [`downcast_ref`](trait.DynStage.html#method.downcast_ref) of `dyn DynStage`.
    fn as_any_dyn(&self) -> &dyn Any;

    /// The concrete stage as mutable [`Any`] (see [`as_any_dyn`](DynStreamStage::as_any_dyn)).
    fn as_any_mut_dyn(&mut self) -> &mut dyn Any;
}

/// The stash of a `S` (`T`), or an error naming `S`.
fn stash_of<S, T: 'static>(stash: AnyStash) -> Result<T, StageError> {
    stash
        .downcast::<T>()
        .map(|b| *b)
        .map_err(|_| wrong_stash::<S>())
}

fn wrong_stash<S>() -> StageError {
    StageError::new(format!(
        "stage `{}` was given a stash it did not make (made by another stage type)",
        type_name::<S>()
    ))
}

/// The stream stage inside `any`, if it is a [`BoxedStreamStage`]: what the look-through methods
/// below see through (besides a [`BoxedStage`]).
fn boxed<St: 'static, P: Payload + 'static>(any: &dyn Any) -> Option<&dyn DynStreamStage<St, P>> {
    let inner = any.downcast_ref::<BoxedStreamStage<St, P>>()?;
    Some(&**inner)
}

impl<St, P, S> DynStreamStage<St, P> for S
where
    St: 'static,
    P: Payload + 'static,
    S: StreamStage<St, P> + 'static,
    S::Stash: 'static,
{
    fn forward_dyn(&mut self, on: &St, input: P) -> Result<(P, AnyStash), StageError> {
        let (output, stash) = self.forward(on, input)?;
        Ok((output, Box::new(stash)))
    }

    fn backward_input_dyn(
        &mut self,
        on: &St,
        stash: &mut AnyStash,
        grad_output: P,
    ) -> Result<P, StageError> {
        let stash = stash
            .downcast_mut::<S::Stash>()
            .ok_or_else(wrong_stash::<S>)?;
        self.backward_input(on, stash, grad_output)
    }

    fn backward_weight_dyn(&mut self, on: &St, stash: AnyStash) -> Result<(), StageError> {
        self.backward_weight(on, stash_of::<S, S::Stash>(stash)?)
    }

    fn backward_dyn(&mut self, on: &St, stash: AnyStash, grad_output: P) -> Result<P, StageError> {
        self.backward(on, stash_of::<S, S::Stash>(stash)?, grad_output)
    }

    fn held_bytes_dyn(&self, stash: &AnyStash) -> usize {
        stash
            .downcast_ref::<S::Stash>()
            .map_or(0, |s| self.held_bytes(s))
    }

    fn shrink_dyn(&mut self, on: &St, stash: &mut AnyStash) -> Result<bool, StageError> {
        let stash = stash
            .downcast_mut::<S::Stash>()
            .ok_or_else(wrong_stash::<S>)?;
        self.shrink(on, stash)
    }

    fn rebuild_dyn(&mut self, on: &St, stash: &mut AnyStash) -> Result<(), StageError> {
        let stash = stash
            .downcast_mut::<S::Stash>()
            .ok_or_else(wrong_stash::<S>)?;
        self.rebuild(on, stash)
    }

    fn zero_grad_dyn(&mut self, on: &St) {
        self.zero_grad(on);
    }

    fn optimizer_step_dyn(&mut self, on: &St) -> Result<(), StageError> {
        self.optimizer_step(on)
    }

    fn gradients_dyn(&mut self) -> Vec<&mut [f32]> {
        self.gradients()
    }

    fn with_gradients_dyn(&mut self, on: &St, f: &mut GradientsFn<'_>) -> Result<(), StageError> {
        self.with_gradients(on, f)
    }

    // A `BoxedStage` is itself a `Stage` and a `BoxedStreamStage` a `StreamStage`, so they meet
    // this impl too (when a method is called on the box rather than on the trait object, or a
    // boxed stage is boxed again): these three look through them to the concrete stage.
    fn stage_type_dyn(&self) -> &'static str {
        let any = self as &dyn Any;
        if let Some(inner) = any.downcast_ref::<BoxedStage>() {
            return (**inner).stage_type_dyn();
        }
        boxed::<St, P>(any).map_or_else(type_name::<S>, |inner| inner.stage_type_dyn())
    }

    fn as_any_dyn(&self) -> &dyn Any {
        let any = self as &dyn Any;
        if let Some(inner) = any.downcast_ref::<BoxedStage>() {
            return (**inner).as_any_dyn();
        }
        boxed::<St, P>(any).map_or(any, |inner| inner.as_any_dyn())
    }

    fn as_any_mut_dyn(&mut self) -> &mut dyn Any {
        // Checked first, then downcast: returning `self` after a failed `downcast_mut` would
        // keep the borrow alive (the borrow checker cannot tell the paths apart).
        let any = self as &dyn Any;
        let (stage_box, stream_box) = (any.is::<BoxedStage>(), any.is::<BoxedStreamStage<St, P>>());
        if !stage_box && !stream_box {
            return self;
        }
        let any = self as &mut dyn Any;
        if stage_box {
            match any.downcast_mut::<BoxedStage>() {
                Some(inner) => (**inner).as_any_mut_dyn(),
                None => unreachable!("`is` just found a boxed stage"),
            }
        } else {
            match any.downcast_mut::<BoxedStreamStage<St, P>>() {
                Some(inner) => (**inner).as_any_mut_dyn(),
                None => unreachable!("`is` just found a boxed stream stage"),
            }
        }
    }
}

/// The inherent methods of a boxed stage's trait object: back to the concrete type.
macro_rules! downcasts {
    ([$($generics:tt)*] $object:ty) => {
        impl<$($generics)*> $object {
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
    };
}

downcasts!([] dyn DynStage);
downcasts!([St: 'static, P: Payload + 'static] dyn DynStreamStage<St, P>);

// The calls go through `**self` (the boxed stage): on the box itself they would reach the blanket
// `DynStreamStage` impl again.
impl Stage for BoxedStage {
    type Stash = AnyStash;

    fn forward(&mut self, input: Tensor) -> Result<(Tensor, AnyStash), StageError> {
        (**self).forward_dyn(&(), input)
    }

    fn backward_input(
        &mut self,
        stash: &mut AnyStash,
        grad_output: Tensor,
    ) -> Result<Tensor, StageError> {
        (**self).backward_input_dyn(&(), stash, grad_output)
    }

    fn backward_weight(&mut self, stash: AnyStash) -> Result<(), StageError> {
        (**self).backward_weight_dyn(&(), stash)
    }

    fn backward(&mut self, stash: AnyStash, grad_output: Tensor) -> Result<Tensor, StageError> {
        (**self).backward_dyn(&(), stash, grad_output)
    }

    fn held_bytes(&self, stash: &AnyStash) -> usize {
        (**self).held_bytes_dyn(stash)
    }

    fn shrink(&mut self, stash: &mut AnyStash) -> Result<bool, StageError> {
        (**self).shrink_dyn(&(), stash)
    }

    fn rebuild(&mut self, stash: &mut AnyStash) -> Result<(), StageError> {
        (**self).rebuild_dyn(&(), stash)
    }

    fn zero_grad(&mut self) {
        (**self).zero_grad_dyn(&());
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        (**self).optimizer_step_dyn(&())
    }

    fn gradients(&mut self) -> Vec<&mut [f32]> {
        (**self).gradients_dyn()
    }
}

/// Declares [`BoxedStreamStage`]`<$stream, $payload>` a [`StreamStage`] on streams `$stream` with
/// payloads `$payload`: once per device, in the crate that defines the device's stream or payload
/// type (the host crate does it for `CpuStreams`, `pipefill-cuda` for the CUDA streams). A blanket
/// implementation cannot: every host `Stage` is already a `StreamStage`, and a crate downstream
/// could make a box one.
#[macro_export]
macro_rules! boxed_stream_stage {
    ($stream:ty, $payload:ty) => {
        impl $crate::runtime::streams::StreamStage<$stream, $payload>
            for $crate::runtime::BoxedStreamStage<$stream, $payload>
        {
            type Stash = $crate::runtime::AnyStash;

            fn forward(
                &mut self,
                on: &$stream,
                input: $payload,
            ) -> Result<($payload, Self::Stash), $crate::runtime::StageError> {
                $crate::runtime::DynStreamStage::forward_dyn(&mut **self, on, input)
            }

            fn backward_input(
                &mut self,
                on: &$stream,
                stash: &mut Self::Stash,
                grad_output: $payload,
            ) -> Result<$payload, $crate::runtime::StageError> {
                $crate::runtime::DynStreamStage::backward_input_dyn(
                    &mut **self,
                    on,
                    stash,
                    grad_output,
                )
            }

            fn backward_weight(
                &mut self,
                on: &$stream,
                stash: Self::Stash,
            ) -> Result<(), $crate::runtime::StageError> {
                $crate::runtime::DynStreamStage::backward_weight_dyn(&mut **self, on, stash)
            }

            fn backward(
                &mut self,
                on: &$stream,
                stash: Self::Stash,
                grad_output: $payload,
            ) -> Result<$payload, $crate::runtime::StageError> {
                $crate::runtime::DynStreamStage::backward_dyn(&mut **self, on, stash, grad_output)
            }

            fn held_bytes(&self, stash: &Self::Stash) -> usize {
                $crate::runtime::DynStreamStage::held_bytes_dyn(&**self, stash)
            }

            fn shrink(
                &mut self,
                on: &$stream,
                stash: &mut Self::Stash,
            ) -> Result<bool, $crate::runtime::StageError> {
                $crate::runtime::DynStreamStage::shrink_dyn(&mut **self, on, stash)
            }

            fn rebuild(
                &mut self,
                on: &$stream,
                stash: &mut Self::Stash,
            ) -> Result<(), $crate::runtime::StageError> {
                $crate::runtime::DynStreamStage::rebuild_dyn(&mut **self, on, stash)
            }

            fn zero_grad(&mut self, on: &$stream) {
                $crate::runtime::DynStreamStage::zero_grad_dyn(&mut **self, on)
            }

            fn optimizer_step(&mut self, on: &$stream) -> Result<(), $crate::runtime::StageError> {
                $crate::runtime::DynStreamStage::optimizer_step_dyn(&mut **self, on)
            }

            fn gradients(&mut self) -> Vec<&mut [f32]> {
                $crate::runtime::DynStreamStage::gradients_dyn(&mut **self)
            }

            fn with_gradients(
                &mut self,
                on: &$stream,
                f: &mut $crate::runtime::streams::GradientsFn<'_>,
            ) -> Result<(), $crate::runtime::StageError> {
                $crate::runtime::DynStreamStage::with_gradients_dyn(&mut **self, on, f)
            }
        }
    };
}
