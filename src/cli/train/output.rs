//! What `pipefill train` shows and writes: progress, the text summary, the JSON object, the SVG and
//! the trace.

use indicatif::{ProgressBar, ProgressStyle};
use pipefill_host::timeline::Timeline;
use pipefill_host::trace::{svg_gantt, write_chrome_trace, SvgOptions};
use serde_json::json;

use pipefill_host::profile::median;

use pipefill_host::plan::Plan;

use super::{Chosen, CliError, Outcome, Setup};
use crate::cli::output::{write_atomic, write_atomic_with};
use crate::trainer::HostEnqueue;

/// Progress: a bar on a terminal, plain lines otherwise (on stderr, so stdout stays the result).
pub struct Progress {
    bar: Option<ProgressBar>,
    steps: usize,
    lines: bool,
}

impl Progress {
    /// A progress display for `steps` steps; a bar only if `bar`, else a line a step if `lines`.
    pub fn new(steps: usize, bar: bool, lines: bool) -> Self {
        let bar = bar.then(|| {
            let b = ProgressBar::new(steps as u64);
            if let Ok(style) =
                ProgressStyle::with_template("train {bar:30} {pos}/{len} steps  {msg}")
            {
                b.set_style(style);
            }
            b
        });
        Progress { bar, steps, lines }
    }

    /// Starts the count at `done` steps (a resumed run).
    pub fn skip(&mut self, done: usize) {
        if let Some(b) = &self.bar {
            b.set_position(done as u64);
        }
    }
}

impl crate::trainer::Progress for Progress {
    fn step(&mut self, step: usize, loss: f32, seconds: f64) {
        match &self.bar {
            Some(b) => {
                b.set_message(format!("loss {loss:.5}  {:.1} ms/step", seconds * 1e3));
                b.inc(1);
            }
            None if self.lines => eprintln!(
                "step {:>3}/{}  loss {loss:.6}  {:.2} ms",
                step + 1,
                self.steps,
                seconds * 1e3
            ),
            None => {}
        }
    }

