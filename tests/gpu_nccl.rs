//! NCCL between two processes on one GPU (`NCCL_MULTI_RANK_GPU_ENABLE=1`): each test starts two
//! copies of itself, rank 0 writes the NCCL unique id to a file and rank 1 reads it (no MPI needed).
//! - exchange and reduce: each rank sends its buffer to the other in one group (send and receive
//!   paired), then both all-reduce (sum). Every value is checked on the host against what the other
//!   rank holds.
//! - training: each process runs its rank of a `1f1b` and a `zbv` schedule (P = 2, M = 4, two steps
//!   each) with the per-rank stream runner over NCCL ([`CudaRank`]), only its own stages on the GPU;
//!   the rank holding the last stage checks the losses against the single-process CUDA run
//!   ([`StreamExecutor`] over all stages) within a relative 1e-5.
//!
//! Without a GPU it prints `skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail instead)`
//! and passes; with `PIPEFILL_REQUIRE_GPU=1` it fails instead. Where NCCL is missing or refuses two
//! ranks on one device, it prints `NCCL refused: ...` and passes (a note, not a result).

mod gpu_support;

use std::path::PathBuf;
use std::sync::Arc;

use gpu_support::nccl::{child_rank, open_or_refuse, refused, two_ranks, unique_id};
use gpu_support::{cpu_stages, spec, upload};
use pipefill::cuda::nccl::NcclLink;
use pipefill::cuda::{CudaRank, CudaStage, CudaStreams, Gpu, Precision, RankModel};
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::{ModelSpec, Teacher};
use pipefill_host::runtime::streams::StreamExecutor;
use pipefill_host::schedule::{families, Params, Schedule};

const TEST: &str = "two_processes_exchange_and_reduce_over_nccl_on_one_gpu";

