#![warn(missing_docs)]
#![forbid(unsafe_code)]
//! # pipefill-host
//!
//! The engine a trainer embeds to remove pipeline bubbles. Data flows one way:
//!
//! ```text
//! model + device --profile--> cost model --partition--> stages --schedule--> actions
//!       --sim--> predicted timeline          --runtime--> measured timeline --trace--> JSON / SVG / table
//! ```
//!
//! - [`schedule`]: the schedule IR (actions per rank), one generator per schedule family, validation and
//!   the text / CSV / JSON formats.
//! - [`cost`]: per-stage and per-layer costs, and the cost file.
//! - [`sim`]: the discrete-event simulator (schedule + cost model -> [`timeline::Timeline`]).
//! - [`auto`]: the automatic scheduler, a schedule solved for measured costs and a memory limit; it
//!   scores its candidates with the simulator, so it sits above [`sim`] (the schedule layer below
//!   imports neither the simulator nor the cost model).
//! - [`timeline`]: start/end of every action on every rank, predicted or measured.
//! - [`trace`]: timelines as Chrome trace JSON, SVG and terminal charts.
//! - [`partition`]: layers + measured costs -> stages.
//! - [`profile`]: measuring per-layer costs on a device.
//! - [`plan`]: searching partition x schedule x V x M.
//! - [`runtime`]: executing any valid schedule on real devices.
//!
//! What depends on what, and what each action holds in memory, is defined once, in
//! [`schedule::deps`]; [`schedule::lower`] turns it into explicit sends and receives, and the
//! validator, the simulator and the runtime all read it from there.
//!
//! # End to end: generate, validate, simulate, run a step
//!
//! ```
//! use pipefill_host::cost::{CostModel, LinkCost, StageCost};
//! use pipefill_host::runtime::{Executor, Stage, StageError, Tensor};
//! use pipefill_host::schedule::{families, lower::lower, validate::validate, Params};
//! use pipefill_host::sim::simulate;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 1. A zero-bubble schedule for 2 ranks and 4 microbatches, checked.
//! let schedule = families::generate("zb-h1", &Params::new(2, 4))?;
//! let report = validate(&schedule)?;
//! assert_eq!(report.peak_in_flight.len(), 2);
//! // Its lowered form carries the sends and receives between the ranks.
//! let with_transfers = lower(&schedule)?;
//! assert!(with_transfers.actions[0].iter().any(|it| it.to_string() == "0SEND_F0"));
//!
//! // 2. Predicted: F = 1, I = 1, W = 1 per stage, no link cost.
//! let costs = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 2, LinkCost::default());
//! let predicted = simulate(&schedule, &costs)?;
//! assert!(predicted.timeline.bubble_fraction() < 0.2);
//!
//! // 3. Run for real: a stage that scales by a learnable factor `w` (y = w x).
//! struct Scale { w: f32, grad: f32 }
//! impl Stage for Scale {
//!     type Stash = (Tensor, Option<Tensor>); // x, and dy after I
//!     fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
//!         let mut y = x.clone();
//!         y.scale(self.w);
//!         Ok((y, (x, None)))
//!     }
//!     fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
//!         let mut dx = dy.clone();
//!         dx.scale(self.w);
//!         st.1 = Some(dy);
//!         Ok(dx)
//!     }
//!     fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
//!         let dy = st.1.ok_or_else(|| StageError::new("W before I"))?;
//!         self.grad += st.0.data().iter().zip(dy.data()).map(|(x, d)| x * d).sum::<f32>();
//!         Ok(())
//!     }
//!     fn held_bytes(&self, st: &Self::Stash) -> usize { st.0.bytes() }
//!     fn zero_grad(&mut self) { self.grad = 0.0; }
//!     fn optimizer_step(&mut self) -> Result<(), StageError> { self.w -= 0.1 * self.grad; Ok(()) }
//! }
//! let stages = vec![Scale { w: 1.0, grad: 0.0 }, Scale { w: 1.0, grad: 0.0 }];
//! let mut executor = Executor::new(schedule, stages)?;
//! let loss = |y: &Tensor, t: &Tensor| -> Result<(f32, Tensor), StageError> {
//!     let d: Vec<f32> = y.data().iter().zip(t.data()).map(|(a, b)| a - b).collect();
//!     Ok((0.5 * d.iter().map(|v| v * v).sum::<f32>(), Tensor::new(y.shape().to_vec(), d)?))
//! };
//! let one = |v: f32| Tensor::new(vec![1, 1], vec![v]);
//! let inputs = (0..4).map(|_| one(1.0)).collect::<Result<Vec<_>, _>>()?;
//! let targets = (0..4).map(|_| one(2.0)).collect::<Result<Vec<_>, _>>()?;
//! let step = executor.step(inputs, &targets, &loss)?;
//! assert_eq!(step.loss, 0.5); // (1 * 1 * 1 - 2)^2 / 2
//! executor.optimizer_step()?; // the step left the gradients ready; the trainer applies them
//! // The measured timeline has the simulator's shape: one span per item on each rank.
//! assert_eq!(step.timeline.spans[1].len(), predicted.timeline.spans[1].len());
//! # Ok(())
//! # }
//! ```

pub mod auto;
pub mod cost;
pub mod cpu_time;
pub mod input;
pub mod named;
pub mod partition;
pub mod plan;
pub mod profile;
pub mod runtime;
pub mod schedule;
pub mod sim;
pub mod timeline;
pub mod trace;
