//! BF16 payloads on the stream runtime's CPU twins (what the CUDA stream path relies on): stages
//! storing BF16 (`LinearStage::with_activations`) hand on BF16 host tensors, so
//! - the stream executor on `CpuStreams` with one device per rank moves exactly half the bytes
//!   between devices (`CpuStreams::copied_bytes`, the twin of `CudaStreams`' peer copies);
//! - the per-rank runner over `CpuPeers` sends exactly half the bytes (`CpuPeer::sent_bytes`, the
//!   twin of the NCCL messages), posting its receives with the CUDA rank's `edge_shape`;
//!
//! and both give losses bit-equal to the threaded executor with the same stages. The bytes are
//! also checked against the count made from the schedule: every crossing between ranks, an
//! activation and a gradient per microbatch, rows x the boundary's width x the type's size.

use std::time::Duration;

use pipefill::cuda::rank::edge_shape;
use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::{stage_ranges, LayerSpec, ModelSpec, Teacher};
use pipefill_host::cost::ActivationDtype;
use pipefill_host::runtime::streams::{
    CpuPeer, CpuPeers, CpuStreams, Pending, PostOrder, RankBatch, RankStreams, StreamExecutor,
};
use pipefill_host::runtime::{assemble, Executor, RankOutcome, Tensor};
use pipefill_host::schedule::deps::Edge;
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_kernels::Activation;

fn spec() -> ModelSpec {
    let acts = [Activation::Gelu, Activation::Relu, Activation::Silu];
    let mut layers: Vec<LayerSpec> = (0..5)
        .map(|i| LayerSpec {
            width: 12 + 2 * i,
            activation: acts[i % 3],
        })
        .collect();
    layers.push(LayerSpec {
        width: 4,
        activation: Activation::Identity,
    });
    ModelSpec {
        input: 10,
        layers,
        loss: LossKind::Mse,
        batch: 24,
    }
}

/// The families checked: plain, zero-bubble V (two chunks a rank) and interleaved.
fn schedules() -> Vec<Schedule> {
    let make = |family: &str, ranks, microbatches, chunks| {
        let mut p = Params::new(ranks, microbatches);
        p.chunks = chunks;
        families::generate(family, &p).unwrap()
    };
    vec![
        make("1f1b", 3, 6, None),
        make("zbv", 2, 4, Some(2)),
        make("interleaved-1f1b", 2, 4, Some(2)),
    ]
}

/// The model's stages for `sched` (layers split as evenly as possible), storing `dtype`.
fn stages(spec: &ModelSpec, sched: &Schedule, dtype: ActivationDtype) -> Vec<LinearStage> {
    let n = spec.layers.len();
    let s = sched.stages();
    let counts: Vec<usize> = (0..s).map(|i| n / s + usize::from(i < n % s)).collect();
    spec.build_stages(
        &stage_ranges(&counts),
        Optimizer::adamw(0.01),
        GemmBackend::Matrixmultiply,
        3,
    )
    .unwrap()
    .into_iter()
    .map(|st| st.with_activations(dtype))
    .collect()
}

fn batch(spec: &ModelSpec, sched: &Schedule) -> (Vec<Tensor>, Vec<Tensor>) {
    Teacher::new(spec, 9).batch(0, spec.batch, sched.microbatches)
}

/// Bytes that cross between ranks in one step, counted from the schedule.
fn crossing_bytes(
    sched: &Schedule,
    widths: &[usize],
    rows: &[usize],
    dtype: ActivationDtype,
) -> usize {
    let crossings: usize = (0..sched.stages() - 1)
        .filter(|&b| sched.rank_of(b) != sched.rank_of(b + 1))
        .map(|b| widths[b])
        .sum();
    2 * crossings * rows.iter().sum::<usize>() * dtype.bytes() as usize
}

/// One step of the threaded executor: the reference losses.
fn threaded(spec: &ModelSpec, sched: &Schedule, dtype: ActivationDtype) -> Vec<f32> {
    let (x, t) = batch(spec, sched);
    let mut ex = Executor::new(sched.clone(), stages(spec, sched, dtype)).unwrap();
    ex.step(x, &t, &spec.loss).unwrap().losses
}

/// One step of the stream executor on `CpuStreams` with rank `r` on device `r`: the losses and
/// the bytes copied between devices.
fn streams(spec: &ModelSpec, sched: &Schedule, dtype: ActivationDtype) -> (Vec<f32>, usize) {
    let device = CpuStreams::with_devices((0..sched.ranks).collect());
    let wrapped = stages(spec, sched, dtype)
        .into_iter()
        .map(|s| device.stage(s))
        .collect();
    let loss = device.loss(spec.loss);
    let mut ex = StreamExecutor::new(sched.clone(), wrapped, device).unwrap();
    let (x, t) = batch(spec, sched);
    let last = sched.rank_of(sched.stages() - 1);
    let inputs = x
        .into_iter()
        .map(|x| Pending::ready_on(sched.rank_of(0), x))
        .collect();
    let targets: Vec<_> = t.into_iter().map(|t| Pending::ready_on(last, t)).collect();
    let report = ex.step(inputs, &targets, &loss).unwrap();
    ex.optimizer_step().unwrap();
    (report.losses, ex.device().copied_bytes())
}

