//! The rows `pipefill simulate` prints: one per schedule, as a table or as JSON.
//!
//! JSON: `{"results": [row, ...]}`, best (smallest makespan) first; each row has the keys of [`Row`]
//! (times in seconds, or the unit of `--cost`; bytes in bytes).

use pipefill_host::cost::{CostModel, Recompute};
use pipefill_host::schedule::Item;
use pipefill_host::schedule::Schedule;
use pipefill_host::sim::{peak_activations, DeviceSharing, Simulation};
use serde::Serialize;

/// How the price of GPU time is given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Price {
    /// `--price-per-gpu-hour`.
    PerGpuHour(f64),
    /// `--cluster-cost-per-day` for the whole P-GPU cluster.
    ClusterPerDay(f64),
}

/// `--steps` and an optional price.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BubbleCost {
    /// Training steps in the run.
    pub steps: u64,
    /// Price of GPU time, if given.
    pub price: Option<Price>,
}

/// What the bubble costs over a run (`bubble` in the JSON).
#[derive(Debug, Clone, Serialize)]
pub struct BubbleSpend {
    /// Training steps.
    pub steps: u64,
    /// Mean idle time per GPU per step: `makespan * bubble_fraction`.
    pub idle_per_gpu_per_step: f64,
    /// Idle GPU-hours per GPU over the run.
    pub gpu_hours_per_gpu: f64,
    /// Idle GPU-hours over all P GPUs.
    pub gpu_hours: f64,
    /// Price of one GPU-hour used (given, or cluster cost per day / 24 / P); null without a price.
    pub price_per_gpu_hour: Option<f64>,
    /// Money the bubble wastes over the run; null without a price.
    pub cost: Option<f64>,
}

/// One simulated schedule (one element of `results` in the JSON).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Schedule name (family, or the file's name).
    pub schedule: String,
    /// `P`.
    pub ranks: usize,
    /// `V`.
    pub chunks: usize,
    /// `M`.
    pub microbatches: usize,
    /// Single actions (a pair counts two).
    pub actions: usize,
    /// Predicted step time, in `time_unit`.
    pub makespan: f64,
    /// `s`, or `units` when the costs are abstract (`--cost` with no time suffix, as the default
    /// `F=1,I=1,W=1`): every time in the row is in this unit.
    pub time_unit: &'static str,
    /// `1 - sum(busy) / (P * makespan)`.
    pub bubble_fraction: f64,
    /// No schedule can be faster with these costs, P, V and placement.
    pub lower_bound: f64,
    /// `makespan / lower_bound`.
    pub ratio_to_lower_bound: f64,
    /// Per rank, time computing.
    pub busy: Vec<f64>,
    /// Per rank, `makespan - busy`.
    pub idle: Vec<f64>,
    /// Per rank, peak activation memory, in `peak_activations_unit`.
    pub peak_activations: Vec<f64>,
    /// `bytes`, or `rank-microbatches` when the costs give no activation sizes (one unit is the
    /// activations of one microbatch over one rank's share of the layers at V = 1: 1F1B's rank 0 holds P).
    pub peak_activations_unit: &'static str,
    /// Per rank, parameter bytes of its stages.
    pub parameter_bytes: Vec<f64>,
    /// Items on the critical path.
    pub critical_path_items: usize,
    /// Transfer time on the critical path.
    pub critical_path_transfer_time: f64,
    /// Number of transfers between ranks.
    pub transfers: usize,
    /// `per-rank` (each rank its own device) or `shared` (`--shared-device`: all ranks on one
    /// device, concurrent actions slowed by the overlap share; `busy` is then stretched time).
    pub device: &'static str,
    /// The overlap share the prediction used (overlapped pairs, and concurrent actions on a shared
    /// device).
    pub overlap_share: f64,
    /// Sum of every action's time alone: the step time on one device that runs one thing at a time.
    pub serial_sum: f64,
    /// Per stage, its recomputation mode (`none`, or `full`: the forward runs again before I/B).
    pub recompute: Vec<Recompute>,
    /// What the bubble costs (present with `--steps`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bubble: Option<BubbleSpend>,
}

