//! `train --backend cuda --devices per-rank`'s runtime: [`CudaStreams::on_devices`], each rank's
//! streams and stage on its own device, crossing payloads peer-copied on the consumer's stream
//! (`Device::adopt`), events recorded on one device waited on by another, timing marks read
//! against one origin per device.
//!
//! On a machine with two GPUs or more the devices are GPUs 0 and 1. On a machine with one GPU
//! they are two separate contexts on GPU 0 (`Gpu::open_separate`): memory of one context is not
//! usable by the other without a copy, so the peer-copy path runs all the same (its speed means
//! nothing there). Every family at P = 2 (one device per rank) and 1f1b at P = 4 (round robin over
//! the two) runs one step against sequential CPU training (losses, gradients, updated weights
//! within a relative 1e-4), and the bytes copied equal the bytes of the step's crossings between
//! ranks on different devices. A stage built on another device than its rank's is refused. A step
//! captured across devices (`--devices per-rank --graph`: one graph holding both devices' kernels
//! and the peer copies) and replayed gives the plain steps' losses within 1e-4 (UNVERIFIED until
//! `scripts/gpu-check.sh` runs it on a GPU).
//!
//! The CLI: `--devices` with `--backend cpu` exits 2 (runs anywhere); on a GPU, `train --backend
//! cuda --format json` reports the choice (`per-rank` with two GPUs or more, else `one`).
//!
//! Without a GPU every GPU test prints `skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail
//! instead)` and passes; with `PIPEFILL_REQUIRE_GPU=1` it fails instead.

mod common;
mod gpu_support;

use std::sync::Arc;

use common::pipefill;
use gpu_support::{assert_stage_close, cpu_stages, rel, spec};
use pipefill::cuda::{
    device_count, gpu_or_skip, CudaStage, CudaStreams, DeviceTensor, Gpu, OnCudaStreams,
};
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::Teacher;
use pipefill_host::runtime::streams::StreamExecutor;
use pipefill_host::runtime::{sequential_step, Tensor};
use pipefill_host::schedule::{families, Params, Schedule};

const TOL: f64 = 1e-4;

/// Two devices: GPUs 0 and 1, or two separate contexts on GPU 0 (says which).
fn two_devices(what: &str) -> Option<[Arc<Gpu>; 2]> {
    let gpu0 = gpu_or_skip(what)?;
    let count = device_count().unwrap();
    if count >= 2 {
        eprintln!("{what}: GPUs 0 and 1 ({count} GPUs)");
        return Some([gpu0, Gpu::open(1).unwrap()]);
    }
    eprintln!("{what}: one GPU: two separate contexts on GPU 0 stand for two devices");
    Some([
        Gpu::open_separate(0).unwrap(),
        Gpu::open_separate(0).unwrap(),
    ])
}

type Ex = StreamExecutor<CudaStreams, OnCudaStreams>;

/// The executor with rank `r` on `gpus[map[r]]`; `stage_gpu` says where each stage is built.
fn executor(
    gpus: &[Arc<Gpu>; 2],
    map: &[usize],
    sched: &Schedule,
    cpu: &[LinearStage],
    stage_gpu: impl Fn(usize) -> usize,
) -> (Ex, CudaStreams) {
    let device = CudaStreams::on_devices(gpus.to_vec(), map.to_vec()).unwrap();
    let stages = cpu
        .iter()
        .enumerate()
        .map(|(s, st)| device.stage(CudaStage::from_host(&gpus[stage_gpu(s)], st).unwrap()))
        .collect();
    gpus.iter().for_each(|g| g.synchronize().unwrap());
    let ex = StreamExecutor::new(sched.clone(), stages, device.clone()).unwrap();
    (ex, device)
}

/// Inputs on stage 0's device, targets on the last stage's.
fn upload(gpus: &[Arc<Gpu>; 2], ex: &Ex, x: &[Tensor], t: &[Tensor]) -> Vec<Vec<DeviceTensor>> {
    let last = ex.stages().len() - 1;
    [(0, x), (last, t)]
        .into_iter()
        .map(|(stage, values)| {
            let s = gpus[ex.stage_device(stage).unwrap()].new_stream().unwrap();
            let out = values
                .iter()
                .map(|v| DeviceTensor::from_host(&s, v).unwrap())
                .collect();
            s.synchronize().unwrap();
            out
        })
        .collect()
}

