//! The list of schedule families. Adding a family is one new file in this folder plus one entry here.

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
    Family {
        name: "gpipe",
        placement: Placement::Looped,
        splits_iw: false,
        overlaps: false,
        default_chunks: 1,
        constraints: "V = 1; P >= 1, M >= 1",
        summary: "all forwards, then all backwards (GPipe)",
        generate: super::gpipe::generate,
    },
    Family {
        name: "1f1b",
        placement: Placement::Looped,
        splits_iw: false,
        overlaps: false,
        default_chunks: 1,
        constraints: "V = 1; P >= 1, M >= 1",
        summary: "one forward one backward, PipeDream-flush / Megatron non-interleaved",
        generate: super::one_f_one_b::generate,
    },
    Family {
        name: "interleaved-1f1b",
        placement: Placement::Looped,
        splits_iw: false,
        overlaps: false,
        default_chunks: 2,
        constraints: "V >= 2; P >= 1, M >= 1; group size G >= 1 (default P)",
        summary: "Megatron's interleaved 1F1B over virtual stages",
        generate: super::interleaved_1f1b::generate,
    },
    Family {
        name: "looped-bfs",
        placement: Placement::Looped,
        splits_iw: false,
        overlaps: false,
        default_chunks: 2,
        constraints: "V >= 1; P >= 1, M >= 1",
        summary:
            "breadth-first looped schedule: every microbatch through a local stage before the next",
        generate: super::looped_bfs::generate,
    },
    Family {
        name: "zb-h1",
        placement: Placement::Looped,
        splits_iw: true,
        overlaps: false,
        default_chunks: 1,
        constraints: "V = 1; P >= 1, M >= 1",
        summary: "handcrafted zero-bubble, 1F1B's peak memory",
        generate: super::zb_h1::generate,
    },
    Family {
        name: "zb-h2",
        placement: Placement::Looped,
        splits_iw: true,
        overlaps: false,
        default_chunks: 1,
        constraints: "V = 1; P >= 1, M >= 1 (no bubble with F = I = W needs M >= 2P-1)",
        summary: "handcrafted zero-bubble, up to 2P-1 in flight, no bubble when F = I = W",
        generate: super::zb_h2::generate,
    },
    Family {
        name: "interleaved-zb",
        placement: Placement::Looped,
        splits_iw: true,
        overlaps: false,
        default_chunks: 2,
        constraints:
            "V >= 2; P >= 1, M >= 1, M a multiple of max(1, M / G); group size G >= P (default P)",
        summary: "zero-bubble on looped placement (PyTorch InterleavedZeroBubble / ZB1P)",
        generate: super::interleaved_zb::generate,
    },
    Family {
        name: "zbv",
        placement: Placement::Vshape,
        splits_iw: true,
        overlaps: false,
        default_chunks: 2,
        constraints: "V = 2; P >= 1, M >= 1",
        summary: "ZB-V on V-shape placement",
        generate: super::zbv::generate,
    },
    Family {
        name: "dualpipev",
        placement: Placement::Vshape,
        splits_iw: true,
        overlaps: true,
        default_chunks: 2,
        constraints: "V = 2; P >= 1, M >= 2P",
        summary: "DualPipeV on V-shape placement with overlapped F/B pairs",
        generate: super::dualpipev::generate,
    },
];

/// Looks a family up by name.
pub fn family(name: &str) -> Result<&'static Family, ScheduleError> {
    FAMILIES
        .iter()
        .find(|f| f.name == name)
        .ok_or_else(|| ScheduleError::UnknownFamily(name.to_string()))
}

/// Generates a schedule of the named family.
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
