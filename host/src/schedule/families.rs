//! The list of schedule families. Adding a family is one new file in this folder, which states the
//! family once as its `FAMILY` constant (name, default `V`, generator, ...), plus one entry here.

use super::{Params, Placement, Schedule, ScheduleError};

/// A schedule family: its name, what it needs and its generator.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// Name used on the command line and in files (`1f1b`, `zbv`, ...).
    pub name: &'static str,
    /// Where its stages sit.
    pub placement: Placement,
    /// Whether it splits backward into `I` and `W`.
    pub splits_iw: bool,
    /// Whether it uses overlapped forward/backward pairs.
    pub overlaps: bool,
    /// `V` used when none is given.
    pub default_chunks: usize,
    /// Human-readable constraints (shown by `pipefill schedule --list`).
    pub constraints: &'static str,
    /// One-line description.
    pub summary: &'static str,
    /// The generator.
    pub generate: fn(&Params) -> Result<Schedule, ScheduleError>,
}

/// Every family pipefill knows, in the order `--list` shows them.
pub const FAMILIES: &[Family] = &[
    super::gpipe::FAMILY,
    super::one_f_one_b::FAMILY,
    super::interleaved_1f1b::FAMILY,
    super::looped_bfs::FAMILY,
    super::zb_h1::FAMILY,
    super::zb_h2::FAMILY,
    super::interleaved_zb::FAMILY,
    super::zbv::FAMILY,
    super::dualpipev::FAMILY,
    super::dualpipev_slack::FAMILY,
    super::v_half::FAMILY,
    super::v_min::FAMILY,
];

/// The name of automatic schedules (`crate::auto`, one layer up: solved for costs, not generated
/// from a shape). Listed here, with the families, so that every command takes the one name.
pub const AUTO: &str = "auto";

/// Looks a family up by name. `auto` is refused with [`ScheduleError::AutoNeedsCosts`], which
/// names the entry point that makes any schedule name, `auto` included, given costs
/// (`pipefill_host::plan::generate`, a layer above: this module imports neither `auto` nor `sim`).
///
/// ```
/// use pipefill_host::schedule::{families, ScheduleError};
/// assert_eq!(families::family("zbv").unwrap().name, "zbv");
/// assert!(matches!(families::family("auto"), Err(ScheduleError::AutoNeedsCosts)));
/// ```
pub fn family(name: &str) -> Result<&'static Family, ScheduleError> {
    if name == AUTO {
        return Err(ScheduleError::AutoNeedsCosts);
    }
    FAMILIES
        .iter()
        .find(|f| f.name == name)
        .ok_or_else(|| ScheduleError::UnknownFamily {
            name: name.to_string(),
            known: FAMILIES
                .iter()
                .map(|f| f.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Generates a schedule of the named family (`auto`: see [`family`]; `pipefill_host::plan::generate`
/// makes any name, `auto` included, given costs).
///
/// ```
/// use pipefill_host::schedule::{families, Params};
/// # fn main() -> Result<(), pipefill_host::schedule::ScheduleError> {
/// let s = families::generate("gpipe", &Params::new(2, 2))?;
/// assert_eq!(s.ranks, 2);
/// # Ok(())
/// # }
/// ```
pub fn generate(name: &str, params: &Params) -> Result<Schedule, ScheduleError> {
    (family(name)?.generate)(params)
}
