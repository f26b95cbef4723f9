//! The V-shape grid of `pipefill bench auto --part vshape`: `auto` on `V = 2` V-shape placement
//! against every V-shape family that fits the same memory limit and against the lower bound, for
//! both objectives, at the zero-bubble authors' three memory settings.

use pipefill_host::auto::{AutoRequest, MemoryLimit, Objective};
use pipefill_host::schedule::Placement;
use serde::Serialize;

use super::grid::{costs, solve_timed, FamilyRatio, Instance, Solved, RATIOS};
use crate::cli::CliError;

/// One row: one instance and one objective.
#[derive(Debug, Clone, Serialize)]
pub struct VRow {
    /// `P`.
    pub ranks: usize,
    /// `M`.
    pub microbatches: usize,
    /// `F:I:W` of one rank (each chunk half of it).
    pub ratio: &'static str,
    /// Transfer time as a share of a rank's `F`.
    pub transfer: f64,
    /// `half` (V-Half's `P/2`), `1f1b` (`P`) or `2x` (`2P`).
    pub limit_name: &'static str,
    /// The limit, microbatches in flight per rank (each chunk counts 1/2).
    pub limit: f64,
    /// What was minimised.
    pub objective: Objective,
    /// The lower bound (the proven optimum when `proven_optimal`).
    pub lower_bound: f64,
    /// `auto`'s objective.
    pub auto: f64,
    /// `auto` / the lower bound.
    pub auto_ratio: f64,
    /// Whether `auto` is proven optimal.
    pub proven_optimal: bool,
    /// Where `auto`'s schedule came from.
    pub origin: String,
    /// The V-shape families that fit the limit: objective / bound.
    pub families: Vec<FamilyRatio>,
    /// The best of them, if any fits.
    pub best_family: Option<FamilyRatio>,
    /// Wall seconds of the solve.
    pub seconds: f64,
}

/// The aims over the V-shape grid.
#[derive(Debug, Clone, Serialize)]
pub struct VSummary {
    /// Rows (instances times objectives).
    pub rows: usize,
    /// Rows where `auto` is worse than the best fitting family (the aim: 0).
    pub worse_than_a_family: usize,
    /// Mean `auto / bound`.
    pub mean_ratio: f64,
    /// Largest `auto / bound`.
    pub max_ratio: f64,
    /// Rows whose limit allows `2P - 1` in flight (twice 1F1B's memory).
    pub wide_limit: usize,
    /// Of those, rows within 2 % of the lower bound (the aim: all).
    pub wide_within_2_percent: usize,
    /// Rows proven optimal.
    pub proven_optimal: usize,
    /// Rows longer than the same instance and objective under a smaller limit of the grid (the
    /// aim: 0; more memory never gives a worse schedule).
    pub worse_with_more_memory: usize,
    /// Span rows whose span is above the makespan row's makespan on the same instance (the aim: 0;
    /// the makespan run's schedule has a span no longer than its makespan, so asking for the span
    /// should never give a longer one).
    pub span_above_makespan_run: usize,
    /// The longest solve, seconds.
    pub max_seconds: f64,
}

/// The V-shape grid's rows and summary.
#[derive(Debug, Clone, Serialize)]
pub struct VReport {
    /// One row per instance and objective.
    pub rows: Vec<VRow>,
    /// The aims.
    pub summary: VSummary,
}

/// The instances: `P` 4, 8, 16; `M` `P`, `2P`, `4P`; three ratios; transfers 0 and 0.1 `F`; limits
/// `P/2`, `P`, `2P` (a few with `quick`).
fn instances(quick: bool) -> Vec<Instance> {
    let ranks: &[usize] = if quick { &[4] } else { &[4, 8, 16] };
    let mut out = Vec::new();
    for &p in ranks {
        let ms = if quick {
            vec![2 * p]
        } else {
            vec![p, 2 * p, 4 * p]
        };
        let ratios = if quick { &RATIOS[..1] } else { &RATIOS[..] };
        let transfers: &[f64] = if quick { &[0.1] } else { &[0.0, 0.1] };
        let pf = p as f64;
        for &m in &ms {
            for &ratio in ratios {
                for &transfer in transfers {
                    for limit in [("half", pf / 2.0), ("1f1b", pf), ("2x", 2.0 * pf)] {
                        out.push(Instance {
                            ranks: p,
                            microbatches: m,
                            ratio,
                            transfer,
                            uneven: false,
                            placement: Placement::Vshape,
                            limit,
                        });
                    }
                }
            }
        }
    }
    out
}

