//! The zero-bubble paper's benchmark in `pipefill bench auto`: its profiled times and memory limits,
//! `auto`'s bubble rate next to the rates the paper publishes (data and sources in `zb_paper.toml`).

use std::collections::BTreeMap;
use std::time::Instant;

use pipefill_host::auto::{solve, AutoRequest, MemoryLimit, Objective};
use pipefill_host::cost::{CostModel, LinkCost, StageCost};
use serde::{Deserialize, Serialize};

use crate::cli::CliError;

/// The paper's numbers (see the comments in the file for the tables they come from).
const DATA: &str = include_str!("zb_paper.toml");

#[derive(Debug, Deserialize)]
pub(super) struct Data {
    pub(super) sequence: f64,
    pub(super) rows: Vec<DataRow>,
}

#[derive(Debug, Deserialize)]
pub(super) struct DataRow {
    pub(super) model: String,
    heads: f64,
    hidden: f64,
    pub(super) p: usize,
    pub(super) m: usize,
    f: f64,
    b: f64,
    w: f64,
    comm: f64,
    rates: BTreeMap<String, f64>,
}

/// The paper's settings.
pub(super) fn data() -> Result<Data, CliError> {
    toml::from_str(DATA).map_err(|e| CliError::Failed(format!("bench auto: zb_paper.toml: {e}")))
}

impl DataRow {
    /// One stage of the row under the authors' memory model, in units of `M_B` (a microbatch's
    /// activations, `34h + 5as` per token): `F` allocates 1, `B` (pipefill's `I`) frees all but
    /// what `W` needs (`32h`); the stage's input is `2h` (what full recomputation keeps).
    pub(super) fn stage(&self, sequence: f64) -> StageCost {
        let whole = 34.0 * self.hidden + 5.0 * self.heads * sequence;
        let mut stage = StageCost::uniform(self.f, self.b, self.w);
        stage.activation_bytes = 1.0;
        stage.released_at_input = 1.0 - 32.0 * self.hidden / whole;
        stage.input_bytes = 2.0 * self.hidden / whole;
        stage.output_bytes = stage.input_bytes;
        stage
    }

    /// The row's transfer: its latency, free bandwidth.
    pub(super) fn link(&self) -> LinkCost {
        LinkCost {
            latency: self.comm,
            bandwidth: f64::INFINITY,
        }
    }
}

/// One (model, `m`, limit) of the paper.
#[derive(Debug, Clone, Serialize)]
pub struct PaperRow {
    /// The paper's model name.
    pub model: String,
    /// Stages (ranks).
    pub p: usize,
    /// Microbatches.
    pub m: usize,
    /// `1p` (activation memory `p M_B`, 1F1B's) or `2p`.
    pub limit: &'static str,
    /// `auto`'s bubble rate with the span objective (the paper's definition).
    pub auto: f64,
    /// The paper's published rate of its own scheduler at this limit (ZB-1p or ZB-2p).
    pub paper_auto: f64,
    /// The bubble rate at `auto`'s lower bound on the span under the same limit: no schedule's
    /// rate is below it (`auto`'s own when `proven_optimal`).
    pub bound: f64,
    /// Whether `auto` is proven optimal.
    pub proven_optimal: bool,
    /// Where `auto`'s schedule came from (a family, `zb-greedy`, `list`, `+improved`).
    pub origin: String,
    /// The rates pipefill's simulator gives the handcrafted families that fit the limit (a check
    /// of the inputs against the paper's own columns).
    pub families: BTreeMap<String, f64>,
    /// The paper's published rates for this `m` (1F1B, 1F1B-I, ZB-H1, ZB-H2, ZB-1p, ZB-2p).
    pub paper: BTreeMap<String, f64>,
    /// Wall seconds of the solve.
    pub seconds: f64,
}

/// How `auto` compares with the paper's scheduler.
#[derive(Debug, Clone, Serialize)]
pub struct PaperSummary {
    /// Rows.
    pub rows: usize,
    /// Rows where `auto`'s rate is below the paper's by more than 0.0001.
    pub below: usize,
    /// Rows within 0.0001.
    pub equal: usize,
    /// Rows where `auto`'s rate is above the paper's by more than 0.0001.
    pub above: usize,
    /// Rows where `auto` is proven optimal under the limit (no rate below it exists).
    pub proven_optimal: usize,
    /// The largest `auto` rate less the bound's (how far from the best possible, at most).
    pub max_gap: f64,
}

/// The paper table and its summary.
#[derive(Debug, Clone, Serialize)]
pub struct PaperReport {
    /// One row per (model, `m`, limit).
    pub rows: Vec<PaperRow>,
    /// The comparison.
    pub summary: PaperSummary,
}

