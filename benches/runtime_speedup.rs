//! Bench command: does a 2-rank 1F1B run reach the speedup the simulator predicts?
//!
//! Trains the built-in model (8 layers, 512 wide, batch 256 in 8 microbatches) both ways, same
//! weights and data:
//! - sequential: [`sequential_step`] on one thread (the same work, no pipeline);
//! - pipelined: the executor with `1f1b` on 2 ranks, waiting ranks polling for
//!   [`default_poll`] before they block (the fifth argument sets the poll in µs instead, for an
//!   A/B run: `30` is the executor's old, blocking behaviour).
//!
//! From the pipelined run's median step it takes every action's measured duration, builds a cost
//! model (per stage, mean F and B), and asks the simulator for the makespan. Predicted speedup =
//! (sum of the measured action durations) / (simulated makespan); measured speedup = (sequential
//! step time) / (pipelined step time), medians over the timed steps. It prints both and their ratio
//! (the issue asks for >= 90%). Run it with two free cores:
//!
//! ```sh
//! cargo bench --bench runtime_speedup      # optional args: ranks microbatches hidden steps poll_us
//! cargo bench --bench runtime_speedup -- --quick                # 5 timed steps instead of 15
//! ```
//!
//! As every bench, it takes criterion's flags (`--save-baseline NAME`, `--baseline NAME`, `--quick`,
//! a filter, which is any non-numeric positional argument) and prints one `pipefill-bench` line per
//! figure (docs/benchmarks.md, "Benchmarks as a regression run").
//!
//! Like the `pipefill` command, it first calls [`pipefill::alloc::keep_freed_memory`];
//! `PIPEFILL_DEFAULT_MALLOC=1` leaves glibc's defaults, for an A/B run.

use std::process::ExitCode;
use std::time::Duration;

use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LossKind, Optimizer};
use pipefill::model::{stage_ranges, ModelSpec, Teacher};
use pipefill_host::cost::{split_even, CostModel, LinkCost, StageCost};
use pipefill_host::profile::median;
use pipefill_host::runtime::{default_poll, sequential_step, Executor};
use pipefill_host::schedule::{families, Params};
use pipefill_kernels::Activation;

/// Relative change that counts as a regression (the spread of two runs on an unchanged tree is in
/// docs/measurements.md, "The benches as a regression run").
const THRESHOLD: f64 = 0.10;

#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

use support::stats::Spread;

/// The bench's own numbers: `ranks microbatches hidden steps [poll_us]`, from the numeric positional
/// arguments (a non-numeric one is criterion's filter).
struct Setup {
    ranks: usize,
    m: usize,
    hidden: usize,
    steps: usize,
    warmup: usize,
    poll: Option<Duration>,
}

impl Setup {
    fn from_args(positional: &[String], quick: bool) -> Self {
        let nums: Vec<u64> = positional.iter().filter_map(|a| a.parse().ok()).collect();
        let at = |i: usize, default: usize| nums.get(i).map_or(default, |&n| n as usize);
        Self {
            ranks: at(0, 2),
            m: at(1, 8),
            hidden: at(2, 512),
            // `--quick`: a third of the timed steps, one warm-up step.
            steps: at(3, if quick { 5 } else { 15 }).max(1),
            warmup: if quick { 1 } else { 3 },
            poll: nums.get(4).map(|&us| Duration::from_micros(us)),
        }
    }

    /// The prefix of this setup's figures, e.g. `runtime_speedup/P2-M8-h512`.
    fn name(&self) -> String {
        format!(
            "runtime_speedup/P{}-M{}-h{}",
            self.ranks, self.m, self.hidden
        )
    }
}

/// What one run measured (medians over the timed steps).
struct Figures {
    t_seq: f64,
    t_par: f64,
    /// The timed steps' spread: median, its confidence interval, minimum.
    seq_spread: Option<Spread>,
    par_spread: Option<Spread>,
    work: f64,
    sim: f64,
    makespan: f64,
    poll: Duration,
}