impl Row {
    /// The row of one simulation.
    pub fn new(
        s: &Schedule,
        model: &CostModel,
        sim: &Simulation,
        money: Option<&BubbleCost>,
        device: DeviceSharing,
    ) -> Row {
        let t = &sim.timeline;
        let p = s.ranks;
        let makespan = t.makespan();
        let busy: Vec<f64> = (0..p).map(|r| t.busy(r)).collect();
        let bytes_known = model.stages.iter().any(|st| st.activation_bytes > 0.0);
        let (peaks, unit) = if bytes_known {
            (sim.peak_activations.clone(), "bytes")
        } else {
            let mut unit_model = model.clone();
            for st in &mut unit_model.stages {
                st.activation_bytes = 1.0 / s.chunks as f64;
                st.released_at_input = 0.0;
            }
            (peak_activations(t, &unit_model), "rank-microbatches")
        };
        let mut params = vec![0.0; p];
        for (stage, st) in model.stages.iter().enumerate() {
            params[s.rank_of(stage)] += st.parameter_bytes;
        }
        let bubble_fraction = t.bubble_fraction();
        Row {
            schedule: s.name.clone(),
            ranks: p,
            chunks: s.chunks,
            microbatches: s.microbatches,
            actions: s.action_count(),
            makespan,
            time_unit: "s",
            bubble_fraction,
            lower_bound: sim.lower_bound,
            ratio_to_lower_bound: sim.ratio_to_bound(),
            idle: busy.iter().map(|b| makespan - b).collect(),
            busy,
            peak_activations: peaks,
            peak_activations_unit: unit,
            parameter_bytes: params,
            critical_path_items: sim.critical_path.len(),
            critical_path_transfer_time: sim.critical_transfer_time(),
            transfers: t.transfers.len(),
            device: match device {
                DeviceSharing::PerRank => "per-rank",
                DeviceSharing::Shared => "shared",
            },
            overlap_share: model.overlap_share,
            serial_sum: serial_sum(s, model),
            recompute: model.stages.iter().map(|st| st.recompute).collect(),
            bubble: money.map(|m| spend(m, p, makespan * bubble_fraction)),
        }
    }
}

/// Sum of every item's time alone (a pair at its overlapped time).
fn serial_sum(s: &Schedule, model: &CostModel) -> f64 {
    s.actions
        .iter()
        .flatten()
        .map(|item| match *item {
            Item::One(a) => model.stages[a.stage].time(a.op),
            Item::Overlap { forward, backward } => model.pair_time(
                model.stages[forward.stage].forward,
                model.stages[backward.stage].time(backward.op),
            ),
            _ => 0.0,
        })
        .sum()
}

/// The bubble's GPU-hours and money over the run.
fn spend(m: &BubbleCost, ranks: usize, idle_per_gpu: f64) -> BubbleSpend {
    let per_gpu = idle_per_gpu * m.steps as f64 / 3600.0;
    let gpu_hours = per_gpu * ranks as f64;
    let price = m.price.map(|p| match p {
        Price::PerGpuHour(x) => x,
        Price::ClusterPerDay(x) => x / 24.0 / ranks as f64,
    });
    BubbleSpend {
        steps: m.steps,
        idle_per_gpu_per_step: idle_per_gpu,
        gpu_hours_per_gpu: per_gpu,
        gpu_hours,
        price_per_gpu_hour: price,
        cost: price.map(|x| x * gpu_hours),
    }
}

/// `{"results": [...]}`.
pub fn json(rows: &[&Row]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({ "results": rows })).unwrap_or_default()
}