/// Runs the paper's settings (the first one only with `quick`).
pub fn run(quick: bool, budget: f64, seed: u64) -> Result<PaperReport, CliError> {
    let data = data()?;
    let take = if quick { 1 } else { data.rows.len() };
    let mut rows = Vec::new();
    for d in data.rows.iter().take(take) {
        for (limit, k) in [("1p", 1.0), ("2p", 2.0)] {
            rows.push(row(d, data.sequence, limit, k, budget, seed)?);
        }
    }
    let eps = 1e-4;
    let summary = PaperSummary {
        rows: rows.len(),
        below: rows.iter().filter(|r| r.auto < r.paper_auto - eps).count(),
        equal: rows
            .iter()
            .filter(|r| (r.auto - r.paper_auto).abs() <= eps)
            .count(),
        above: rows.iter().filter(|r| r.auto > r.paper_auto + eps).count(),
        proven_optimal: rows.iter().filter(|r| r.proven_optimal).count(),
        max_gap: rows.iter().map(|r| r.auto - r.bound).fold(0.0, f64::max),
    };
    Ok(PaperReport { rows, summary })
}

/// `auto` on one setting at `k p M_B`.
fn row(
    d: &DataRow,
    sequence: f64,
    limit: &'static str,
    k: f64,
    budget: f64,
    seed: u64,
) -> Result<PaperRow, CliError> {
    // The paper's model: no free overlap of forward and backward (pairs would cost their sum).
    let mut costs = CostModel::uniform(d.stage(sequence), d.p, d.link());
    costs.overlap_share = 1.0;
    let req = AutoRequest::new(d.p, d.m, costs)
        .with_limit(MemoryLimit::Bytes(k * d.p as f64))
        .with_objective(Objective::Span)
        .with_budget(budget, seed);
    let start = Instant::now();
    let out = solve(&req).map_err(|e| CliError::Failed(format!("bench auto: {e}")))?;
    let seconds = start.elapsed().as_secs_f64();
    let work = d.m as f64 * (d.f + d.b + d.w);
    let rate = |span: f64| (span - work) / span;
    let families = out
        .solver
        .families
        .iter()
        .filter_map(|f| Some((f.family.clone(), rate(f.value?))))
        .collect();
    let key = if k == 1.0 { "zb-1p" } else { "zb-2p" };
    Ok(PaperRow {
        model: d.model.clone(),
        p: d.p,
        m: d.m,
        limit,
        auto: rate(out.solver.value),
        paper_auto: d.rates.get(key).copied().unwrap_or(f64::NAN),
        bound: rate(out.solver.lower_bound).max(0.0),
        proven_optimal: out.solver.proven_optimal,
        origin: out.solver.origin.clone(),
        families,
        paper: d.rates.clone(),
        seconds,
    })
}

/// The paper table, then the comparison.
pub fn table(r: &PaperReport) -> String {
    let mut out = String::from(
        "zero-bubble paper (arXiv:2401.10241, Tables 9 and 5): bubble rate = (span - m(F+B+W)) / span\n",
    );
    out.push_str(&format!(
        "{:<6} {:>3} {:>4} {:<5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7}\n",
        "model",
        "p",
        "m",
        "limit",
        "auto",
        "bound",
        "paper",
        "1f1b",
        "zb-h1",
        "zb-h2",
        "paper1f1b",
        "time"
    ));
    for x in &r.rows {
        let ours = |k: &str| x.families.get(k).map_or("-".into(), |v| format!("{v:.4}"));
        out.push_str(&format!(
            "{:<6} {:>3} {:>4} {:<5} {:>8.4}{} {:>8.4} {:>8.4} {:>8} {:>8} {:>8} {:>8.4} {:>6.2}s\n",
            x.model,
            x.p,
            x.m,
            x.limit,
            x.auto,
            if x.proven_optimal { "*" } else { " " },
            x.bound,
            x.paper_auto,
            ours("1f1b"),
            ours("zb-h1"),
            ours("zb-h2"),
            x.paper.get("1f1b").copied().unwrap_or(f64::NAN),
            x.seconds
        ));
    }
    let s = &r.summary;
    out.push_str(&format!(
        "(paper = ZB-1p at limit p M_B, ZB-2p at 2p M_B; 1f1b, zb-h1, zb-h2 simulated here when they fit;\n\
         bound = the rate at auto's lower bound, below which no schedule under the limit goes; * = proven optimal)\n\
         auto below the paper's rate: {} of {}; equal (within 0.0001): {}; above: {}\n\
         proven optimal: {}; largest auto rate above its bound: {:.4}\n\
         ZB-V: the paper's Table 8 rates come from runs whose profiled times it does not publish; not compared\n",
        s.below, s.rows, s.equal, s.above, s.proven_optimal, s.max_gap
    ));
    out
}