/// Solves one instance for one objective.
fn row(inst: &Instance, objective: Objective, budget: f64, seed: u64) -> Result<VRow, CliError> {
    let req = AutoRequest::new(inst.ranks, inst.microbatches, costs(inst))
        .with_chunks(2, Placement::Vshape)
        .with_limit(MemoryLimit::InFlight(inst.limit.1))
        .with_objective(objective)
        .with_budget(budget, seed);
    let Solved {
        solver: s,
        seconds,
        families,
        best_family,
    } = solve_timed(&req)?;
    let lb = s.lower_bound;
    Ok(VRow {
        ranks: inst.ranks,
        microbatches: inst.microbatches,
        ratio: inst.ratio.0,
        transfer: inst.transfer,
        limit_name: inst.limit.0,
        limit: inst.limit.1,
        objective,
        lower_bound: lb,
        auto: s.value,
        auto_ratio: s.value / lb,
        proven_optimal: s.proven_optimal,
        origin: s.origin,
        families,
        best_family,
        seconds,
    })
}

/// Runs the V-shape grid.
pub fn run(quick: bool, budget: f64, seed: u64) -> Result<VReport, CliError> {
    let mut rows = Vec::new();
    for inst in instances(quick) {
        for objective in [Objective::Makespan, Objective::Span] {
            rows.push(row(&inst, objective, budget, seed)?);
        }
    }
    let n = rows.len().max(1) as f64;
    let wide: Vec<&VRow> = rows
        .iter()
        .filter(|r| r.limit >= 2.0 * r.ranks as f64 - 1.0)
        .collect();
    let summary = VSummary {
        rows: rows.len(),
        worse_than_a_family: rows
            .iter()
            .filter(|r| {
                r.best_family
                    .as_ref()
                    .is_some_and(|b| r.auto_ratio > b.ratio + 1e-9)
            })
            .count(),
        mean_ratio: rows.iter().map(|r| r.auto_ratio).sum::<f64>() / n,
        max_ratio: rows.iter().map(|r| r.auto_ratio).fold(0.0, f64::max),
        wide_limit: wide.len(),
        wide_within_2_percent: wide.iter().filter(|r| r.auto_ratio <= 1.02).count(),
        proven_optimal: rows.iter().filter(|r| r.proven_optimal).count(),
        worse_with_more_memory: worse_with_more_memory(&rows),
        span_above_makespan_run: span_above_makespan_run(&rows),
        max_seconds: rows.iter().map(|r| r.seconds).fold(0.0, f64::max),
    };
    Ok(VReport { rows, summary })
}

/// Whether two rows share shape, ratio and transfer (limit and objective aside).
fn same_costs(a: &VRow, b: &VRow) -> bool {
    (a.ranks, a.microbatches, a.ratio) == (b.ranks, b.microbatches, b.ratio)
        && a.transfer == b.transfer
}

/// Rows whose objective is above that of the same instance and objective under a smaller limit.
fn worse_with_more_memory(rows: &[VRow]) -> usize {
    rows.iter()
        .filter(|r| {
            rows.iter().any(|q| {
                same_costs(q, r)
                    && q.objective == r.objective
                    && q.limit < r.limit
                    && r.auto > q.auto * (1.0 + 1e-9)
            })
        })
        .count()
}

/// Span rows whose span is above the makespan row's makespan on the same instance and limit.
fn span_above_makespan_run(rows: &[VRow]) -> usize {
    rows.iter()
        .filter(|r| r.objective == Objective::Span)
        .filter(|r| {
            rows.iter().any(|q| {
                q.objective == Objective::Makespan
                    && same_costs(q, r)
                    && q.limit == r.limit
                    && r.auto > q.auto * (1.0 + 1e-9)
            })
        })
        .count()
}