    /// Removes the bar.
    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// Writes the SVG (measured, then predicted from the profile, then from the run's own action
/// durations unless `--replay`) and, with `--trace`, the Chrome trace of the same timelines.
pub fn write_files(setup: &Setup, chosen: &Chosen, outcome: &Outcome) -> Result<(), CliError> {
    let named = |t: &Timeline, how: &str| {
        let mut t = t.clone();
        t.name = format!("{}, {how}", t.name);
        t
    };
    let mut all = vec![
        outcome.measured.clone(),
        named(&chosen.predicted, "from the profile"),
    ];
    // With --replay the measured timeline is already the one from the run's durations.
    if !setup.args.replay {
        all.push(named(
            &outcome.resimulated,
            "from this run's action durations",
        ));
    }
    let options = SvgOptions {
        title: format!(
            "pipefill train: {} on {} ranks, M = {} (measured, then predicted)",
            chosen.plan.family, chosen.plan.schedule.ranks, chosen.plan.microbatches
        ),
        rebuild_share: vec![rebuild_shares(&chosen.plan, outcome); all.len()],
        ..SvgOptions::default()
    };
    let all: Vec<&Timeline> = all.iter().collect();
    let svg = svg_gantt(&all, &options);
    write_atomic("--svg", &setup.args.svg, svg)?;
    if let Some(path) = &setup.args.trace {
        write_atomic_with("--trace", path, |w| write_chrome_trace(&all, w))?;
    }
    Ok(())
}

/// Per stage, the share of its `I` (or, where the schedule has no `I` on it, `B`) spent on
/// rebuilding its stash: as the run measured it where the runner timed the rebuild apart
/// ([`Outcome::rebuild_share`]), else from the plan's costs
/// ([`CostModel::rebuild_shares`](pipefill_host::cost::CostModel::rebuild_shares); 0 without
/// recomputation): what the SVG hatches.
fn rebuild_shares(plan: &Plan, outcome: &Outcome) -> Vec<f64> {
    if outcome.rebuild_share.iter().any(|&s| s > 0.0) {
        return outcome.rebuild_share.clone();
    }
    plan.cost.rebuild_shares(&plan.schedule)
}

/// The rank threads of the run: ranks times replicas.
pub fn threads(setup: &Setup) -> usize {
    setup.args.ranks * setup.args.data_parallel.max(1)
}

/// Whether the measured timeline tells waiting from being descheduled: the CPU runner's threads
/// read their CPU clocks; `--replay` rebuilds the timeline, and CUDA streams have no such clock.
fn splits_lost_time(setup: &Setup) -> bool {
    setup.backend == crate::cli::profile::Backend::Cpu && !setup.args.replay
}

/// Per rank, the shares of the measured makespan spent waiting for data and descheduled (ready
/// but not running); the last entry is over all ranks.
fn lost_shares(t: &Timeline) -> Vec<[f64; 2]> {
    let m = t.makespan();
    let share = |v: f64, n: usize| if m > 0.0 { v / (n as f64 * m) } else { 0.0 };
    let p = t.ranks();
    let mut v: Vec<[f64; 2]> = (0..p)
        .map(|r| [share(t.waiting(r), 1), share(t.descheduled(r), 1)])
        .collect();
    let all = |f: &dyn Fn(usize) -> f64| share((0..p).map(f).sum(), p.max(1));
    v.push([all(&|r| t.waiting(r)), all(&|r| t.descheduled(r))]);
    v
}

/// Per-rank bubble fractions: measured, predicted from the profile, resimulated from the run.
fn bubbles(outcome: &Outcome, predicted: &Timeline) -> Vec<[f64; 3]> {
    (0..outcome.measured.ranks())
        .map(|r| {
            [
                outcome.measured.rank_bubble_fraction(r),
                predicted.rank_bubble_fraction(r),
                outcome.resimulated.rank_bubble_fraction(r),
            ]
        })
        .collect()
}

/// The human-readable summary on stdout.
pub fn print_text(setup: &Setup, candidates: &[Plan], chosen: &Chosen, outcome: &Outcome) {
    print_setup(setup);
    print_candidates(setup, candidates, chosen);
    print_outcome(setup, chosen, outcome);
}

/// The model, and a warning when ranks share cores.
fn print_setup(setup: &Setup) {
    let a = &setup.args;
    let s = &setup.spec;
    // With replicas, each runs its share of the batch in M microbatches.
    let d = a.data_parallel.max(1);
    let split = if d > 1 {
        format!(
            "batch {} over {d} replicas: {} each in {} microbatches of {}",
            s.batch,
            s.batch / d,
            a.microbatches,
            s.batch / d / a.microbatches
        )
    } else {
        format!(
            "batch {} in {} microbatches of {}",
            s.batch,
            a.microbatches,
            s.batch / a.microbatches
        )
    };
    println!(
        "model: {} layers, {} -> {} wide, {:.2} M parameters, loss {}, {split}",
        s.layers.len(),
        s.input,
        s.outputs(),
        s.parameters() as f64 / 1e6,
        s.loss,
    );
    if a.ranks > setup.cores {
        println!(
            "warning: {} ranks on {} cores: the ranks share cores, so the measured timeline is \
             distorted by time sharing{}",
            a.ranks,
            setup.cores,
            if a.replay {
                "; --replay rebuilds it from per-action durations measured one at a time"
            } else {
                "; rerun with --replay to rebuild it from per-action durations measured one at a time"
            }
        );
    }
}

/// The host planner's candidates, best first, and the one chosen.
fn print_candidates(setup: &Setup, candidates: &[Plan], chosen: &Chosen) {
    println!(
        "candidates (predicted from the profile, {} split):",
        match setup.args.plan {
            super::TrainPlan::Auto => "--plan auto",
            super::TrainPlan::Uniform => "uniform",
        }
    );
    println!(
        "  {:<18} {:>2} {:>3} {:>12} {:>8}",
        "schedule", "V", "S", "step", "bubble"
    );
    for c in candidates {
        println!(
            "  {:<18} {:>2} {:>3} {:>9.2} ms {:>7.1}%{}",
            c.family,
            c.chunks,
            c.schedule.stages(),
            c.step_time * 1e3,
            c.bubble_fraction * 100.0,
            if c == &chosen.plan { "  <- chosen" } else { "" }
        );
    }
    if let Some(t) = &chosen.near_tie {
        println!(
            "  near-tie: {} candidates within {:.1}% of the fastest ({}), the profile's spread \
             {:.1}%; chosen by the rule: {}",
            t.candidates,
            100.0 * t.window,
            t.fastest,
            100.0 * t.spread,
            t.rule
        );
    }
}

/// Losses, step time, bubbles per rank, and the files written.
fn print_outcome(setup: &Setup, chosen: &Chosen, outcome: &Outcome) {
    let a = &setup.args;
    let first = outcome.losses.first().copied().unwrap_or(0.0);
    let last = outcome.losses.last().copied().unwrap_or(0.0);
    if let Some(r) = &setup.resume {
        println!(
            "resumed from `{}` after step {} (its schedule and partition)",
            r.folder.display(),
            r.step()
        );
    }
    println!(
        "trained {} steps with {} (P = {}, V = {}, M = {}): loss {first:.6} -> {last:.6} ({})",
        outcome.losses.len(),
        chosen.plan.family,
        chosen.plan.schedule.ranks,
        chosen.plan.chunks,
        chosen.plan.microbatches,
        if last < first {
            "falling"
        } else {
            "NOT falling"
        }
    );
    let step = median(&mut outcome.step_seconds.clone());
    println!(
        "step time: {:.2} ms median (timeline {:.2} ms; predicted {:.2} ms from the profile, \
         {:.2} ms from this run's action durations; {:.2} ms of layer work)",
        step * 1e3,
        outcome.measured.makespan() * 1e3,
        chosen.predicted.makespan() * 1e3,
        outcome.resimulated.makespan() * 1e3,
        outcome.work_seconds * 1e3
    );
    println!(
        "held: peak activation bytes per rank {:?} (measured; recomputation per stage: {})",
        outcome.peak_held_bytes,
        recompute_names(chosen)
    );
    let split = splits_lost_time(setup);
    let lost = lost_shares(&outcome.measured);
    let cell = |r: usize| match (split, lost.get(r)) {
        (true, Some([w, d])) => format!("   {:>7.1}%  {:>10.1}%", w * 100.0, d * 100.0),
        _ => String::new(),
    };
    println!(
        "bubble{}:   measured  predicted  from run{}",
        if a.replay { " (replayed)" } else { "" },
        if split {
            "    waiting  descheduled"
        } else {
            ""
        }
    );
    let ranks = outcome.measured.ranks();
    for (r, [m, p, x]) in bubbles(outcome, &chosen.predicted).iter().enumerate() {
        println!(
            "  rank {r:<3}   {:>7.1}%   {:>7.1}%  {:>7.1}%{}",
            m * 100.0,
            p * 100.0,
            x * 100.0,
            cell(r)
        );
    }
    println!(
        "  all        {:>7.1}%   {:>7.1}%  {:>7.1}%{}",
        outcome.measured.bubble_fraction() * 100.0,
        chosen.predicted.bubble_fraction() * 100.0,
        outcome.resimulated.bubble_fraction() * 100.0,
        cell(ranks)
    );
    println!(
        "  (predicted: the simulator on the profiled costs; from run: the simulator on this run's \
         mean action durations)"
    );
    if split {
        println!(
            "  (of the measured makespan, from the threads' CPU clocks: waiting for data (also for \
             a rank that was descheduled), and descheduled: ready but not running, lost to other \
             work on the machine; the rest is compute)"
        );
    }
    if let Some(free) = split
        .then(|| outcome.measured.without_time_sharing())
        .flatten()
    {
        let (m, f) = (outcome.measured.makespan(), free.makespan());
        println!(
            "without time-sharing: {:.2} ms, bubble {:.1}% (each item for its CPU time, in the same \
             order): {:.2} ms of the {:.2} ms timeline ({:.1}%) went to other work on the machine \
             and the runtime between items",
            f * 1e3,
            free.bubble_fraction() * 100.0,
            (m - f) * 1e3,
            m * 1e3,
            if m > 0.0 { (m - f) / m * 100.0 } else { 0.0 }
        );
    }
    println!(
        "wrote {} (measured, then predicted from the profile and from the run)",
        a.svg.display()
    );
    if let Some(t) = &a.trace {
        println!(
            "wrote {} (Chrome trace: open in ui.perfetto.dev)",
            t.display()
        );
    }
    if let Some(h) = &outcome.host_enqueue {
        print_host_enqueue(h);
    }
}

/// Each stage's recomputation mode, by stage (`none none full ...`).
fn recompute_names(chosen: &Chosen) -> String {
    let modes = chosen.plan.cost.recompute();
    modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(" ")
}

/// The stream runner (`--backend cuda`): the host's enqueue time per action, plain and replayed (`--graph`).
fn print_host_enqueue(h: &HostEnqueue) {
    let us = |v: &[f64]| median(&mut v.to_vec()) * 1e6;
    let ms = |v: &[f64]| median(&mut v.to_vec()) * 1e3;
    if !h.plain.is_empty() {
        println!(
            "host enqueue: {:.2} us per action without a graph (median of {} plain steps, {} \
             actions each; step time {:.2} ms)",
            us(&h.plain),
            h.plain.len(),
            h.actions,
            ms(&h.plain_steps)
        );
    }
    if let (Some(at), false) = (h.captured_at, h.graph.is_empty()) {
        println!(
            "host enqueue: {:.2} us per action with the graph (median of {} replays of the step \
             captured at step {at}; step time {:.2} ms)",
            us(&h.graph),
            h.graph.len(),
            ms(&h.graph_steps)
        );
        println!(
            "  (a graph step is not timed inside: its timeline and action times above are the \
             last plain step's)"
        );
    }
}

/// The JSON value of [`HostEnqueue`] (medians; `null` where no step of that kind ran).
fn host_enqueue_json(h: &HostEnqueue) -> serde_json::Value {
    let med = |v: &[f64]| (!v.is_empty()).then(|| median(&mut v.to_vec()));
    json!({
        "actions": h.actions,
        "plain_per_action_s": med(&h.plain),
        "graph_per_action_s": med(&h.graph),
        "plain_step_time_s": med(&h.plain_steps),
        "graph_step_time_s": med(&h.graph_steps),
        "plain_steps": h.plain.len(),
        "graph_steps": h.graph.len(),
        "captured_at_step": h.captured_at,
    })
}

/// The JSON object on stdout (keys documented in docs/formats.md).
pub fn print_json(setup: &Setup, candidates: &[Plan], chosen: &Chosen, outcome: &Outcome) {
    let a = &setup.args;
    let m = &outcome.measured;
    let b = bubbles(outcome, &chosen.predicted);
    let x = &outcome.resimulated;
    let mut value = json!({
        "schedule": chosen.plan.family,
        "ranks": chosen.plan.schedule.ranks,
        "chunks": chosen.plan.chunks,
        "microbatches": chosen.plan.microbatches,
        "stages": chosen.plan.schedule.stages(),
        "layers_per_stage": chosen.plan.layers_per_stage,
        "partition": chosen.plan.partition,
        "overlap_share": chosen.plan.cost.overlap_share,
        "plan": a.plan.name(),
        "steps": a.steps,
        "seed": a.seed,
        "losses": outcome.losses,
        "step_time_s": median(&mut outcome.step_seconds.clone()),
        "step_times_s": outcome.step_seconds,
        "makespan_measured_s": m.makespan(),
        "makespan_predicted_s": chosen.predicted.makespan(),
        "work_s": outcome.work_seconds,
        "bubble_measured": m.bubble_fraction(),
        "bubble_predicted": chosen.predicted.bubble_fraction(),
        "bubble_measured_per_rank": b.iter().map(|v| v[0]).collect::<Vec<_>>(),
        "bubble_predicted_per_rank": b.iter().map(|v| v[1]).collect::<Vec<_>>(),
        "makespan_resimulated_s": x.makespan(),
        "bubble_resimulated": x.bubble_fraction(),
        "bubble_resimulated_per_rank": b.iter().map(|v| v[2]).collect::<Vec<_>>(),
        "busy_s": (0..m.ranks()).map(|r| m.busy(r)).collect::<Vec<_>>(),
        "idle_s": (0..m.ranks()).map(|r| m.idle(r)).collect::<Vec<_>>(),
        "replay": a.replay,
        "data_parallel": a.data_parallel.max(1),
        "microbatch_size": setup.spec.batch / a.data_parallel.max(1) / a.microbatches.max(1),
        "cores": setup.cores,
        "time_shared": a.ranks > setup.cores,
        "candidates": candidates.iter().map(|c| json!({
            "schedule": c.family,
            "chunks": c.chunks,
            "step_time_predicted_s": c.step_time,
            "bubble_predicted": c.bubble_fraction,
        })).collect::<Vec<_>>(),
        "model": {
            "layers": setup.spec.layers.len(),
            "input": setup.spec.input,
            "outputs": setup.spec.outputs(),
            "parameters": setup.spec.parameters(),
            "batch": setup.spec.batch,
            "loss": setup.spec.loss.name(),
            "optimizer": setup.optimizer.name(),
            "gemm": setup.gemm.name(),
        },
        "svg": a.svg.display().to_string(),
        "trace": a.trace.as_ref().map(|p| p.display().to_string()),
    });
    // Apart from the object above, which is at serde_json's macro recursion limit.
    value["first_step"] = json!(outcome.first_step);
    value["recompute"] = json!(chosen.plan.cost.recompute());
    value["peak_held_bytes"] = json!(outcome.peak_held_bytes);
    value["rebuild_seconds"] = json!(outcome.rebuild_seconds);
    value["near_tie"] = json!(chosen.near_tie);
    value["graph"] = json!(a.graph);
    value["devices"] = setup
        .devices
        .as_ref()
        .map_or(serde_json::Value::Null, |d| d.json());
    value["host_enqueue"] = outcome
        .host_enqueue
        .as_ref()
        .map_or(serde_json::Value::Null, host_enqueue_json);
    if splits_lost_time(setup) {
        let lost = lost_shares(m);
        let all = lost.last().copied().unwrap_or_default();
        value["compute_s"] = json!((0..m.ranks()).map(|r| m.compute(r)).collect::<Vec<_>>());
        value["waiting_s"] = json!((0..m.ranks()).map(|r| m.waiting(r)).collect::<Vec<_>>());
        value["descheduled_s"] =
            json!((0..m.ranks()).map(|r| m.descheduled(r)).collect::<Vec<_>>());
        value["waiting"] = json!(all[0]);
        value["descheduled"] = json!(all[1]);
        let free = m.without_time_sharing();
        value["makespan_without_time_sharing_s"] = json!(free.as_ref().map(Timeline::makespan));
        value["bubble_without_time_sharing"] = json!(free.as_ref().map(Timeline::bubble_fraction));
    } else {
        for key in [
            "compute_s",
            "waiting_s",
            "descheduled_s",
            "waiting",
            "descheduled",
            "makespan_without_time_sharing_s",
            "bubble_without_time_sharing",
        ] {
            value[key] = serde_json::Value::Null;
        }
    }
    value["load"] = json!(setup.load.map(|l| json!({
        "load_average": l.load_average,
        "runnable": l.runnable,
        "loaded": l.loaded(setup.cores, threads(setup)),
    })));
    value["resumed_from"] = json!(setup
        .resume
        .as_ref()
        .map(|r| r.folder.display().to_string()));
    value["checkpoint"] = json!(a
        .checkpoint
        .checkpoint
        .as_ref()
        .map(|p| p.display().to_string()));
    println!("{value}");
}
