//! [`CudaRank`]: one GPU rank of a pipeline in its own process: the rank's stages copied to its
//! GPU, the per-rank stream runner ([`RankStreams`]) on [`CudaStreams`], and the transfers over
//! NCCL ([`NcclPeer`]). What `train --backend cuda --launcher mpi` runs in each process, and what
//! the two-process GPU test runs. With `--graph` the rank's step, its NCCL sends and receives
//! included, is captured once as a CUDA graph and replayed ([`CudaRank::capture`],
//! [`CudaRank::replay`]); host work (the ranks' agreement, MPI reductions, reading the loss) stays
//! outside the graph. Not yet run on GPUs (UNVERIFIED); the CPU twin's test is
//! `host/tests/runtime_rank_graph.rs`.

use std::sync::Arc;

use pipefill_host::cost::{ActivationDtype, Recompute};
use pipefill_host::runtime::streams::{PostOrder, RankBatch, RankStreams};
use pipefill_host::runtime::{RankOutcome, Reducer, RuntimeError};
use pipefill_host::schedule::deps::Edge;
use pipefill_host::schedule::Schedule;

use super::device::Gpu;
use super::error::CudaError;
use super::peer::NcclPeer;
use super::precision::Precision;
use super::stage::CudaStage;
use super::streams::{CudaLoss, CudaStreams, OnCudaStreams};
use super::tensor::DeviceTensor;
use pipefill_model::layers::{LinearStage, LossKind};

/// Why a [`CudaRank`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaRankError {
    /// Copying the stages to the device failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The runner refused the schedule or the stages.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The rank's stages store activations in different types (what crosses ranks must have one
    /// type, which the receiving rank allocates).
    #[error("stage {stage} stores activations as {got}, an earlier stage of this rank as {expected}: give every stage the same storage type")]
    MixedActivations {
        /// The global index of the stage that differs.
        stage: usize,
        /// The type of the rank's first stage.
        expected: ActivationDtype,
        /// The stage's type.
        got: ActivationDtype,
    },
}

/// The one storage type of the rank's stages (`f32` for none), else
/// [`CudaRankError::MixedActivations`].
fn rank_activations(stages: &[(usize, &LinearStage)]) -> Result<ActivationDtype, CudaRankError> {
    let Some(&(_, first)) = stages.first() else {
        return Ok(ActivationDtype::F32);
    };
    let expected = first.activations;
    match stages.iter().find(|(_, st)| st.activations != expected) {
        Some(&(stage, st)) => Err(CudaRankError::MixedActivations {
            stage,
            expected,
            got: st.activations,
        }),
        None => Ok(expected),
    }
}

/// The shape of the data of `e` (an activation or a gradient at one stage boundary): the rows of
/// its microbatch (`rows[k]`) by the width at the boundary (`widths[b]`, the output width of
/// stage `b`). What a rank posts each receive with.
pub fn edge_shape(rows: &[usize], widths: &[usize], e: Edge) -> Vec<usize> {
    vec![
        rows.get(e.microbatch).copied().unwrap_or(0),
        widths.get(e.boundary()).copied().unwrap_or(0),
    ]
}

/// One rank's stages on one GPU, run step by step over NCCL.
pub struct CudaRank {
    runner: RankStreams<CudaStreams, OnCudaStreams>,
    peer: NcclPeer,
    loss: CudaLoss,
    /// Width of the data crossing each stage boundary (`S - 1` of them).
    widths: Vec<usize>,
}

/// A rank's share of the model, for [`CudaRank::new`].
pub struct RankModel<'a> {
    /// `(global stage index, host stage)` of the rank's own stages (the only ones copied).
    pub stages: Vec<(usize, &'a LinearStage)>,
    /// The output width of every stage of the model, in order: what crosses each boundary.
    pub widths: Vec<usize>,
    /// The precision of the layers' products on the device.
    pub precision: Precision,
    /// The loss after the last stage.
    pub loss: LossKind,
}