/// The table: one row per schedule, best first.
pub fn table(rows: &[&Row]) -> String {
    let money = rows.iter().any(|r| r.bubble.is_some());
    let priced = rows
        .iter()
        .any(|r| r.bubble.as_ref().is_some_and(|b| b.cost.is_some()));
    let unit = rows.first().map_or("bytes", |r| r.peak_activations_unit);
    let makespan = match rows.first().map(|r| r.time_unit) {
        Some("units") => "makespan",
        _ => "makespan (s)",
    };
    let name_w = rows
        .iter()
        .map(|r| r.schedule.len())
        .max()
        .unwrap_or(8)
        .max(8);
    let mut out = format!(
        "{:<name_w$} {:>3} {:>2} {:>5} {:>12} {:>7} {:>11} {:>6}",
        "schedule", "P", "V", "M", makespan, "bubble", "lower bound", "ratio"
    );
    if money {
        out.push_str("  bubble GPU-h");
        if priced {
            out.push_str("  bubble cost");
        }
    }
    out.push_str(if unit == "bytes" {
        "  peak activations per rank\n"
    } else {
        "  peak activations per rank (x one rank's microbatch)\n"
    });
    for r in rows {
        let peaks: Vec<String> = r
            .peak_activations
            .iter()
            .map(|&v| {
                if unit == "bytes" {
                    human_bytes(v)
                } else {
                    trim(v)
                }
            })
            .collect();
        out.push_str(&format!(
            "{:<name_w$} {:>3} {:>2} {:>5} {:>12} {:>6.1}% {:>11} {:>6.3}",
            r.schedule,
            r.ranks,
            r.chunks,
            r.microbatches,
            sig(r.makespan),
            100.0 * r.bubble_fraction,
            sig(r.lower_bound),
            r.ratio_to_lower_bound,
        ));
        if let Some(b) = &r.bubble {
            out.push_str(&format!("  {:>12}", sig(b.gpu_hours)));
            if let Some(c) = b.cost {
                out.push_str(&format!("  {:>11.2}", c));
            }
        }
        out.push_str(&format!("  {}\n", peaks.join(" ")));
    }
    if let Some(r) = rows.iter().find(|r| r.device == "shared") {
        out.push_str(&format!(
            "shared device: all ranks on one device, overlap share {}; serial sum of all actions: {}\n",
            trim(r.overlap_share),
            rows.iter()
                .map(|r| format!("{} {}", r.schedule, sig(r.serial_sum)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out
}

/// A time with 6 significant digits.
fn sig(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits = (5 - v.abs().log10().floor() as i32).clamp(0, 9) as usize;
    trim_str(format!("{v:.digits$}"))
}

/// A count that may be fractional (V > 1), without trailing zeros.
fn trim(v: f64) -> String {
    trim_str(format!("{v:.3}"))
}

fn trim_str(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Bytes in B, KiB, MiB or GiB.
fn human_bytes(v: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = v;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    format!("{}{}", trim_str(format!("{x:.1}")), UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_example_ten_ms_over_ten_million_steps() {
        // 10 ms of bubble per GPU per step over 10 million steps: about 27.8 GPU-hours per GPU.
        let m = BubbleCost {
            steps: 10_000_000,
            price: Some(Price::ClusterPerDay(24.0 * 8.0 * 2.0)),
        };
        let s = spend(&m, 8, 0.010);
        assert!((s.gpu_hours_per_gpu - 27.777_777_8).abs() < 1e-6);
        assert!((s.gpu_hours - 8.0 * 27.777_777_8).abs() < 1e-5);
        assert_eq!(s.price_per_gpu_hour, Some(2.0));
        assert!((s.cost.unwrap() - 2.0 * 8.0 * 27.777_777_8).abs() < 1e-4);
    }

    #[test]
    fn formats() {
        assert_eq!(human_bytes(1536.0), "1.5KiB");
        assert_eq!(human_bytes(64.0 * 1024.0 * 1024.0), "64MiB");
        assert_eq!(sig(33.0), "33");
        assert_eq!(sig(0.0123456789), "0.0123457");
        assert_eq!(trim(1.5), "1.5");
    }
}
