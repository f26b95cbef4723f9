//! The chain dynamic programme: the exact minimum of the largest stage cost over contiguous splits,
//! when every rank holds one stage (or when only stage costs matter).

use super::{Layout, MemoryLimit, PartitionError, Problem};

/// Exact minimum over splits of the largest stage cost, for layouts where every rank holds one
/// stage; returns the lexicographically smallest optimal boundaries.
///
/// `best[s][a]`: the smallest bottleneck of layers `a..L` in stages `s..S`. Reconstruction walks
/// forward taking the first end that keeps the optimum, which gives the lexicographically smallest
/// boundary list among optimal ones.
pub(super) fn chain_optimum(
    problem: &Problem,
    layout: &Layout,
    limit: Option<&MemoryLimit>,
) -> Result<Vec<usize>, PartitionError> {
    let n = problem.layers();
    let s_count = layout.stages();
    // Cost of stage s on layers a..b, or None when it breaks the memory limit.
    let cost = |s: usize, a: usize, b: usize| -> Option<u64> {
        if let Some(l) = limit {
            if problem.stage_memory(&l.holds, s, a, b) > l.bytes_per_rank {
                return None;
            }
        }
        Some(problem.stage_cost(layout, s, a, b))
    };
    let best = chain_table(n, s_count, cost);
    let opt = best[0][0];
    if opt == UNREACHABLE {
        let limit_bytes = limit.map(|l| l.bytes_per_rank).unwrap_or(0);
        return Err(PartitionError::MemoryInfeasible {
            stages: s_count,
            limit: limit_bytes,
            needed: limit.map(|l| min_peak_memory(problem, l)).unwrap_or(0),
        });
    }
    let mut boundaries = vec![0usize];
    let mut a = 0;
    for s in 0..s_count {
        let remaining = s_count - s;
        let b = ((a + 1)..=(n - (remaining - 1)))
            .find(|&b| cost(s, a, b).is_some_and(|c| c.max(best[s + 1][b]) <= opt))
            .unwrap_or(n);
        boundaries.push(b);
        a = b;
    }
    Ok(boundaries)
}

/// Marks a state of [`chain_table`] that no split reaches.
const UNREACHABLE: u64 = u64::MAX;

/// `table[s][a]`: the smallest possible largest `cost(s', a', b')` over splits of layers `a..n` into
/// stages `s..stages` (every stage at least one layer), where `cost` returns `None` for a stage that is
/// not allowed; [`UNREACHABLE`] when no split exists.
fn chain_table(
    n: usize,
    stages: usize,
    cost: impl Fn(usize, usize, usize) -> Option<u64>,
) -> Vec<Vec<u64>> {
    let mut table = vec![vec![UNREACHABLE; n + 1]; stages + 1];
    table[stages][n] = 0;
    for s in (0..stages).rev() {
        let remaining = stages - s; // stages s..stages, each needs a layer
        if n < remaining {
            continue;
        }
        let (head, tail) = table.split_at_mut(s + 1);
        let next = &tail[0];
        for (a, slot) in head[s]
            .iter_mut()
            .enumerate()
            .take(n - remaining + 1)
            .skip(s)
        {
            *slot = next
                .iter()
                .enumerate()
                .take(n - remaining + 2)
                .skip(a + 1)
                .filter(|(_, rest)| **rest != UNREACHABLE)
                .filter_map(|(b, &rest)| cost(s, a, b).map(|c| c.max(rest)))
                .min()
                .unwrap_or(UNREACHABLE);
        }
    }
    table
}

/// The smallest largest per-stage memory over all splits with one stage per rank (exact; used to tell
/// the user which limit would work).
pub(super) fn min_peak_memory(problem: &Problem, limit: &MemoryLimit) -> u64 {
    let table = chain_table(problem.layers(), limit.holds.stages(), |s, a, b| {
        Some(problem.stage_memory(&limit.holds, s, a, b))
    });
    table[0][0]
}