/// The V-shape grid as a table, then the aims.
pub fn table(g: &VReport) -> String {
    let mut out = String::from(
        "vshape grid (V = 2): objective / lower bound (1 = optimal); V-shape families that fit; limit in microbatches in flight\n",
    );
    out.push_str(&format!(
        "{:>3} {:>4} {:<9} {:>4} {:<5} {:>5} {:<8} {:>10} {:>7} {:>7} {:<12} {:>6}  origin\n",
        "P",
        "M",
        "F:I:W",
        "comm",
        "limit",
        "=",
        "obj",
        "bound",
        "auto",
        "best",
        "best family",
        "time"
    ));
    for r in &g.rows {
        let (best, name) = match &r.best_family {
            Some(b) => (format!("{:.4}", b.ratio), b.family.clone()),
            None => ("-".into(), "(none fits)".into()),
        };
        out.push_str(&format!(
            "{:>3} {:>4} {:<9} {:>4} {:<5} {:>5} {:<8} {:>10.3} {:>7.4}{} {:>7} {:<12} {:>5.2}s  {}\n",
            r.ranks,
            r.microbatches,
            r.ratio,
            r.transfer,
            r.limit_name,
            r.limit,
            r.objective.name(),
            r.lower_bound,
            r.auto_ratio,
            if r.proven_optimal { "*" } else { " " },
            best,
            name,
            r.seconds,
            r.origin
        ));
    }
    let s = &g.summary;
    out.push_str(&format!(
        "(* = proven optimal under the limit; the bound is then the optimum)\n\
         aims over {} rows:\n\
         - auto worse than the best fitting family: {} (aim 0); longer than under a smaller limit: {} (aim 0)\n\
         - span rows longer than the same instance's makespan run: {} (aim 0)\n\
         - limit allows 2P-1 in flight: {} rows, {} within 2 % of the bound\n\
         - auto / bound mean {:.4}, max {:.4}; proven optimal: {}; longest solve {:.3} s\n",
        s.rows,
        s.worse_than_a_family,
        s.worse_with_more_memory,
        s.span_above_makespan_run,
        s.wide_limit,
        s.wide_within_2_percent,
        s.mean_ratio,
        s.max_ratio,
        s.proven_optimal,
        s.max_seconds
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(limit: f64, auto: f64, objective: Objective) -> VRow {
        VRow {
            ranks: 4,
            microbatches: 4,
            ratio: "1:1:1",
            transfer: 0.1,
            limit_name: "x",
            limit,
            objective,
            lower_bound: 1.0,
            auto,
            auto_ratio: auto,
            proven_optimal: false,
            origin: String::new(),
            families: Vec::new(),
            best_family: None,
            seconds: 0.0,
        }
    }

    #[test]
    fn a_row_longer_than_under_a_smaller_limit_is_counted() {
        let (mk, sp) = (Objective::Makespan, Objective::Span);
        // Monotone per objective; the span's value above the makespan's smaller limit is not a
        // comparison (other objective).
        let fine = [
            row(2.0, 3.0, mk),
            row(4.0, 2.5, mk),
            row(2.0, 2.0, sp),
            row(8.0, 2.0, sp),
        ];
        assert_eq!(worse_with_more_memory(&fine), 0);
        let bad = [row(2.0, 3.0, mk), row(4.0, 3.1, mk), row(8.0, 3.2, mk)];
        assert_eq!(worse_with_more_memory(&bad), 2);
    }

    #[test]
    fn a_span_row_longer_than_the_makespan_run_is_counted() {
        let (mk, sp) = (Objective::Makespan, Objective::Span);
        // Only the same limit compares: the span at 2 against the makespan at 2, not at 4.
        let rows = [
            row(2.0, 3.0, mk),
            row(2.0, 3.0, sp),
            row(4.0, 2.0, mk),
            row(4.0, 2.1, sp),
            row(8.0, 2.0, mk),
            row(8.0, 1.9, sp),
        ];
        assert_eq!(span_above_makespan_run(&rows), 1);
        assert_eq!(span_above_makespan_run(&rows[..2]), 0);
    }
}