fn check_step(gpus: &[Arc<Gpu>; 2], sched: Schedule, map: &[usize]) {
    let spec = spec(sched.stages(), LossKind::Mse);
    let what = format!(
        "{} P={} V={} M={} map {map:?}",
        sched.name, sched.ranks, sched.chunks, sched.microbatches
    );
    let teacher = Teacher::new(&spec, 5);
    let (x, t) = teacher.batch(0, spec.batch, sched.microbatches);
    let mut seq = cpu_stages(&spec, &sched, Optimizer::adamw(0.01), 5);
    let (mut ex, device) = executor(gpus, map, &sched, &seq, |s| map[sched.rank_of(s)]);
    let want = sequential_step(&mut seq, x.clone(), &t, &spec.loss).unwrap();
    let mut batch = upload(gpus, &ex, &x, &t);
    let (targets, inputs) = (batch.pop().unwrap(), batch.pop().unwrap());
    let got = ex
        .step(inputs, &targets, &device.loss(LossKind::Mse))
        .unwrap();
    ex.optimizer_step().unwrap();
    assert!(rel(&got.losses, &want.losses) <= TOL, "losses: {what}");
    for (s, (a, b)) in ex.stages().iter().zip(&seq).enumerate() {
        let a = a.inner();
        assert_stage_close(s, a, b, TOL, &what);
    }
    let crossing: f64 = got
        .timeline
        .transfers
        .iter()
        .filter(|x| map[x.from_rank()] != map[x.to_rank()])
        .map(|x| x.bytes)
        .sum();
    assert!(crossing > 0.0, "no crossing between devices: {what}");
    assert_eq!(
        device.copied_bytes() as f64,
        crossing,
        "bytes copied: {what}"
    );
    assert!(
        got.timeline.spans.iter().all(|r| !r.is_empty()),
        "a rank has no measured span: {what}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn one_device_per_rank_matches_sequential_cpu_training() {
    let Some(gpus) = two_devices("one_device_per_rank_matches_sequential_cpu_training") else {
        return;
    };
    for family in families::FAMILIES {
        let params = Params::new(2, 4);
        let Ok(sched) = families::generate(family.name, &params) else {
            continue;
        };
        check_step(&gpus, sched, &[0, 1]);
    }
    let sched = families::generate("1f1b", &Params::new(4, 8)).unwrap();
    check_step(&gpus, sched, &[0, 1, 0, 1]);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn a_stage_on_another_device_is_refused_and_a_capture_across_devices_replays() {
    let Some(gpus) =
        two_devices("a_stage_on_another_device_is_refused_and_a_capture_across_devices_replays")
    else {
        return;
    };
    let sched = families::generate("1f1b", &Params::new(2, 2)).unwrap();
    let spec = spec(2, LossKind::Mse);
    let teacher = Teacher::new(&spec, 3);
    let (x, t) = teacher.batch(0, spec.batch, 2);
    let cpu = cpu_stages(&spec, &sched, Optimizer::adamw(0.01), 3);
    // Both stages built on device 0, rank 1 on device 1.
    let (mut ex, device) = executor(&gpus, &[0, 1], &sched, &cpu, |_| 0);
    let mut batch = upload(&gpus, &ex, &x, &t);
    let (targets, inputs) = (batch.pop().unwrap(), batch.pop().unwrap());
    let err = ex
        .step(inputs, &targets, &device.loss(LossKind::Mse))
        .unwrap_err();
    assert!(err.to_string().contains("build each stage"), "{err}");

    // Plain steps against a plain step, the capture and replays, on the same batches.
    let (mut plain, plain_device) = executor(&gpus, &[0, 1], &sched, &cpu, |s| s);
    let (mut ex, device) = executor(&gpus, &[0, 1], &sched, &cpu, |s| s);
    let (plain_loss, loss) = (plain_device.loss(LossKind::Mse), device.loss(LossKind::Mse));
    for step in 0..4u64 {
        let (x, t) = teacher.batch(step, spec.batch, 2);
        let mut batch = upload(&gpus, &plain, &x, &t);
        let (targets, inputs) = (batch.pop().unwrap(), batch.pop().unwrap());
        let want = plain.step(inputs, &targets, &plain_loss).unwrap();
        plain.optimizer_step().unwrap();
        let mut batch = upload(&gpus, &ex, &x, &t);
        let (targets, inputs) = (batch.pop().unwrap(), batch.pop().unwrap());
        let got = match step {
            0 => ex.step(inputs, &targets, &loss),
            1 => ex.capture(inputs, targets, &loss),
            _ => ex.replay(inputs, targets),
        }
        .unwrap_or_else(|e| panic!("step {step}: {e}"));
        ex.optimizer_step().unwrap();
        let r = rel(&got.losses, &want.losses);
        assert!(
            r <= TOL,
            "step {step}: losses {:?} vs {:?}",
            got.losses,
            want.losses
        );
    }
    assert!(ex.is_captured());
}

#[test]
fn the_devices_flag_needs_the_cuda_backend() {
    let (code, _, err) = pipefill(&["train", "--backend", "cpu", "--devices", "per-rank"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--devices per-rank") && err.contains("--backend cuda"),
        "{err}"
    );
    let (code, _, err) = pipefill(&["train", "--devices", "two"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn train_reports_the_device_choice() {
    let Some(_gpu) = gpu_or_skip("train_reports_the_device_choice") else {
        return;
    };
    let count = device_count().unwrap();
    let dir = std::env::temp_dir().join(format!("pipefill-devices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("t.svg");
    let svg = svg.to_str().unwrap();
    let (code, out, err) = pipefill(&[
        "train",
        "--backend",
        "cuda",
        "--ranks",
        "2",
        "--layers",
        "4",
        "--hidden",
        "64",
        "--batch",
        "32",
        "--microbatches",
        "4",
        "--steps",
        "3",
        "--schedule",
        "1f1b",
        "--format",
        "json",
        "--svg",
        svg,
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let want = if count >= 2 { "per-rank" } else { "one" };
    assert_eq!(v["devices"]["mode"], want, "{out}");
    assert!(err.contains(&format!("--devices auto: {want}")), "{err}");
    if count >= 2 {
        assert_eq!(v["devices"]["rank_gpu"], serde_json::json!([0, 1]), "{out}");
    } else {
        let (code, _, err) = pipefill(&["train", "--backend", "cuda", "--devices", "per-rank"]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("--devices one"), "{err}");
    }
}
