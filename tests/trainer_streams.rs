//! The one training loop (`pipefill::trainer::train`) over the stream runner on the CPU twin of the
//! CUDA path (`CpuStreams`: one worker thread per stream, events as flags, the host layers), which
//! is what `train --backend cuda` runs, with data parallelism, checkpoints and a captured graph,
//! compared with the threaded runner (`train --backend cpu`):
//! - `D = 2` replicas on the streams give losses bit-equal to the threaded replicas (the same
//!   microbatches, the same gradient mean summed in replica order, the same optimizer);
//! - a run saved after 3 steps and resumed, on the streams or on the threads, continues with the
//!   losses of the uninterrupted run, bit for bit; the checkpoint holds replica 0's stages;
//! - a captured and replayed step (`--graph`) gives the plain steps' losses;
//! - full recomputation on the streams (`train --backend cuda --recompute full`'s twin), plain
//!   and captured, gives the threaded run's losses without it, bit for bit.

use std::path::{Path, PathBuf};

use pipefill::checkpoint::{self, learning_rate, store, Manifest, ModelShape, FORMAT};
use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::{stage_ranges, ModelSpec, Teacher};
use pipefill::trainer::streams::CpuUpload;
use pipefill::trainer::{train, Outcome, Run, Saver, Silent, StepRunner, Streams, Threads};
use pipefill_host::cost::{CostFile, LayerCost, LinkCost, Recompute};
use pipefill_host::plan::{plan_schedule, Plan, Split};
use pipefill_host::runtime::streams::CpuStreams;
use pipefill_host::runtime::Executor;
use pipefill_host::schedule::{families, Params};
use pipefill_kernels::Activation;

const SEED: u64 = 5;
const M: usize = 4;

fn optimizer() -> Optimizer {
    Optimizer::adamw(0.01)
}

/// A 4-layer model (batch 32: `M x D` microbatches of 4 rows for `D = 2`) and the plan of a
/// family on 2 ranks (uniform split) under flat costs.
struct Case {
    spec: ModelSpec,
    plan: Plan,
    /// Each stage's recomputation mode on the runners (empty: none).
    recompute: Vec<Recompute>,
}

impl Case {
    fn new(family: &str) -> Self {
        let spec = ModelSpec::uniform(4, 12, 3, Activation::Gelu, LossKind::Mse, 32).unwrap();
        let costs = CostFile {
            layers: (0..4)
                .map(|i| LayerCost::new(format!("l{i}"), 1.0, 1.0, 0.5))
                .collect(),
            transfer: LinkCost::default(),
            overlap_share: 1.0,
            meta: serde_json::Value::Null,
        };
        let mut params = Params::new(2, M);
        params.chunks = (family == "zbv").then_some(2);
        let schedule = families::generate(family, &params).unwrap();
        let plan = plan_schedule(&costs, &schedule, Split::Uniform, None).unwrap();
        Case {
            spec,
            plan,
            recompute: Vec::new(),
        }
    }

    /// The model's stages with the seed's weights, or the checkpoint's state in `resume`.
    fn stages(&self, resume: Option<&Path>) -> Vec<LinearStage> {
        let ranges = stage_ranges(&self.plan.layers_per_stage);
        let mut s = (self.spec)
            .build_stages(&ranges, optimizer(), GemmBackend::Matrixmultiply, SEED)
            .unwrap();
        if let Some(dir) = resume {
            let (folder, manifest) = store::latest(dir).unwrap().expect("a checkpoint");
            let ranks = store::load_ranks(&folder, &manifest).unwrap();
            checkpoint::restore(&folder, ranks, &self.plan.schedule, &mut s).unwrap();
        }
        s
    }

    /// The threaded runner (`train --backend cpu`) with `d` replicas.
    fn threads(&self, d: usize, resume: Option<&Path>) -> Box<dyn StepRunner> {
        let schedule = &self.plan.schedule;
        let executors = (0..d)
            .map(|_| Executor::new(schedule.clone(), self.stages(resume)).unwrap())
            .collect();
        Box::new(Threads::new(executors, self.spec.loss, M).unwrap())
    }

    /// The stream runner on `CpuStreams` with `d` replicas, each rank on its own device (the
    /// per-rank GPUs' twin: every crossing payload is adopted by the next device).
    fn streams(&self, d: usize, graph: bool, resume: Option<&Path>) -> Box<dyn StepRunner> {
        let schedule = &self.plan.schedule;
        let replicas = (0..d)
            .map(|_| {
                let device = CpuStreams::with_devices((0..schedule.ranks).collect());
                let on = self.stages(resume);
                let on = on.into_iter().map(|s| device.stage(s)).collect();
                let loss = device.loss(self.spec.loss);
                (on, device, loss)
            })
            .collect();
        let runner = Streams::new(schedule, replicas, CpuUpload, M, graph).unwrap();
        Box::new(runner.recomputing(&self.recompute))
    }

