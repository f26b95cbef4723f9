//! `--graph`'s runtime: a whole step captured as one CUDA graph (`StreamExecutor::capture`) and
//! replayed (`replay`) on [`CudaStreams`] gives the losses and weights of plain steps on the same
//! batches, within 1e-5 (relative, norm-wise), for 1f1b, zb-h1 and zbv (zbv forks a second stream
//! per rank), with AdamW (its bias corrections change every step, which is why the optimizer step
//! stays outside the graph) and with SGD + cross-entropy.
//!
//! Without a GPU every test prints `skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail
//! instead)` and passes; with `PIPEFILL_REQUIRE_GPU=1` it fails instead.

mod gpu_support;

use std::sync::Arc;

use gpu_support::{cpu_stages, rel, spec, streams_executor, upload_batch, StreamsEx};
use pipefill::cuda::{gpu_or_skip, Gpu};
use pipefill::layers::{LossKind, Optimizer};
use pipefill::model::Teacher;
use pipefill_host::schedule::{families, Params};

const TOL: f64 = 1e-5;
const STEPS: u64 = 6;

/// Every weight and bias of every stage, flattened (copied back from the device).
fn weights(ex: &StreamsEx) -> Vec<f32> {
    let mut all = Vec::new();
    for st in ex.stages() {
        let st = st.inner();
        for l in &st.layers {
            let (w, b) = l.parameters_to_host(st.launcher()).unwrap();
            all.extend(w);
            all.extend(b);
        }
    }
    all
}

/// `STEPS` plain steps against: step 0 plain, step 1 captured, the rest replayed.
fn check(gpu: &Arc<Gpu>, family: &str, loss: LossKind, opt: Optimizer) {
    let params = Params {
        ranks: 2,
        microbatches: 4,
        chunks: None,
        group_size: None,
    };
    let sched = families::generate(family, &params).unwrap();
    let spec = spec(sched.stages(), loss);
    let what = format!("{family} {loss} {opt}");
    let cpu = cpu_stages(&spec, &sched, opt, 11);
    let (mut plain, pd) = streams_executor(gpu, &sched, &cpu);
    let (mut graph, gd) = streams_executor(gpu, &sched, &cpu);
    let (pl, gl) = (pd.loss(loss), gd.loss(loss));
    let teacher = Teacher::new(&spec, 3);
    for step in 0..STEPS {
        let (x, t) = teacher.batch(step, spec.batch, params.microbatches);
        let (xi, ti) = upload_batch(gpu, loss, &x, &t);
        let want = plain.step(xi, &ti, &pl).unwrap();
        plain.optimizer_step().unwrap();
        let (xi, ti) = upload_batch(gpu, loss, &x, &t);
        let got = match step {
            0 => graph.step(xi, &ti, &gl),
            1 => graph.capture(xi, ti, &gl),
            _ => graph.replay(xi, ti),
        }
        .unwrap_or_else(|e| panic!("step {step}: {e}: {what}"));
        graph.optimizer_step().unwrap();
        let r = rel(&got.losses, &want.losses);
        assert!(
            r <= TOL,
            "step {step}: losses {:?} vs {:?} ({r:e}): {what}",
            got.losses,
            want.losses
        );
    }
    assert!(graph.is_captured(), "{what}");
    let r = rel(&weights(&graph), &weights(&plain));
    assert!(r <= TOL, "weights after {STEPS} steps: {r:e}: {what}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-check.sh does, with PIPEFILL_REQUIRE_GPU=1)"]
fn graph_steps_match_plain_steps_for_1f1b_zb_h1_and_zbv() {
    let Some(gpu) = gpu_or_skip("graph_steps_match_plain_steps_for_1f1b_zb_h1_and_zbv") else {
        return;
    };
    for family in ["1f1b", "zb-h1", "zbv"] {
        check(&gpu, family, LossKind::Mse, Optimizer::adamw(0.01));
        check(&gpu, family, LossKind::CrossEntropy, Optimizer::sgd(0.05));
    }
}