impl CudaRank {
    /// Rank `rank` of `schedule` on `gpu`: the rank's stages of `model` copied to the device, its
    /// transfers over `peer` in the stages' storage type (BF16 stages: BF16 messages). Every stage
    /// of the model must store activations alike (a rank whose stages differ is refused; the other
    /// ranks' are not seen here).
    pub fn new(
        gpu: &Arc<Gpu>,
        schedule: Schedule,
        rank: usize,
        model: RankModel<'_>,
        mut peer: NcclPeer,
    ) -> Result<Self, CudaRankError> {
        peer.set_activations(rank_activations(&model.stages)?);
        let device = CudaStreams::new(gpu.clone());
        let mine = model
            .stages
            .iter()
            .map(|&(s, st)| {
                let on = CudaStage::from_host_in(gpu, st, model.precision)?;
                Ok((s, device.stage(on)))
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        // The weights were copied on each stage's own stream; the steps run on the runner's.
        gpu.synchronize()?;
        let loss = device.loss(model.loss);
        let runner = RankStreams::new(schedule, rank, mine, device, PostOrder::Sender)?;
        Ok(CudaRank {
            runner,
            peer,
            loss,
            widths: model.widths,
        })
    }

    /// Runs stage `s` with recomputation `modes[s]` from the next step on
    /// ([`RankStreams::set_recompute`]: the kept input is a copy on the forward's stream).
    pub fn set_recompute(&mut self, modes: &[Recompute]) {
        self.runner.set_recompute(modes);
    }

    /// Runs the rank's part of one step: `inputs` are stage 0's microbatches (on its rank; empty
    /// elsewhere), `targets` the microbatch targets (read on the last stage's rank), `rows` the
    /// rows of each microbatch (what every rank posts its receives with). The outcome says how
    /// the rank ended (a success only if every rank succeeded); the step leaves the gradients
    /// for [`optimizer_step`](CudaRank::optimizer_step).
    pub fn step(
        &mut self,
        inputs: Vec<DeviceTensor>,
        targets: &[DeviceTensor],
        rows: &[usize],
    ) -> RankOutcome {
        let widths = &self.widths;
        let shape = |e: Edge| edge_shape(rows, widths, e);
        let batch = RankBatch {
            inputs,
            targets,
            loss: &self.loss,
            shape: &shape,
        };
        self.runner.step(batch, &mut self.peer)
    }

    /// Captures the rank's part of one step as a CUDA graph, its NCCL sends and receives
    /// included, and runs it once ([`RankStreams::capture`]); `inputs` and `targets` become the
    /// graph's fixed buffers. Every rank of the job captures the same step. Refused with a named
    /// error for an NCCL older than 2.9.
    pub fn capture(
        &mut self,
        inputs: Vec<DeviceTensor>,
        targets: Vec<DeviceTensor>,
        rows: &[usize],
    ) -> RankOutcome {
        let widths = &self.widths;
        let shape = |e: Edge| edge_shape(rows, widths, e);
        self.runner
            .capture((inputs, targets), &self.loss, &shape, &mut self.peer)
    }

    /// Replays the captured step on new `inputs` and `targets` ([`RankStreams::replay`]).
    pub fn replay(&mut self, inputs: Vec<DeviceTensor>, targets: Vec<DeviceTensor>) -> RankOutcome {
        self.runner.replay(inputs, targets, &mut self.peer)
    }

    /// Sets (or clears) the data-parallel gradient reduction over the replicas of this rank
    /// ([`RankStreams::set_reducer`]: each step ends with the rank's stages' gradients, copied to
    /// the host, given to `reducer`, and what it leaves copied back).
    pub fn set_reducer(&mut self, reducer: Option<Arc<Reducer>>) {
        self.runner.set_reducer(reducer);
    }

    /// Applies the rank's stages' optimizer steps to the gradients the last step left (see
    /// [`RankStreams::optimizer_step`]).
    pub fn optimizer_step(&mut self) -> Result<(), RuntimeError> {
        self.runner.optimizer_step()
    }

    /// Gives back the NCCL link (to run another schedule over the same communicator).
    pub fn into_peer(self) -> NcclPeer {
        self.peer
    }

    /// The rank's device stages, `(global index, stage)`.
    pub fn stages(&self) -> &[(usize, OnCudaStreams)] {
        self.runner.stages()
    }
}

#[cfg(test)]
mod tests {
    //! The logic [`CudaRank`] relies on, on the CPU twin: the built-in model's stages (layers of
    //! different widths) on one `CpuStreams` device per rank thread, the per-rank runner, receives
    //! posted with [`edge_shape`] over `CpuPeers` (which refuses a message of another shape): the
    //! losses and updated weights equal the threaded `Executor`'s.

    use std::time::Duration;

    use pipefill_host::runtime::streams::{CpuPeers, CpuStreams, Pending};
    use pipefill_host::runtime::{assemble, Executor, Tensor};
    use pipefill_host::schedule::{families, Params};
    use pipefill_kernels::Activation;

    use super::*;
    use pipefill_model::layers::gemm::GemmBackend;
    use pipefill_model::layers::Optimizer;
    use pipefill_model::model::{stage_ranges, LayerSpec, ModelSpec, Teacher};

    fn spec(layers: usize, loss: LossKind) -> ModelSpec {
        ModelSpec {
            input: 7,
            layers: (0..layers)
                .map(|i| LayerSpec {
                    width: if i + 1 == layers { 3 } else { 9 + 2 * i },
                    activation: [Activation::Silu, Activation::Gelu, Activation::Identity][i % 3],
                })
                .collect(),
            loss,
            batch: 12,
        }
    }

    fn stages(spec: &ModelSpec, k: usize) -> Vec<LinearStage> {
        let n = spec.layers.len();
        let counts: Vec<usize> = (0..k).map(|i| n / k + usize::from(i < n % k)).collect();
        let opt = Optimizer::adamw(0.01);
        spec.build_stages(&stage_ranges(&counts), opt, GemmBackend::default(), 5)
            .unwrap()
    }

    /// One rank of one step on the CPU twin; its outcome and its stages' first weights.
    fn rank_step(
        schedule: &Schedule,
        spec: &ModelSpec,
        rank: usize,
        peer: &mut pipefill_host::runtime::streams::CpuPeer,
        (x, t): (&[Tensor], &[Tensor]),
    ) -> (RankOutcome, Vec<(usize, Vec<f32>)>) {
        let device = CpuStreams::new();
        let all = stages(spec, schedule.stages());
        let widths: Vec<usize> = all.iter().map(LinearStage::outputs).collect();
        let mine = all
            .into_iter()
            .enumerate()
            .filter(|(s, _)| schedule.rank_of(*s) == rank)
            .map(|(s, st)| (s, device.stage(st)))
            .collect();
        let loss = device.loss(spec.loss);
        let mut runner =
            RankStreams::new(schedule.clone(), rank, mine, device, PostOrder::Sender).unwrap();
        let rows: Vec<usize> = x.iter().map(|x| x.shape()[0]).collect();
        let first = schedule.rank_of(0) == rank;
        let inputs = if first {
            x.iter().cloned().map(Pending::ready).collect()
        } else {
            Vec::new()
        };
        let targets: Vec<_> = t.iter().cloned().map(Pending::ready).collect();
        let shape = |e: Edge| edge_shape(&rows, &widths, e);
        let batch = RankBatch {
            inputs,
            targets: &targets,
            loss: &loss,
            shape: &shape,
        };
        let out = runner.step(batch, peer);
        if out.result.is_ok() {
            runner.optimizer_step().unwrap();
        }
        let weights = runner
            .stages()
            .iter()
            .map(|(s, st)| (*s, st.inner().layers[0].weight.clone()))
            .collect();
        (out, weights)
    }

    #[test]
    fn the_model_over_rank_threads_and_edge_shapes_equals_the_threaded_run() {
        for (family, loss) in [
            ("1f1b", LossKind::Mse),
            ("zbv", LossKind::CrossEntropy),
            ("interleaved-1f1b", LossKind::Mse),
        ] {
            let mut params = Params::new(2, 3);
            params.chunks = Some(2);
            if family == "1f1b" {
                params.chunks = None;
            }
            let schedule = families::generate(family, &params).unwrap();
            let spec = spec(schedule.stages() + 1, loss);
            let (x, t) = Teacher::new(&spec, 1).batch(0, spec.batch, schedule.microbatches);
            let mut threaded =
                Executor::new(schedule.clone(), stages(&spec, schedule.stages())).unwrap();
            let want = threaded.step(x.clone(), &t, &spec.loss).unwrap();
            threaded.optimizer_step().unwrap();
            let peers = CpuPeers::connect(2, Duration::from_secs(20));
            let results: Vec<_> = std::thread::scope(|scope| {
                let handles: Vec<_> = peers
                    .into_iter()
                    .enumerate()
                    .map(|(rank, mut peer)| {
                        let (schedule, spec, x, t) = (&schedule, &spec, &x, &t);
                        scope.spawn(move || rank_step(schedule, spec, rank, &mut peer, (x, t)))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let (outcomes, weights): (Vec<_>, Vec<_>) = results.into_iter().unzip();
            let got =
                assemble(&schedule, outcomes, 0.0).unwrap_or_else(|e| panic!("{family}: {e}"));
            for (a, b) in got.losses.iter().zip(&want.losses) {
                assert!((a - b).abs() <= 1e-6, "{family}: {a} vs {b}");
            }
            for (s, w) in weights.into_iter().flatten() {
                let reference = &threaded.stages()[s].layers[0].weight;
                let worst = w
                    .iter()
                    .zip(reference)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(
                    worst <= 1e-6,
                    "{family}: stage {s} weights differ by {worst}"
                );
            }
        }
    }

    #[test]
    fn the_link_type_is_the_rank_stages_one_and_mixed_types_are_refused() {
        let spec = spec(4, LossKind::Mse);
        let all = stages(&spec, 4);
        let bf16: Vec<LinearStage> = all
            .iter()
            .cloned()
            .map(|s| s.with_activations(ActivationDtype::Bf16))
            .collect();
        let pick = |v: &[LinearStage], at: &[usize]| -> Vec<(usize, LinearStage)> {
            at.iter().map(|&s| (s, v[s].clone())).collect()
        };
        fn refs(v: &[(usize, LinearStage)]) -> Vec<(usize, &LinearStage)> {
            v.iter().map(|(s, st)| (*s, st)).collect()
        }
        let ok = pick(&bf16, &[1, 3]);
        assert_eq!(rank_activations(&refs(&ok)).unwrap(), ActivationDtype::Bf16);
        let plain = pick(&all, &[0, 2]);
        assert_eq!(
            rank_activations(&refs(&plain)).unwrap(),
            ActivationDtype::F32
        );
        assert_eq!(rank_activations(&[]).unwrap(), ActivationDtype::F32);
        let mut mixed = pick(&bf16, &[0]);
        mixed.extend(pick(&all, &[2]));
        match rank_activations(&refs(&mixed)) {
            Err(CudaRankError::MixedActivations {
                stage: 2,
                expected: ActivationDtype::Bf16,
                got: ActivationDtype::F32,
            }) => {}
            other => panic!("mixed types: {other:?}"),
        }
    }
}
