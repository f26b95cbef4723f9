//! BF16 activation storage on the CUDA layers (`--activations bf16`): the device stash holds BF16
//! buffers (2 bytes a value, the same count as the CPU layers' stash), the host tensors a device
//! stage hands on are BF16, and one training step matches the CPU layers storing BF16.
//!
//! Tolerances (norm-wise relative, losses, gradients and updated weights): with `fp32` products
//! the device rounds at the same points as the CPU, so the two differ by the GEMMs' `f32` order,
//! which can move a value across a BF16 rounding boundary (one BF16 ulp, `2^-7` relative, on a
//! few values): 1e-2. With `bf16` products the weights are rounded to BF16 too (`2^-8` relative
//! on every weight, through 3 layers): 5e-2, the bound `tests/gpu_tc.rs` uses for BF16 products.
//! Chosen from these estimates; not yet run on a GPU.
//!
//! The stream runtime's device payload ([`DeviceTensor`]): a BF16 stage hands on its output and
//! input gradient as BF16 device tensors (2 bytes a value, no widening); on two devices (GPUs 0
//! and 1, or two separate contexts on GPU 0) the stream executor's reported transfer bytes and the
//! bytes it peer-copies halve against `f32` stages, and its losses match the CPU layers with the
//! same storage (1e-2 BF16, 1e-4 `f32`, products in `fp32`).
//!
//! NCCL with BF16 messages: the test re-runs itself as two processes on GPU 0
//! (`NCCL_MULTI_RANK_GPU_ENABLE=1`, the id through a file, as `tests/gpu_nccl.rs` does); each runs its
//! rank of 1f1b (P = 2, M = 4, two steps) with BF16 stages over [`CudaRank`] (the link carries
//! `ncclBfloat16`), and the last stage's rank checks the losses against the one-process stream run
//! with the same BF16 stages (relative 1e-5: the same kernels, and NCCL moves the bits unchanged).
//! Where NCCL is missing or refuses two ranks on one device it prints `NCCL refused: ...` and passes.
//!
//! `train --backend cuda --activations bf16` is checked against `train --backend cpu --activations
//! bf16` on the same flags: per-step losses within the same tolerances.
//!
//! Without a GPU every test prints `skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail
//! instead)` and passes; with `PIPEFILL_REQUIRE_GPU=1` it fails instead.

mod gpu_support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use gpu_support::nccl::{child_rank, open_or_refuse, two_ranks, unique_id};
use gpu_support::{assert_stage_close, rel, upload};
use pipefill::cuda::{
    device_count, gpu_or_skip, CudaRank, CudaStage, CudaStreams, Gpu, OnCudaStreams, Precision,
    RankModel,
};
use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::{stage_ranges, LayerSpec, ModelSpec, Teacher};
use pipefill_host::cost::ActivationDtype;
use pipefill_host::runtime::streams::StreamExecutor;
use pipefill_host::runtime::{Executor, Stage, StepReport, Tensor};
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_kernels::Activation;

fn spec() -> ModelSpec {
    ModelSpec {
        input: 67,
        layers: [
            (129, Activation::Gelu),
            (95, Activation::Silu),
            (9, Activation::Identity),
        ]
        .into_iter()
        .map(|(width, activation)| LayerSpec { width, activation })
        .collect(),
        loss: LossKind::Mse,
        batch: 64,
    }
}

fn host_stages(dtype: ActivationDtype) -> Vec<LinearStage> {
    spec()
        .build_stages(
            &stage_ranges(&[2, 1]),
            Optimizer::sgd(0.05),
            GemmBackend::default(),
            11,
        )
        .unwrap()
        .into_iter()
        .map(|s| s.with_activations(dtype))
        .collect()
}

fn sent(r: &StepReport) -> f64 {
    r.timeline.transfers.iter().map(|t| t.bytes).sum()
}