/// The two-rank harness itself (no GPU needed): when one rank fails, the other, still waiting, is
/// killed after the grace period instead of holding the test until its deadline.
#[cfg(unix)]
#[test]
fn a_failed_rank_ends_its_waiting_peer_after_the_grace() {
    use std::process::Command;
    use std::time::{Duration, Instant};
    let mut children = vec![
        Command::new("sh").args(["-c", "exit 7"]).spawn().unwrap(),
        Command::new("sleep").arg("60").spawn().unwrap(),
    ];
    let started = Instant::now();
    let codes = gpu_support::nccl::wait_all("harness", &mut children, Duration::from_secs(1));
    assert_eq!(
        codes,
        [Some(7), None],
        "the failed rank's code; the waiting one killed"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}
const TRAIN: &str = "two_processes_train_1f1b_and_zbv_over_nccl_like_one_process";
const N: usize = 1000;

fn values(rank: usize) -> Vec<f32> {
    (0..N).map(|i| (rank + 1) as f32 * i as f32).collect()
}

/// One rank: exchange with the other, then all-reduce; checked against the other rank's values.
fn child(rank: usize, id_file: PathBuf) {
    let gpu = Gpu::open(0).expect("device 0");
    let stream = gpu.new_stream().expect("a stream");
    let id = unique_id(rank, &id_file);
    let link = NcclLink::open(stream.clone(), rank, 2, id).unwrap_or_else(|e| refused(&e));
    let mine = stream.clone_htod(&values(rank)).expect("copy in");
    let mut theirs = stream.alloc_zeros::<f32>(N).expect("alloc");
    link.exchange(&mine, &mut theirs, 1 - rank)
        .expect("exchange");
    let mut sum = stream.clone_htod(&values(rank)).expect("copy in");
    link.all_reduce_sum(&mut sum).expect("all-reduce");
    let got = stream.clone_dtoh(&theirs).expect("copy out");
    let summed = stream.clone_dtoh(&sum).expect("copy out");
    stream.synchronize().expect("synchronize");
    assert_eq!(
        got,
        values(1 - rank),
        "rank {rank}: what the other rank sent"
    );
    let want: Vec<f32> = values(0)
        .iter()
        .zip(values(1))
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(summed, want, "rank {rank}: the all-reduce");
    println!("nccl rank {rank}: ok");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn two_processes_exchange_and_reduce_over_nccl_on_one_gpu() {
    if let Some((rank, id_file)) = child_rank() {
        return child(rank, id_file);
    }
    let Some(outputs) = two_ranks(TEST) else {
        return;
    };
    for (rank, out) in outputs.iter().enumerate() {
        assert!(out.contains(&format!("nccl rank {rank}: ok")), "{out}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn two_processes_train_1f1b_and_zbv_over_nccl_like_one_process() {
    if let Some((rank, id_file)) = child_rank() {
        return train_child(rank, id_file);
    }
    let Some(outputs) = two_ranks(TRAIN) else {
        return;
    };
    for family in FAMILIES {
        let checked = outputs
            .iter()
            .filter(|o| o.contains(&format!("nccl train {family}: losses equal")))
            .count();
        assert_eq!(
            checked, 1,
            "{family}: one rank checks the losses\n{outputs:?}"
        );
    }
    // For gpu-check.sh's summary.
    for line in outputs.iter().flat_map(|o| o.lines()) {
        if line.starts_with("nccl train ") && line.contains("losses equal") {
            println!("{line}");
        }
    }
}

const FAMILIES: [&str; 2] = ["1f1b", "zbv"];
const STEPS: u64 = 2;

/// The losses of `STEPS` steps of `schedule` over all `stages` in this one process.
fn one_process(gpu: &Arc<Gpu>, schedule: &Schedule, spec: &ModelSpec) -> Vec<Vec<f32>> {
    let device = CudaStreams::new(gpu.clone());
    let stages = cpu_stages(spec, schedule, Optimizer::adamw(0.01), 7)
        .iter()
        .map(|s| device.stage(CudaStage::from_host_in(gpu, s, Precision::Fp32).expect("stage")))
        .collect();
    gpu.synchronize().expect("synchronize");
    let mut ex = StreamExecutor::new(schedule.clone(), stages, device.clone()).expect("executor");
    let loss = device.loss(LossKind::Mse);
    let teacher = Teacher::new(spec, 3);
    (0..STEPS)
        .map(|step| {
            let (x, t) = teacher.batch(step, spec.batch, schedule.microbatches);
            let (x, t) = (upload(gpu, &x), upload(gpu, &t));
            let losses = ex.step(x, &t, &loss).expect("a step").losses;
            ex.optimizer_step().expect("an optimizer step");
            losses
        })
        .collect()
}

/// One rank of each family's steps over NCCL; the rank with the last stage checks the losses.
fn train_child(rank: usize, id_file: PathBuf) {
    let gpu = Gpu::open(0).expect("device 0");
    let id = unique_id(rank, &id_file);
    let mut peer = open_or_refuse(&gpu, rank, id);
    for family in FAMILIES {
        let schedule = families::generate(family, &Params::new(2, 4)).expect("a schedule");
        let spec = spec(schedule.stages(), LossKind::Mse);
        let stages = cpu_stages(&spec, &schedule, Optimizer::adamw(0.01), 7);
        let model = RankModel {
            stages: (stages.iter().enumerate())
                .filter(|(s, _)| schedule.rank_of(*s) == rank)
                .collect(),
            widths: stages.iter().map(LinearStage::outputs).collect(),
            precision: Precision::Fp32,
            loss: LossKind::Mse,
        };
        let mut me =
            CudaRank::new(&gpu, schedule.clone(), rank, model, peer).expect("the rank's runner");
        let teacher = Teacher::new(&spec, 3);
        let first = schedule.rank_of(0) == rank;
        let last = schedule.rank_of(schedule.stages() - 1) == rank;
        let mut losses = Vec::new();
        for step in 0..STEPS {
            let (x, t) = teacher.batch(step, spec.batch, schedule.microbatches);
            let rows: Vec<usize> = x.iter().map(|x| x.shape()[0]).collect();
            let inputs = if first { upload(&gpu, &x) } else { Vec::new() };
            let targets = if last { upload(&gpu, &t) } else { Vec::new() };
            let out = me.step(inputs, &targets, &rows);
            if let Err(e) = &out.result {
                panic!("rank {rank} {family} step {step}: {e:?}");
            }
            me.optimizer_step().expect("the rank's optimizer step");
            let mut l = out.losses;
            l.sort_by_key(|(k, _)| *k);
            losses.push(l.into_iter().map(|(_, v)| v).collect::<Vec<f32>>());
        }
        peer = me.into_peer();
        if !last {
            continue;
        }
        let want = one_process(&gpu, &schedule, &spec);
        let mut worst = 0.0f64;
        for (got, want) in losses.iter().zip(&want) {
            assert_eq!(got.len(), want.len(), "{family}: losses per step");
            for (a, b) in got.iter().zip(want) {
                let d = (f64::from(*a) - f64::from(*b)).abs() / f64::from(b.abs()).max(1e-12);
                worst = worst.max(d);
            }
        }
        assert!(worst <= 1e-5, "{family}: {losses:?} vs {want:?}");
        println!(
            "nccl train {family}: losses equal the one-process run (max rel diff {worst:.1e})"
        );
    }
    println!("nccl train rank {rank}: ok");
}
