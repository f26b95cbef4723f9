//! `pipefill bench auto --part recompute`: what recomputation buys the planner on the zero-bubble
//! paper's profiled inputs (`zb_paper.toml`, the `p = 8` rows) with the authors' memory model.
//!
//! Each row's `p` stages are a cost file of `p` layers (one stage each: `F`, `B` as `I`, `W` and the
//! transfer latency of the paper's Table 9; activations in units of `M_B`: `F` allocates 1, `I`
//! frees all but the `32h` that `W` needs, and the stage's input, what full recomputation keeps, is
//! `2h` of the `34h + 5as` per token, 0 for the first stage as in every cost file). The planner
//! ([`pipefill_host::plan::plan`]) searches every handcrafted family at `V = 1` and `auto` at the
//! row's `m`, under `2p`, `p` and `p/2` `M_B` per rank, three times: without recomputation, with
//! full recomputation everywhere, and choosing per stage (`--recompute auto`). Step times are the
//! simulated makespans in ms.

use pipefill_host::cost::{CostFile, LayerCost, RecomputeChoice};
use pipefill_host::plan::{plan, recompute_summary, Plan, PlanRequest};
use pipefill_host::schedule::families::FAMILIES;
use serde::Serialize;

use super::paper::{data, DataRow};
use crate::cli::CliError;

/// The limits, in `M_B` per rank, as multiples of `p` (1F1B holds `p` on its first rank).
const LIMITS: [(&str, f64); 3] = [("2p", 2.0), ("1p", 1.0), ("p/2", 0.5)];

/// The best plan of one choice.
#[derive(Debug, Clone, Serialize)]
pub struct Best {
    /// The schedule.
    pub family: String,
    /// Predicted step time, ms.
    pub step_time: f64,
    /// Its largest peak per rank, `M_B`.
    pub peak: f64,
    /// `-`, `full` or `k of S`.
    pub recompute: String,
}

/// One (model, `m`, limit).
#[derive(Debug, Clone, Serialize)]
pub struct RecomputeRow {
    /// The paper's model.
    pub model: String,
    /// Stages.
    pub p: usize,
    /// Microbatches.
    pub m: usize,
    /// The limit's name (`2p`, `1p`, `p/2`).
    pub limit: &'static str,
    /// The limit, `M_B` per rank.
    pub limit_mb: f64,
    /// The best plan without recomputation (`None`: nothing fits).
    pub none: Option<Best>,
    /// The best with full recomputation everywhere.
    pub full: Option<Best>,
    /// The planner's choice.
    pub auto: Option<Best>,
}

/// Runs the `p = 8` rows (the first only with `quick`).
pub fn run(quick: bool, budget: f64, seed: u64) -> Result<Vec<RecomputeRow>, CliError> {
    let data = data()?;
    let take = if quick { 1 } else { usize::MAX };
    let mut rows = Vec::new();
    for d in data.rows.iter().filter(|d| d.p == 8).take(take) {
        for (limit, k) in LIMITS {
            let limit_mb = k * d.p as f64;
            let best = |choice| best(d, data.sequence, limit_mb, choice, budget, seed);
            rows.push(RecomputeRow {
                model: d.model.clone(),
                p: d.p,
                m: d.m,
                limit,
                limit_mb,
                none: best(RecomputeChoice::None)?,
                full: best(RecomputeChoice::Full)?,
                auto: best(RecomputeChoice::Auto)?,
            });
        }
    }
    Ok(rows)
}

/// The planner's best for row `d` under `limit` `M_B` per rank and `choice`.
fn best(
    d: &DataRow,
    sequence: f64,
    limit: f64,
    choice: RecomputeChoice,
    budget: f64,
    seed: u64,
) -> Result<Option<Best>, CliError> {
    let stage = d.stage(sequence);
    let layers = (0..d.p)
        .map(|i| {
            let (f, i_, w) = (stage.forward, stage.backward_input, stage.backward_weight);
            let mut l = LayerCost::new(format!("stage{i}"), f, i_, w);
            l.activation_bytes = stage.activation_bytes;
            l.released_at_input = stage.released_at_input;
            l.output_bytes = stage.output_bytes;
            l
        })
        .collect();
    let costs = CostFile {
        layers,
        transfer: d.link(),
        // The zero-bubble paper's model: no free overlap of forward and backward.
        overlap_share: 1.0,
        meta: serde_json::Value::Null,
    };
    let mut req = PlanRequest::new(costs, 1.0, d.p, d.m);
    req.memory_limit = Some(limit);
    req.recompute = choice;
    req.chunks = vec![1];
    req.microbatch_counts = vec![d.m];
    req.families = FAMILIES
        .iter()
        .map(|f| f.name.to_string())
        .chain(std::iter::once("auto".to_string()))
        .collect();
    req.auto.time_budget = budget;
    req.auto.seed = seed;
    Ok(plan(&req).ok().and_then(|r| r.best().map(summary)))
}

fn summary(p: &Plan) -> Best {
    Best {
        family: p.family.clone(),
        step_time: p.step_time,
        peak: p.peak_memory.iter().copied().fold(0.0, f64::max),
        recompute: recompute_summary(&p.recompute),
    }
}

/// The table.
pub fn table(rows: &[RecomputeRow]) -> String {
    let mut out = String::from(
        "recomputation on the zero-bubble paper's inputs (p = 8 rows; memory in M_B per rank; step = \
         simulated makespan, ms)\n",
    );
    out.push_str(&format!(
        "{:<6} {:>4} {:<5} | {:<34} | {:<34} | {:<34}\n",
        "model", "m", "limit", "no recomputation", "full everywhere", "planner's choice"
    ));
    let cell = |b: &Option<Best>| match b {
        None => "nothing fits".to_string(),
        Some(b) => format!(
            "{:>8.1} {:>5.2} {:<10} {:>6}",
            b.step_time, b.peak, b.family, b.recompute
        ),
    };
    for r in rows {
        out.push_str(&format!(
            "{:<6} {:>4} {:<5} | {:<34} | {:<34} | {:<34}\n",
            r.model,
            r.m,
            r.limit,
            cell(&r.none),
            cell(&r.full),
            cell(&r.auto)
        ));
    }
    out.push_str(
        "(each cell: step ms, peak M_B, schedule, recomputing stages: - none, full all, k of S)\n",
    );
    out
}