/// One 1F1B step (2 ranks, 4 microbatches) of the device stages storing BF16, products in
/// `precision`, against the CPU stages storing BF16.
fn one_step(gpu: &Arc<Gpu>, precision: Precision, tol: f64) {
    let spec = spec();
    let params = Params {
        ranks: 2,
        microbatches: 4,
        chunks: None,
        group_size: None,
    };
    let sched = families::generate("1f1b", &params).unwrap();
    let (x, t) = Teacher::new(&spec, 11).batch(0, spec.batch, sched.microbatches);
    let mut cpu = Executor::new(sched.clone(), host_stages(ActivationDtype::Bf16)).unwrap();
    let want = cpu.step(x.clone(), &t, &spec.loss).unwrap();
    cpu.optimizer_step().unwrap();
    let dev = host_stages(ActivationDtype::Bf16)
        .iter()
        .map(|s| CudaStage::from_host_in(gpu, s, precision).unwrap())
        .collect();
    let mut ex = Executor::new(sched, dev).unwrap();
    let got = ex.step(x, &t, &spec.loss).unwrap();
    ex.optimizer_step().unwrap();
    let what = format!("bf16 storage, {precision} products");
    assert_eq!(
        got.peak_held_bytes, want.peak_held_bytes,
        "{what}: peak stash"
    );
    assert_eq!(sent(&got), sent(&want), "{what}: bytes between ranks");
    let r = rel(&got.losses, &want.losses);
    assert!(r <= tol, "{what}: losses differ by {r:e}");
    for (s, (a, b)) in ex.stages().iter().zip(cpu.stages()).enumerate() {
        assert_eq!(a.activations, ActivationDtype::Bf16);
        assert_stage_close(s, a, b, tol, &what);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn one_bf16_storage_step_matches_the_cpu_layers_storing_bf16() {
    let Some(gpu) = gpu_or_skip("one_bf16_storage_step_matches_the_cpu_layers_storing_bf16") else {
        return;
    };
    one_step(&gpu, Precision::Fp32, 1e-2);
    one_step(&gpu, Precision::Tf32, 5e-2);
    one_step(&gpu, Precision::Bf16, 5e-2);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn the_device_stash_holds_two_bytes_a_value() {
    let Some(gpu) = gpu_or_skip("the_device_stash_holds_two_bytes_a_value") else {
        return;
    };
    let rows = 8;
    let x = Tensor::matrix(
        rows,
        67,
        (0..rows * 67).map(|i| (i as f32 * 0.01).sin()).collect(),
    )
    .unwrap();
    let mut held = Vec::new();
    for dtype in [ActivationDtype::F32, ActivationDtype::Bf16] {
        let mut cpu = host_stages(dtype).remove(0);
        let (_, cpu_stash) = cpu.forward(x.clone()).unwrap();
        for precision in Precision::ALL {
            let mut dev = CudaStage::from_host_in(&gpu, &host_stages(dtype)[0], precision).unwrap();
            let (y, stash) = dev.forward(x.clone()).unwrap();
            let what = format!("{dtype} storage, {precision}");
            assert_eq!(dev.held_bytes(&stash), cpu.held_bytes(&cpu_stash), "{what}");
            assert_eq!(y.dtype(), dtype.into(), "{what}: the tensor handed on");
            let dy = Tensor::matrix(rows, y.cols(), vec![0.01; y.len()]).unwrap();
            let mut stash = stash;
            dev.backward_input(&mut stash, dy).unwrap();
            let after_i = dev.held_bytes(&stash);
            dev.backward_weight(stash).unwrap();
            held.push((dtype, precision, after_i));
        }
    }
    // After I the stash holds X and dZ of each layer: half as many bytes in BF16.
    for p in Precision::ALL {
        let get = |d| held.iter().find(|h| h.0 == d && h.1 == p).unwrap().2;
        assert_eq!(
            2 * get(ActivationDtype::Bf16),
            get(ActivationDtype::F32),
            "{p}"
        );
    }
}

/// The losses of `pipefill train ... --format json` with `extra` flags (the binary is
/// `PIPEFILL_BIN` when set, as in `tests/gpu_cli.rs`).
fn train_losses(extra: &[&str]) -> Vec<f32> {
    let bin = std::env::var_os("PIPEFILL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pipefill")));
    let mut args = vec![
        "train",
        "--ranks",
        "2",
        "--schedule",
        "1f1b",
        "--plan",
        "uniform",
        "--layers",
        "3",
        "--hidden",
        "96",
        "--batch",
        "64",
        "--microbatches",
        "4",
        "--steps",
        "3",
        "--format",
        "json",
        "--activations",
        "bf16",
    ];
    args.extend(extra);
    let out = Command::new(&bin)
        .args(&args)
        .output()
        .expect("run pipefill");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    serde_json::from_value(v["losses"].clone()).expect("losses")
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn train_on_the_gpu_with_bf16_activations_matches_the_cpu() {
    if gpu_or_skip("train_on_the_gpu_with_bf16_activations_matches_the_cpu").is_none() {
        return;
    }
    let cpu = train_losses(&["--backend", "cpu"]);
    for (p, tol) in [("fp32", 1e-2), ("bf16", 5e-2)] {
        let gpu = train_losses(&["--backend", "cuda", "--precision", p]);
        let r = rel(&gpu, &cpu);
        assert!(
            r <= tol,
            "--precision {p}: losses differ by {r:e}: {gpu:?} vs {cpu:?}"
        );
    }
}

/// Two devices: GPUs 0 and 1, or two separate contexts on GPU 0 (as `tests/gpu_devices.rs`).
fn two_devices(what: &str) -> Option<[Arc<Gpu>; 2]> {
    let gpu0 = gpu_or_skip(what)?;
    if device_count().unwrap() >= 2 {
        return Some([gpu0, Gpu::open(1).unwrap()]);
    }
    eprintln!("{what}: one GPU: two separate contexts on GPU 0 stand for two devices");
    Some([
        Gpu::open_separate(0).unwrap(),
        Gpu::open_separate(0).unwrap(),
    ])
}

/// One step of the stream executor, rank `r` on `gpus[r]`, stages storing `dtype`: the losses,
/// the transfer bytes it reports and the bytes it peer-copied.
fn stream_step(
    gpus: &[Arc<Gpu>; 2],
    sched: &Schedule,
    dtype: ActivationDtype,
) -> (Vec<f32>, f64, usize) {
    let spec = spec();
    let device = CudaStreams::on_devices(gpus.to_vec(), vec![0, 1]).unwrap();
    let stages: Vec<OnCudaStreams> = host_stages(dtype)
        .iter()
        .enumerate()
        .map(|(s, st)| device.stage(CudaStage::from_host(&gpus[sched.rank_of(s)], st).unwrap()))
        .collect();
    gpus.iter().for_each(|g| g.synchronize().unwrap());
    let mut ex = StreamExecutor::new(sched.clone(), stages, device.clone()).unwrap();
    let (x, t) = Teacher::new(&spec, 11).batch(0, spec.batch, sched.microbatches);
    let last = sched.rank_of(sched.stages() - 1);
    let (inputs, targets) = (upload(&gpus[sched.rank_of(0)], &x), upload(&gpus[last], &t));
    let report = ex.step(inputs, &targets, &device.loss(spec.loss)).unwrap();
    ex.optimizer_step().unwrap();
    let reported = sent(&report);
    (report.losses, reported, device.copied_bytes())
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn the_stream_runtime_hands_bf16_payloads_and_copies_half_the_bytes() {
    let what = "the_stream_runtime_hands_bf16_payloads_and_copies_half_the_bytes";
    let Some(gpus) = two_devices(what) else {
        return;
    };
    // The payload itself: a BF16 stage's output and input gradient are BF16, 2 bytes a value.
    let stages = host_stages(ActivationDtype::Bf16);
    let mut second = CudaStage::from_host(&gpus[0], &stages[1]).unwrap();
    let rows = 8;
    let x = Tensor::matrix(rows, second.inputs(), vec![0.25; rows * second.inputs()]).unwrap();
    let x = upload(&gpus[0], &[x]).remove(0);
    let (y, mut stash) = second.forward_device(x).unwrap();
    assert_eq!((y.dtype(), y.bytes()), (ActivationDtype::Bf16, 2 * y.len()));
    let dy = upload(
        &gpus[0],
        &[Tensor::matrix(rows, y.cols(), vec![0.01; y.len()]).unwrap()],
    );
    let dx = second
        .backward_input_device(&mut stash, dy.into_iter().next().unwrap())
        .unwrap();
    assert_eq!(
        (dx.dtype(), dx.bytes()),
        (ActivationDtype::Bf16, 2 * dx.len())
    );
    second.synchronize().unwrap();

    let sched = families::generate("1f1b", &Params::new(2, 4)).unwrap();
    let spec = spec();
    let (x, t) = Teacher::new(&spec, 11).batch(0, spec.batch, sched.microbatches);
    let mut got = Vec::new();
    for (dtype, tol) in [(ActivationDtype::F32, 1e-4), (ActivationDtype::Bf16, 1e-2)] {
        let mut cpu = Executor::new(sched.clone(), host_stages(dtype)).unwrap();
        let want = cpu.step(x.clone(), &t, &spec.loss).unwrap();
        cpu.optimizer_step().unwrap();
        let (losses, reported, copied) = stream_step(&gpus, &sched, dtype);
        let r = rel(&losses, &want.losses);
        assert!(
            r <= tol,
            "{dtype}: stream losses differ from the CPU's by {r:e}"
        );
        assert!(reported > 0.0, "{dtype}: no transfer bytes reported");
        assert_eq!(
            copied as f64, reported,
            "{dtype}: bytes peer-copied vs reported"
        );
        assert_eq!(
            reported,
            sent(&want),
            "{dtype}: bytes vs the threaded CPU run"
        );
        got.push(reported);
    }
    assert_eq!(got[1] * 2.0, got[0], "bf16 vs f32 transfer bytes");
    eprintln!(
        "stream bf16: transfer bytes {} (f32 {}), losses match",
        got[1], got[0]
    );
}

const NCCL_TEST: &str = "two_processes_train_bf16_stages_over_nccl_like_one_process";
const NCCL_STEPS: u64 = 2;

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn two_processes_train_bf16_stages_over_nccl_like_one_process() {
    if let Some((rank, id_file)) = child_rank() {
        return nccl_child(rank, id_file);
    }
    let Some(outputs) = two_ranks(NCCL_TEST) else {
        return;
    };
    let checked: Vec<&str> = outputs
        .iter()
        .flat_map(|o| o.lines())
        .filter(|l| l.starts_with("nccl bf16: losses equal"))
        .collect();
    assert_eq!(checked.len(), 1, "one rank checks the losses\n{outputs:?}");
    println!("{}", checked[0]);
}

/// The losses of [`NCCL_STEPS`] steps of `schedule` over all BF16 stages in this one process.
fn one_process_bf16(gpu: &Arc<Gpu>, schedule: &Schedule) -> Vec<Vec<f32>> {
    let spec = spec();
    let device = CudaStreams::new(gpu.clone());
    let stages = host_stages(ActivationDtype::Bf16)
        .iter()
        .map(|s| device.stage(CudaStage::from_host(gpu, s).expect("stage")))
        .collect();
    gpu.synchronize().expect("synchronize");
    let mut ex = StreamExecutor::new(schedule.clone(), stages, device.clone()).expect("executor");
    let loss = device.loss(spec.loss);
    let teacher = Teacher::new(&spec, 3);
    (0..NCCL_STEPS)
        .map(|step| {
            let (x, t) = teacher.batch(step, spec.batch, schedule.microbatches);
            let (x, t) = (upload(gpu, &x), upload(gpu, &t));
            let losses = ex.step(x, &t, &loss).expect("a step").losses;
            ex.optimizer_step().expect("an optimizer step");
            losses
        })
        .collect()
}

/// One rank of 1f1b over NCCL with BF16 stages; the rank with the last stage checks the losses.
fn nccl_child(rank: usize, id_file: PathBuf) {
    let gpu = Gpu::open(0).expect("device 0");
    let id = unique_id(rank, &id_file);
    let peer = open_or_refuse(&gpu, rank, id);
    let schedule = families::generate("1f1b", &Params::new(2, 4)).expect("a schedule");
    let spec = spec();
    let stages = host_stages(ActivationDtype::Bf16);
    let model = RankModel {
        stages: (stages.iter().enumerate())
            .filter(|(s, _)| schedule.rank_of(*s) == rank)
            .collect(),
        widths: stages.iter().map(LinearStage::outputs).collect(),
        precision: Precision::Fp32,
        loss: spec.loss,
    };
    let mut me = CudaRank::new(&gpu, schedule.clone(), rank, model, peer).expect("the runner");
    let teacher = Teacher::new(&spec, 3);
    let (first, last) = (rank == schedule.rank_of(0), rank == schedule.rank_of(1));
    let mut losses = Vec::new();
    for step in 0..NCCL_STEPS {
        let (x, t) = teacher.batch(step, spec.batch, schedule.microbatches);
        let rows: Vec<usize> = x.iter().map(Tensor::rows).collect();
        let inputs = if first { upload(&gpu, &x) } else { Vec::new() };
        let targets = if last { upload(&gpu, &t) } else { Vec::new() };
        let out = me.step(inputs, &targets, &rows);
        if let Err(e) = &out.result {
            panic!("rank {rank} step {step}: {e:?}");
        }
        me.optimizer_step().expect("the rank's optimizer step");
        let mut l = out.losses;
        l.sort_by_key(|(k, _)| *k);
        losses.push(l.into_iter().map(|(_, v)| v).collect::<Vec<f32>>());
    }
    assert_eq!(
        me.into_peer().activations(),
        ActivationDtype::Bf16,
        "the link's type"
    );
    if last {
        let want = one_process_bf16(&gpu, &schedule);
        let (got, want): (Vec<f32>, Vec<f32>) = (losses.concat(), want.concat());
        let r = rel(&got, &want);
        assert!(got.len() == want.len() && r <= 1e-5, "{got:?} vs {want:?}");
        println!("nccl bf16: losses equal the one-process run (rel diff {r:.1e})");
    }
    println!("nccl bf16 rank {rank}: ok");
}
