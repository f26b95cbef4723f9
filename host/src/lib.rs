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
//! - [`timeline`]: start/end of every action on every rank, predicted or measured.
//! - [`trace`]: timelines as Chrome trace JSON, SVG and terminal charts.
//! - [`partition`]: layers + measured costs -> stages.
//! - [`profile`]: measuring per-layer costs on a device.
//! - [`plan`]: searching partition x schedule x V x M.
//! - [`runtime`]: executing any valid schedule on real devices.

pub mod cost;
pub mod partition;
pub mod plan;
pub mod profile;
pub mod runtime;
pub mod schedule;
pub mod sim;
pub mod timeline;
pub mod trace;