    /// Saves into `dir` after step `steps`.
    fn saver(&self, dir: &Path, steps: usize) -> Saver {
        let base = Manifest {
            format: FORMAT.into(),
            version: checkpoint::FORMAT_VERSION,
            step: 0,
            seed: SEED,
            model: ModelShape::of(&self.spec),
            optimizer: optimizer().name().into(),
            lr: learning_rate(&optimizer()),
            activations: "f32".into(),
            plan: self.plan.clone(),
            files: Vec::new(),
        };
        Saver::new(dir.to_path_buf(), None, steps, base)
    }

    /// Trains steps `first..steps` of `d` replicas with `runner` through the loop.
    fn outcome(
        &self,
        d: usize,
        (first, steps): (usize, usize),
        saver: Option<&Saver>,
        mut runner: Box<dyn StepRunner>,
    ) -> Outcome {
        let teacher = Teacher::new(&self.spec, SEED);
        let run = Run {
            plan: &self.plan,
            teacher: &teacher,
            batch: self.spec.batch,
            microbatches: M * d,
            first_step: first,
            steps,
            saver,
            replay: false,
        };
        let outcome = train(&run, runner.as_mut(), &mut Silent).unwrap();
        let outcome = outcome.expect("a report");
        assert_eq!(outcome.first_step, first);
        outcome
    }

    /// [`Case::outcome`]'s losses, as bits.
    fn losses(
        &self,
        d: usize,
        span: (usize, usize),
        saver: Option<&Saver>,
        runner: Box<dyn StepRunner>,
    ) -> Vec<u32> {
        let o = self.outcome(d, span, saver, runner);
        o.losses.iter().map(|l| l.to_bits()).collect()
    }
}

/// A checkpoint folder for this test process (emptied).
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pipefill-trainer-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn replicas_on_the_streams_train_as_the_threaded_replicas() {
    for family in ["1f1b", "zbv"] {
        let c = Case::new(family);
        for d in [1, 2] {
            let threaded = c.losses(d, (0, 5), None, c.threads(d, None));
            let streamed = c.losses(d, (0, 5), None, c.streams(d, false, None));
            assert_eq!(streamed, threaded, "{family}, D = {d}");
            // The loss falls: the replicas' averaged gradients train the model.
            let f = |b: u32| f32::from_bits(b);
            assert!(
                f(threaded[4]) < f(threaded[0]),
                "{family}, D = {d}: {threaded:?}"
            );
        }
        // Two replicas are not one: the comparison above can fail.
        let one = c.losses(1, (0, 3), None, c.threads(1, None));
        let two = c.losses(2, (0, 3), None, c.threads(2, None));
        assert_ne!(one, two, "{family}");
    }
}

#[test]
fn a_run_saved_on_the_streams_resumes_on_either_runner_with_the_same_losses() {
    let c = Case::new("1f1b");
    let d = 2;
    let whole = c.losses(d, (0, 6), None, c.threads(d, None));
    let dir = scratch("resume");
    let saver = c.saver(&dir, 3);
    let first = c.losses(d, (0, 3), Some(&saver), c.streams(d, false, None));
    assert_eq!(first, whole[..3], "before the checkpoint");
    let (_, manifest) = store::latest(&dir)
        .unwrap()
        .expect("a checkpoint after step 3");
    assert_eq!(manifest.step, 3);
    assert_eq!(manifest.files.len(), c.plan.schedule.ranks);
    let on_streams = c.streams(d, false, Some(&dir));
    let on_threads = c.threads(d, Some(&dir));
    for (name, runner) in [("streams", on_streams), ("threads", on_threads)] {
        let rest = c.losses(d, (3, 6), None, runner);
        assert_eq!(rest, whole[3..], "resumed on the {name}");
    }
    // A fresh start is not a resume: the comparison above can fail.
    let fresh = c.losses(d, (3, 6), None, c.streams(d, false, None));
    assert_ne!(fresh, whole[3..]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn captured_steps_with_replicas_train_as_plain_ones() {
    let c = Case::new("1f1b");
    let d = 2;
    let plain = c.losses(d, (0, 6), None, c.threads(d, None));
    let outcome = c.outcome(d, (0, 6), None, c.streams(d, true, None));
    let graph: Vec<u32> = outcome.losses.iter().map(|l| l.to_bits()).collect();
    assert_eq!(graph, plain);
    let host = outcome
        .host_enqueue
        .expect("the stream runner's enqueue times");
    // Steps 0 and 1 plain, step 2 captured, 3..5 replayed.
    assert_eq!(host.captured_at, Some(2));
    assert_eq!((host.plain.len(), host.graph.len()), (1, 3));
}

#[test]
fn recomputing_on_the_streams_trains_as_the_threads_without_it() {
    for family in ["1f1b", "zbv"] {
        let mut c = Case::new(family);
        let d = 2;
        let plain = c.losses(d, (0, 6), None, c.threads(d, None));
        c.recompute = vec![Recompute::Full; c.plan.schedule.stages()];
        for graph in [false, true] {
            let streamed = c.losses(d, (0, 6), None, c.streams(d, graph, None));
            assert_eq!(streamed, plain, "{family}, graph {graph}");
        }
    }
}
