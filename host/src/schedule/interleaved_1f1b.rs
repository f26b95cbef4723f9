//! The `interleaved-1f1b` family: Megatron-LM's interleaved schedule over virtual stages (Narayanan et
//! al. 2021), PyTorch pipelining's `ScheduleInterleaved1F1B`.
//!
//! Looped placement: rank `r` holds chunks `c = 0..V`, chunk `c` being global stage `c * P + r`.
//! Each rank walks a sequence of `V * M` *virtual microbatches*, built as Megatron-Core's schedule
//! table: microbatches are taken in groups of `G` (the group size, default `P`); within a group, every
//! microbatch of the group goes through chunk 0, then through chunk 1, and so on; the last group takes
//! whatever microbatches remain (so `M` need not be a multiple of `P`). Forward virtual microbatch `i`
//! is `(table[i].microbatch, chunk table[i].chunk)`; backward virtual microbatch `i` is the same
//! microbatch on chunk `V - 1 - table[i].chunk`.
//!
//! Rank `r` runs `w = min(V*M, 2*(P - r - 1) + (V - 1) * G)` warm-up forwards, then alternates one
//! forward and one backward, then drains the backwards, exactly as Megatron-Core. With `G = P` and
//! `M` a multiple of `P` this is also PyTorch's order (PyTorch's "microbatches per round" is `G`).
//!
//! Megatron asks `P <= G <= M` and that the last group be empty or hold at least `P` microbatches.
//! When every group (the first and the last) holds at least `P` microbatches the order never deadlocks
//! (checked exhaustively for `P <= 16`, `V <= 4`, `M <= 64`, `G <= 20` while writing this, and by the
//! property tests), and the generator returns it directly. Otherwise some orders still run (with
//! dependency bubbles, which the simulator shows) and some deadlock: the generator then runs the
//! dependency dry run of [`validate`], returns the order if it completes,
//! and refuses it if it deadlocks, naming the group sizes that work.

use super::families::Family;
use super::validate::validate;
use super::{Action, Item, Op, Params, Placement, Schedule, ScheduleError};

/// The `interleaved-1f1b` family as [`FAMILIES`](super::families::FAMILIES) lists it: its name and default
/// `V` are written here only.
pub const FAMILY: Family = Family {
    name: "interleaved-1f1b",
    placement: Placement::Looped,
    splits_iw: false,
    overlaps: false,
    default_chunks: 2,
    constraints: "V >= 2; P >= 1, M >= 1; group size G >= 1 (default P)",
    summary: "Megatron's interleaved 1F1B over virtual stages",
    generate,
};

/// Generates an `interleaved-1f1b` schedule; refuses `P = 0`, `M = 0`, `V < 2`, `G = 0`, and
/// orders that deadlock (naming the group sizes that work).
pub fn generate(p: &Params) -> Result<Schedule, ScheduleError> {
    let v = p.checked(FAMILY.name, FAMILY.default_chunks, 2..=usize::MAX)?;
    let g = p.group_size.unwrap_or(p.ranks);
    if g == 0 {
        return Err(ScheduleError::refused(
            FAMILY.name,
            format!(
                "group size G must be at least 1; the default is P = {}",
                p.ranks
            ),
        ));
    }
    let (ranks, m) = (p.ranks, p.microbatches);
    let s = build(ranks, v, m, g);
    if groups_hold_p(ranks, m, g) {
        return Ok(s);
    }
    match validate(&s) {
        Ok(_) => Ok(s),
        Err(ScheduleError::Deadlock { .. }) => Err(ScheduleError::refused(
            FAMILY.name,
            format!(
                "group size G = {g} deadlocks with P = {ranks}, M = {m} (groups of {} and a last \
                 group of {} microbatches, fewer than P); {}",
                g.min(m),
                last_group(m, g),
                what_works(ranks, m)
            ),
        )),
        Err(e) => Err(e),
    }
}

/// Microbatches in the last group.
fn last_group(m: usize, g: usize) -> usize {
    match m % g {
        0 => g.min(m),
        rest => rest,
    }
}

/// Whether every group holds at least `P` microbatches (Megatron's condition; never deadlocks).
fn groups_hold_p(ranks: usize, m: usize, g: usize) -> bool {
    g.min(m) >= ranks && last_group(m, g) >= ranks
}

/// The advice in a refusal: group sizes that satisfy [`groups_hold_p`].
fn what_works(ranks: usize, m: usize) -> String {
    if m < ranks {
        return format!("use M >= P = {ranks} microbatches (with G = P), or the `1f1b` family");
    }
    let ok: Vec<String> = (ranks..=m)
        .filter(|&g| groups_hold_p(ranks, m, g))
        .take(6)
        .map(|g| g.to_string())
        .collect();
    format!(
        "use a group size G with P <= G <= M whose last group is full or holds at least P \
         microbatches, e.g. G in {{{}}}",
        ok.join(", ")
    )
}

/// Megatron-Core's schedule table: `(microbatch, chunk)` per virtual microbatch.
pub(crate) fn schedule_table(m: usize, v: usize, g: usize) -> Vec<(usize, usize)> {
    (0..m)
        .step_by(g)
        .flat_map(|first| {
            let last = (first + g).min(m);
            (0..v).flat_map(move |c| (first..last).map(move |k| (k, c)))
        })
        .collect()
}

/// Builds the order for `P` ranks, `V` chunks, `M` microbatches and group size `G`.
fn build(ranks: usize, v: usize, m: usize, g: usize) -> Schedule {
    let table = schedule_table(m, v, g);
    let actions = (0..ranks)
        .map(|r| rank_list(r, ranks, v, g, &table))
        .collect();
    Schedule::looped(FAMILY.name, ranks, v, m, actions)
}

/// Rank `r`'s list: warm-up forwards, steady one-forward-one-backward, cool-down backwards.
fn rank_list(r: usize, ranks: usize, v: usize, g: usize, table: &[(usize, usize)]) -> Vec<Item> {
    let total = table.len();
    let fwd = |i: usize| {
        let (k, c) = table[i];
        Item::One(Action::new(Op::F, c * ranks + r, k))
    };
    let bwd = |i: usize| {
        let (k, c) = table[i];
        Item::One(Action::new(Op::B, (v - 1 - c) * ranks + r, k))
    };
    let warmup = (2 * (ranks - r - 1))
        .saturating_add((v - 1).saturating_mul(g))
        .min(total);
    let steady = total - warmup;
    let mut list: Vec<Item> = (0..warmup).map(fwd).collect();
    for i in 0..steady {
        list.push(fwd(warmup + i));
        list.push(bwd(i));
    }
    list.extend((steady..total).map(bwd));
    list
}
