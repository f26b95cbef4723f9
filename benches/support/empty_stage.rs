//! A stage that does nothing, and a loss that costs nothing: what is left of a step is the executor
//! itself. Shared by the benches that measure the executor's overhead (`runtime`, `instructions`);
//! include it with `#[path = "support/empty_stage.rs"] mod empty_stage;`.

use pipefill_host::runtime::{Stage, StageError, Tensor};

/// A stage whose forward and backward hand their input on unchanged and keep nothing.
pub struct Empty;

impl Stage for Empty {
    type Stash = ();

    fn forward(&mut self, input: Tensor) -> Result<(Tensor, ()), StageError> {
        Ok((input, ()))
    }

    fn backward_input(&mut self, _: &mut (), grad: Tensor) -> Result<Tensor, StageError> {
        Ok(grad)
    }

    fn backward_weight(&mut self, _: ()) -> Result<(), StageError> {
        Ok(())
    }

    fn held_bytes(&self, _: &()) -> usize {
        0
    }

    fn zero_grad(&mut self) {}

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        Ok(())
    }
}

/// A loss of zero with an empty gradient.
pub fn zero_loss(_: &Tensor, _: &Tensor) -> Result<(f32, Tensor), StageError> {
    Ok((0.0, Tensor::empty()))
}