/// One rank of one step of the per-rank runner over `peer`.
fn rank_step(
    spec: &ModelSpec,
    sched: &Schedule,
    dtype: ActivationDtype,
    rank: usize,
    peer: &mut CpuPeer,
) -> RankOutcome {
    let device = CpuStreams::new();
    let all = stages(spec, sched, dtype);
    let widths: Vec<usize> = all.iter().map(LinearStage::outputs).collect();
    let mine = all
        .into_iter()
        .enumerate()
        .filter(|(s, _)| sched.rank_of(*s) == rank)
        .map(|(s, st)| (s, device.stage(st)))
        .collect();
    let loss = device.loss(spec.loss);
    let mut runner =
        RankStreams::new(sched.clone(), rank, mine, device, PostOrder::Sender).unwrap();
    let (x, t) = batch(spec, sched);
    let rows: Vec<usize> = x.iter().map(Tensor::rows).collect();
    let inputs = if sched.rank_of(0) == rank {
        x.into_iter().map(Pending::ready).collect()
    } else {
        Vec::new()
    };
    let targets: Vec<_> = t.into_iter().map(Pending::ready).collect();
    let shape = |e: Edge| edge_shape(&rows, &widths, e);
    let batch = RankBatch {
        inputs,
        targets: &targets,
        loss: &loss,
        shape: &shape,
    };
    runner.step(batch, peer)
}

/// One step of the per-rank runner, ranks as threads over `CpuPeers`: the losses and the bytes
/// sent.
fn ranks(spec: &ModelSpec, sched: &Schedule, dtype: ActivationDtype) -> (Vec<f32>, usize) {
    let peers = CpuPeers::connect(sched.ranks, Duration::from_secs(20));
    let (outcomes, sent): (Vec<RankOutcome>, Vec<usize>) = std::thread::scope(|scope| {
        let handles: Vec<_> = peers
            .into_iter()
            .enumerate()
            .map(|(rank, mut peer)| {
                scope.spawn(move || {
                    let out = rank_step(spec, sched, dtype, rank, &mut peer);
                    (out, peer.sent_bytes())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).unzip()
    });
    let report = assemble(sched, outcomes, 0.0).unwrap();
    // Every rank reads the one hub's count after its own step; the last to finish saw all sends.
    (report.losses, sent.into_iter().max().unwrap_or(0))
}

fn expected(spec: &ModelSpec, sched: &Schedule, dtype: ActivationDtype) -> usize {
    let widths: Vec<usize> = stages(spec, sched, dtype)
        .iter()
        .map(LinearStage::outputs)
        .collect();
    let rows: Vec<usize> = batch(spec, sched).0.iter().map(Tensor::rows).collect();
    crossing_bytes(sched, &widths, &rows, dtype)
}

#[test]
fn the_stream_executor_copies_half_the_bytes_between_devices_with_bf16_stages() {
    let spec = spec();
    for sched in schedules() {
        let name = &sched.name;
        let (f32_losses, f32_bytes) = streams(&spec, &sched, ActivationDtype::F32);
        let (bf16_losses, bf16_bytes) = streams(&spec, &sched, ActivationDtype::Bf16);
        assert_eq!(
            f32_bytes,
            expected(&spec, &sched, ActivationDtype::F32),
            "{name}"
        );
        assert!(bf16_bytes > 0, "{name}: nothing crossed");
        assert_eq!(
            2 * bf16_bytes,
            f32_bytes,
            "{name}: bf16 {bf16_bytes} B, f32 {f32_bytes} B"
        );
        assert_eq!(
            f32_losses,
            threaded(&spec, &sched, ActivationDtype::F32),
            "{name}"
        );
        let want = threaded(&spec, &sched, ActivationDtype::Bf16);
        assert_eq!(bf16_losses, want, "{name}: bf16 stream losses vs threads");
        assert_ne!(bf16_losses, f32_losses, "{name}: bf16 rounded nothing");
        eprintln!(
            "stream executor {name}: copied between devices f32 {f32_bytes} B, bf16 {bf16_bytes} B"
        );
    }
}

#[test]
fn the_per_rank_runner_sends_half_the_bytes_over_cpu_peers_with_bf16_stages() {
    let spec = spec();
    for sched in schedules() {
        let name = &sched.name;
        let (f32_losses, f32_bytes) = ranks(&spec, &sched, ActivationDtype::F32);
        let (bf16_losses, bf16_bytes) = ranks(&spec, &sched, ActivationDtype::Bf16);
        assert_eq!(
            f32_bytes,
            expected(&spec, &sched, ActivationDtype::F32),
            "{name}"
        );
        assert_eq!(
            bf16_bytes,
            expected(&spec, &sched, ActivationDtype::Bf16),
            "{name}"
        );
        assert_eq!(
            2 * bf16_bytes,
            f32_bytes,
            "{name}: bf16 {bf16_bytes} B, f32 {f32_bytes} B"
        );
        assert_eq!(
            f32_losses,
            threaded(&spec, &sched, ActivationDtype::F32),
            "{name}"
        );
        let want = threaded(&spec, &sched, ActivationDtype::Bf16);
        assert_eq!(bf16_losses, want, "{name}: bf16 per-rank losses vs threads");
        eprintln!(
            "per-rank runner {name}: sent over CpuPeers f32 {f32_bytes} B, bf16 {bf16_bytes} B"
        );
    }
}