fn measure(s: &Setup) -> Result<Figures, Box<dyn std::error::Error>> {
    let poll = s.poll.unwrap_or(default_poll(s.ranks));
    let spec = ModelSpec::uniform(8, s.hidden, 16, Activation::Gelu, LossKind::Mse, 32 * s.m)?;
    let schedule = families::generate("1f1b", &Params::new(s.ranks, s.m))?;
    let stage_ranges = stage_ranges(&split_even(spec.layers.len(), schedule.stages())?);
    let opt = Optimizer::adamw(1e-3);
    let gemm = GemmBackend::default();
    let teacher = Teacher::new(&spec, 0);

    // Alternate the two, step by step, so that load from other processes hits both alike.
    let mut seq = spec.build_stages(&stage_ranges, opt, gemm, 0)?;
    let mut ex = Executor::new(
        schedule.clone(),
        spec.build_stages(&stage_ranges, opt, gemm, 0)?,
    )?;
    ex.set_poll(poll);
    let mut seq_times = Vec::new();
    let mut reports = Vec::new();
    for step in 0..s.warmup + s.steps {
        let (x, t) = teacher.batch(step as u64, spec.batch, s.m);
        let q = sequential_step(&mut seq, x.clone(), &t, &spec.loss)?;
        let mut r = ex.step(x, &t, &spec.loss)?;
        // The optimizer is the trainer's call after the step; a training step includes it, as
        // the sequential one does.
        let optimizer = std::time::Instant::now();
        ex.optimizer_step()?;
        r.seconds += optimizer.elapsed().as_secs_f64();
        if step >= s.warmup {
            seq_times.push(q.seconds);
            reports.push(r);
        }
    }
    let par_times: Vec<f64> = reports.iter().map(|r| r.seconds).collect();
    let (seq_spread, par_spread) = (Spread::of(&seq_times), Spread::of(&par_times));
    reports.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let mid = &reports[reports.len() / 2];
    let base = CostModel::uniform(
        StageCost::uniform(0.0, 0.0, 0.0),
        schedule.stages(),
        LinkCost::default(),
    );
    let cost = base.with_durations(&mid.action_seconds);
    Ok(Figures {
        t_seq: median(&mut seq_times),
        t_par: mid.seconds,
        seq_spread,
        par_spread,
        work: mid.action_seconds.iter().map(|(_, t)| t).sum(),
        sim: pipefill_host::sim::simulate(&schedule, &cost)?
            .timeline
            .makespan(),
        makespan: mid.timeline.makespan(),
        poll,
    })
}

fn print(s: &Setup, f: &Figures, kept: bool) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let (predicted, measured) = (f.work / f.sim, f.t_seq / f.t_par);
    println!(
        "1f1b P={} M={}, 8 layers x {}, batch {}, {} timed steps, {cores} cores, \
         load average {}, waiting ranks poll {:?}, malloc keeps freed memory: {kept}",
        s.ranks,
        s.m,
        s.hidden,
        32 * s.m,
        s.steps,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        f.poll
    );
    println!(
        "sequential step (median):          {:>9.3} ms",
        f.t_seq * 1e3
    );
    println!(
        "pipelined step (median):           {:>9.3} ms",
        f.t_par * 1e3
    );
    println!(
        "  of which layer work (all ranks): {:>9.3} ms",
        f.work * 1e3
    );
    println!("  simulated makespan from it:      {:>9.3} ms", f.sim * 1e3);
    println!(
        "  measured timeline makespan:      {:>9.3} ms",
        f.makespan * 1e3
    );
    println!(
        "  outside the schedule:            {:>9.3} ms (zero_grad, optimizer step, thread start and join)",
        (f.t_par - f.makespan) * 1e3
    );
    for (what, spread) in [("sequential", &f.seq_spread), ("pipelined", &f.par_spread)] {
        if let Some(sp) = spread {
            println!("{what} steps: {}", sp.describe(1e3, "ms"));
        }
    }
    println!("measured speedup:  {measured:.3}x");
    println!("predicted speedup: {predicted:.3}x");
    println!("measured / predicted: {:.1}%", measured / predicted * 100.0);
}

fn main() -> ExitCode {
    let mut run = support::Run::start("runtime_speedup");
    let setup = Setup::from_args(&run.args.positional, run.quick());
    let filter = run
        .args
        .positional
        .iter()
        .find(|a| a.parse::<u64>().is_err());
    let name = setup.name();
    if !run.should_measure(filter.map(String::as_str), &[&name]) {
        return ExitCode::SUCCESS;
    }
    // As the `pipefill` command does (see `pipefill::alloc`); PIPEFILL_DEFAULT_MALLOC=1 skips it.
    let kept = std::env::var_os("PIPEFILL_DEFAULT_MALLOC").is_none()
        && pipefill::alloc::keep_freed_memory();
    let f = match measure(&setup) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: bench runtime_speedup: {e}");
            return ExitCode::from(2);
        }
    };
    print(&setup, &f, kept);
    run.lower(&format!("{name}/sequential_step"), f.t_seq, "s", THRESHOLD);
    run.lower(&format!("{name}/pipelined_step"), f.t_par, "s", THRESHOLD);
    run.higher(
        &format!("{name}/measured_speedup"),
        f.t_seq / f.t_par,
        "x",
        THRESHOLD,
    );
    run.higher(
        &format!("{name}/predicted_speedup"),
        f.work / f.sim,
        "x",
        THRESHOLD,
    );
    run.finish()
}
