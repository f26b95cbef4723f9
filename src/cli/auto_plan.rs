//! `auto` in the planners: `plan --families auto` and `train` (whose default choice includes it).
//!
//! The automatic scheduler needs per-stage costs, the planners choose the split afterwards: `auto`
//! is solved on the even split of the layers (the costs at the microbatch size it will run at),
//! then its schedule is planned like any given schedule (every partition method simulated, the best
//! refined by boundary moves). The split the planner picks may differ from the one the schedule was
//! built for; the plan reports the step time of the pair it picked.

use pipefill_host::cost::{split_even, CostFile};
use pipefill_host::plan::{best_partition_replicated, Plan, PlanRequest, Skipped};
use pipefill_host::schedule::auto::{MemoryLimit, AUTO};
use pipefill_host::schedule::{Placement, Schedule};

use super::auto_flags::{solve_auto, AutoArgs, Shape};
use super::CliError;

/// The `auto` schedule for `costs` (measured at the microbatch size it will run at), its layers
/// cut evenly into `P x V` stages.
pub fn auto_schedule(
    costs: &CostFile,
    shape: Shape,
    limit: Option<MemoryLimit>,
    args: &AutoArgs,
) -> Result<Schedule, CliError> {
    let stages = shape.ranks * shape.chunks;
    let counts = split_even(costs.layers.len(), stages)
        .map_err(|e| CliError::Usage(format!("auto: {e}")))?;
    let model = costs
        .model(&counts)
        .map_err(|e| CliError::Usage(format!("auto: {e}")))?;
    Ok(solve_auto(shape, model, limit, args)?.schedule)
}

/// `costs` scaled from the microbatch size they were measured at to `factor` times it.
fn scaled(costs: &CostFile, factor: f64) -> CostFile {
    CostFile {
        layers: costs.layers.iter().map(|l| l.scaled(factor)).collect(),
        ..costs.clone()
    }
}

/// Plans `auto` for every `M` of `request` (`V` from the placement: 1 looped, 2 V-shape): the plans,
/// and each `M` ruled out with its reason.
pub fn auto_plans(
    request: &PlanRequest,
    max_in_flight: Option<f64>,
    args: &AutoArgs,
) -> (Vec<Plan>, Vec<Skipped>) {
    let chunks = if args.steer.placement == Placement::Vshape {
        2
    } else {
        1
    };
    let limit = request
        .memory_limit
        .map(MemoryLimit::Bytes)
        .or(max_in_flight.map(MemoryLimit::InFlight));
    let mut plans = Vec::new();
    let mut skipped = Vec::new();
    // Each of the D replicas runs its share of the batch, as the families are planned.
    let batch = request.replica_batch();
    let ms: Vec<usize> = (1..=batch.min(request.max_microbatches.max(1)))
        .filter(|m| batch % m == 0)
        .collect();
    for m in ms {
        let size = batch / m;
        let costs = scaled(&request.costs, size as f64 / request.cost_batch);
        let shape = Shape {
            ranks: request.ranks,
            microbatches: m,
            chunks,
        };
        let attempt = auto_schedule(&costs, shape, limit, args).and_then(|s| {
            best_partition_replicated(&costs, &s, request.memory_limit, request.data_parallel)
                .map_err(|e| CliError::Usage(e.to_string()))
        });
        match attempt {
            Ok(mut plan) => {
                plan.microbatch_size = size;
                plans.push(plan);
            }
            Err(e) => skipped.push(Skipped {
                family: AUTO.to_string(),
                chunks,
                microbatches: m,
                reason: e.to_string(),
            }),
        }
    }
    (plans, skipped)
}
