//! The grid of `pipefill bench auto`: `auto` against every handcrafted family that fits the same
//! memory limit, and against the lower bound.

use std::time::Instant;

use pipefill_host::auto::{solve, AutoRequest, MemoryLimit, SolverInfo};
use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use pipefill_host::schedule::Placement;
use serde::Serialize;

use crate::cli::CliError;

/// `F:I:W` ratios of the grid, with their labels.
pub(super) const RATIOS: [(&str, [f64; 3]); 3] = [
    ("1:1:1", [1.0, 1.0, 1.0]),
    ("2:2:1", [2.0, 2.0, 1.0]),
    ("1:1.2:0.8", [1.0, 1.2, 0.8]),
];

/// One instance of the grid.
#[derive(Debug, Clone, Copy)]
pub(super) struct Instance {
    pub(super) ranks: usize,
    pub(super) microbatches: usize,
    pub(super) ratio: (&'static str, [f64; 3]),
    pub(super) transfer: f64,
    pub(super) uneven: bool,
    pub(super) placement: Placement,
    pub(super) limit: (&'static str, f64),
}

/// A family's makespan over the lower bound.
#[derive(Debug, Clone, Serialize)]
pub struct FamilyRatio {
    /// The family.
    pub family: String,
    /// Its makespan / the lower bound.
    pub ratio: f64,
}

/// One row of the grid.
#[derive(Debug, Clone, Serialize)]
pub struct GridRow {
    /// `P`.
    pub ranks: usize,
    /// `M`.
    pub microbatches: usize,
    /// `F:I:W`.
    pub ratio: &'static str,
    /// Transfer time as a share of `F`.
    pub transfer: f64,
    /// First and last stage 1.5x.
    pub uneven: bool,
    /// `looped` (`V = 1`) or `vshape` (`V = 2`).
    pub placement: &'static str,
    /// `1f1b`, `1.5x`, `2x` or `half` (of 1F1B's in-flight count `P`).
    pub limit_name: &'static str,
    /// The limit, microbatches in flight per rank.
    pub limit: f64,
    /// The lower bound (the proven optimum when `proven_optimal`).
    pub lower_bound: f64,
    /// `auto`'s makespan.
    pub auto: f64,
    /// `auto`'s makespan / the lower bound.
    pub auto_ratio: f64,
    /// Whether `auto` is proven optimal.
    pub proven_optimal: bool,
    /// Where `auto`'s schedule came from.
    pub origin: String,
    /// The handcrafted families that fit the limit.
    pub families: Vec<FamilyRatio>,
    /// The best of them, if any fits.
    pub best_family: Option<FamilyRatio>,
    /// Wall seconds of the solve.
    pub seconds: f64,
}

/// The aims, checked over the grid.
#[derive(Debug, Clone, Serialize)]
pub struct GridSummary {
    /// Instances.
    pub instances: usize,
    /// Instances where `auto` is worse than the best fitting family (the aim: 0).
    pub worse_than_a_family: usize,
    /// Instances where `auto` beats the best fitting family by more than 0.1 %.
    pub better_than_every_family: usize,
    /// Instances where no family fits the limit.
    pub no_family_fits: usize,
    /// Instances whose limit allows `2P - 1` in flight.
    pub wide_limit: usize,
    /// Of those, instances within 2 % of the lower bound (the aim: all).
    pub wide_within_2_percent: usize,
    /// The largest `auto / bound` among the wide-limit instances.
    pub wide_worst_ratio: f64,
    /// Instances proven optimal.
    pub proven_optimal: usize,
    /// The longest solve, seconds.
    pub max_seconds: f64,
    /// The longest solve at `P = 8`, `M = 32`, seconds (the aim: under 1).
    pub p8_m32_max_seconds: f64,
}

/// The grid's rows and summary.
#[derive(Debug, Clone, Serialize)]
pub struct GridReport {
    /// One row per instance.
    pub rows: Vec<GridRow>,
    /// The aims.
    pub summary: GridSummary,
}

/// The instances: the full grid, or a few with `quick`.
fn instances(quick: bool) -> Vec<Instance> {
    let mut out = Vec::new();
    let ranks: &[usize] = if quick { &[4] } else { &[4, 8, 16] };
    for &p in ranks {
        let ms: Vec<usize> = if quick {
            vec![2 * p]
        } else {
            vec![p, 2 * p, 4 * p]
        };
        let ratios: &[_] = if quick { &RATIOS[..1] } else { &RATIOS };
        let transfers: &[f64] = if quick { &[0.0] } else { &[0.0, 0.1] };
        for &m in &ms {
            for &ratio in ratios {
                for &transfer in transfers {
                    for uneven in [false, true] {
                        let pf = p as f64;
                        let looped = [("1f1b", pf), ("1.5x", 1.5 * pf), ("2x", 2.0 * pf)];
                        let vshape = [("1f1b", pf), ("half", (pf / 2.0).max(1.0))];
                        let all = looped
                            .iter()
                            .map(|&l| (Placement::Looped, l))
                            .chain(vshape.iter().map(|&l| (Placement::Vshape, l)));
                        for (placement, limit) in all {
                            if quick && limit.0 == "1.5x" {
                                continue;
                            }
                            out.push(Instance {
                                ranks: p,
                                microbatches: m,
                                ratio,
                                transfer,
                                uneven,
                                placement,
                                limit,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

/// The per-stage costs of an instance: one rank's `F:I:W` split over its chunks, the first and
/// last stage 1.5x when uneven, transfers `transfer * F`, no free overlap of F/B pairs.
pub(super) fn costs(inst: &Instance) -> CostModel {
    let v = if inst.placement == Placement::Vshape {
        2
    } else {
        1
    };
    let [f, i, w] = inst.ratio.1;
    let stages = inst.ranks * v;
    let link = LinkCost {
        latency: inst.transfer * f,
        bandwidth: f64::INFINITY,
    };
    let mut model = CostModel::uniform(StageCost::uniform(f, i, w).split(v), stages, link);
    model.overlap_share = 1.0;
    if inst.uneven {
        for s in [0, stages - 1] {
            let c = model.stages[s];
            model.stages[s] = StageCost::uniform(
                1.5 * c.forward,
                1.5 * c.backward_input,
                1.5 * c.backward_weight,
            );
        }
    }
    model
}

/// Solves one instance.
fn row(inst: &Instance, budget: f64, seed: u64) -> Result<GridRow, CliError> {
    let v = if inst.placement == Placement::Vshape {
        2
    } else {
        1
    };
    let req = AutoRequest::new(inst.ranks, inst.microbatches, costs(inst))
        .with_chunks(v, inst.placement)
        .with_limit(MemoryLimit::InFlight(inst.limit.1))
        .with_budget(budget, seed);
    let Solved {
        solver: s,
        seconds,
        families,
        best_family,
    } = solve_timed(&req)?;
    let lb = s.lower_bound;
    Ok(GridRow {
        ranks: inst.ranks,
        microbatches: inst.microbatches,
        ratio: inst.ratio.0,
        transfer: inst.transfer,
        uneven: inst.uneven,
        placement: inst.placement.name(),
        limit_name: inst.limit.0,
        limit: inst.limit.1,
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

/// `auto` solved for one grid row: what the solver says, its wall time, and every fitting family's
/// objective over the lower bound with the best of them.
pub(super) struct Solved {
    pub solver: SolverInfo,
    pub seconds: f64,
    pub families: Vec<FamilyRatio>,
    pub best_family: Option<FamilyRatio>,
}

/// Solves `req`, timing it, and rates the families it tried against its lower bound.
pub(super) fn solve_timed(req: &AutoRequest) -> Result<Solved, CliError> {
    let start = Instant::now();
    let out = solve(req).map_err(|e| CliError::Failed(format!("bench auto: {e}")))?;
    let seconds = start.elapsed().as_secs_f64();
    let solver = out.solver;
    let families: Vec<FamilyRatio> = solver
        .families
        .iter()
        .filter_map(|f| {
            Some(FamilyRatio {
                family: f.family.clone(),
                ratio: f.value? / solver.lower_bound,
            })
        })
        .collect();
    let best_family = families
        .iter()
        .min_by(|a, b| a.ratio.total_cmp(&b.ratio))
        .cloned();
    Ok(Solved {
        solver,
        seconds,
        families,
        best_family,
    })
}

/// Runs the grid.
pub fn run(quick: bool, budget: f64, seed: u64) -> Result<GridReport, CliError> {
    let rows = instances(quick)
        .iter()
        .map(|i| row(i, budget, seed))
        .collect::<Result<Vec<_>, _>>()?;
    let summary = summarize(&rows);
    Ok(GridReport { rows, summary })
}

/// The aims over the rows.
fn summarize(rows: &[GridRow]) -> GridSummary {
    let tol = 1e-9;
    let wide: Vec<&GridRow> = rows
        .iter()
        .filter(|r| r.limit >= 2.0 * r.ranks as f64 - 1.0)
        .collect();
    let max = |it: &mut dyn Iterator<Item = f64>| it.fold(0.0, f64::max);
    GridSummary {
        instances: rows.len(),
        worse_than_a_family: rows
            .iter()
            .filter(|r| {
                r.best_family
                    .as_ref()
                    .is_some_and(|b| r.auto_ratio > b.ratio + tol)
            })
            .count(),
        better_than_every_family: rows
            .iter()
            .filter(|r| {
                r.best_family
                    .as_ref()
                    .is_some_and(|b| r.auto_ratio < b.ratio * (1.0 - 1e-3))
            })
            .count(),
        no_family_fits: rows.iter().filter(|r| r.best_family.is_none()).count(),
        wide_limit: wide.len(),
        wide_within_2_percent: wide.iter().filter(|r| r.auto_ratio <= 1.02).count(),
        wide_worst_ratio: max(&mut wide.iter().map(|r| r.auto_ratio)),
        proven_optimal: rows.iter().filter(|r| r.proven_optimal).count(),
        max_seconds: max(&mut rows.iter().map(|r| r.seconds)),
        p8_m32_max_seconds: max(&mut rows
            .iter()
            .filter(|r| r.ranks == 8 && r.microbatches == 32)
            .map(|r| r.seconds)),
    }
}

/// The grid as a table, then the aims.
pub fn table(g: &GridReport) -> String {
    let mut out = String::from(
        "grid: makespan / lower bound (1 = optimal); families that fit the limit; limit in microbatches in flight\n",
    );
    out.push_str(&format!(
        "{:>3} {:>4} {:<9} {:>4} {:<6} {:<6} {:<5} {:>5} {:>10} {:>7} {:>7} {:<16} {:>6}  families\n",
        "P", "M", "F:I:W", "comm", "uneven", "place", "limit", "=", "bound", "auto", "best", "best family", "time"
    ));
    for r in &g.rows {
        let (best, best_name) = match &r.best_family {
            Some(b) => (format!("{:.4}", b.ratio), b.family.clone()),
            None => ("-".into(), "(none fits)".into()),
        };
        let fams: Vec<String> = r
            .families
            .iter()
            .map(|f| format!("{}={:.3}", f.family, f.ratio))
            .collect();
        out.push_str(&format!(
            "{:>3} {:>4} {:<9} {:>4} {:<6} {:<6} {:<5} {:>5} {:>10.3} {:>7.4}{} {:>7} {:<16} {:>5.2}s  {}\n",
            r.ranks,
            r.microbatches,
            r.ratio,
            r.transfer,
            if r.uneven { "1.5x" } else { "no" },
            r.placement,
            r.limit_name,
            r.limit,
            r.lower_bound,
            r.auto_ratio,
            if r.proven_optimal { "*" } else { " " },
            best,
            best_name,
            r.seconds,
            fams.join(" ")
        ));
    }
    let s = &g.summary;
    out.push_str(&format!(
        "(* = proven optimal under the limit; the bound is then the optimum)\n\
         aims over {} instances:\n\
         - auto worse than the best fitting family: {} (aim 0); better by > 0.1 %: {}; no family fits: {}\n\
         - limit allows 2P-1 in flight: {} instances, {} within 2 % of the bound (worst ratio {:.4})\n\
         - proven optimal: {}; longest solve {:.3} s; longest at P = 8, M = 32: {:.3} s (aim < 1 s)\n",
        s.instances,
        s.worse_than_a_family,
        s.better_than_every_family,
        s.no_family_fits,
        s.wide_limit,
        s.wide_within_2_percent,
        s.wide_worst_ratio,
        s.proven_optimal,
        s.max_seconds,
        s.p8_m32_max_seconds
    ));
    out
}
