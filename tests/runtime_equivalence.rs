//! Checks of truth: every schedule family, run by the executor on random small shapes, gives the
//! same losses, gradients and updated weights as plain sequential training on one thread with the
//! same microbatches, and the same 20-step loss curve. Relative error <= 1e-5 (norm-wise per buffer:
//! only the order in which microbatches' weight gradients are summed may differ).

use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::{stage_ranges, LayerSpec, ModelSpec, Teacher};
use pipefill_host::cost::split_even;
use pipefill_host::runtime::{sequential_step, Executor};
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_kernels::Activation;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TOL: f64 = 1e-5;

/// `||a - b|| / max(||b||, tiny)` in f64.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    d.sqrt() / n.sqrt().max(1e-30)
}

/// A random small model whose layer count fits `stages`.
fn random_model(rng: &mut ChaCha8Rng, stages: usize, microbatches: usize) -> ModelSpec {
    let acts = Activation::ALL;
    let loss = if rng.random_bool(0.5) {
        LossKind::Mse
    } else {
        LossKind::CrossEntropy
    };
    let n = stages + rng.random_range(0..3);
    let mut layers: Vec<LayerSpec> = (0..n)
        .map(|_| LayerSpec {
            width: rng.random_range(2..9),
            activation: acts[rng.random_range(0..acts.len())],
        })
        .collect();
    if let Some(last) = layers.last_mut() {
        last.activation = Activation::Identity;
        last.width = last.width.max(2);
    }
    ModelSpec {
        input: rng.random_range(1..7),
        layers,
        loss,
        batch: microbatches * rng.random_range(1..4),
    }
}

fn stages_for(spec: &ModelSpec, s: &Schedule, opt: Optimizer, seed: u64) -> Vec<LinearStage> {
    let counts = split_even(spec.layers.len(), s.stages()).unwrap();
    spec.build_stages(
        &stage_ranges(&counts),
        opt,
        GemmBackend::Matrixmultiply,
        seed,
    )
    .unwrap()
}

/// Generates `family` for `params`, or `None` when the generator refuses these parameters.
fn generate(family: &str, params: &Params) -> Option<Schedule> {
    families::generate(family, params).ok()
}

/// One step both ways; compares losses, gradients and updated weights.
fn check_one_step(family: &str, sched: Schedule, spec: &ModelSpec, opt: Optimizer, seed: u64) {
    let teacher = Teacher::new(spec, seed);
    let m = sched.microbatches;
    let (x, t) = teacher.batch(0, spec.batch, m);
    let what = format!(
        "{family} P={} V={} M={m} model {:?}",
        sched.ranks, sched.chunks, spec
    );
    let mut seq = stages_for(spec, &sched, opt, seed);
    let want = sequential_step(&mut seq, x.clone(), &t, &spec.loss).unwrap();
    let mut ex = Executor::new(sched.clone(), stages_for(spec, &sched, opt, seed)).unwrap();
    let got = ex.step(x, &t, &spec.loss).unwrap();
    ex.optimizer_step().unwrap();
    assert!(
        rel(&got.losses, &want.losses) <= TOL,
        "losses differ: {what}"
    );
    for (s, (a, b)) in ex.stages().iter().zip(&seq).enumerate() {
        for (l, (la, lb)) in a.layers.iter().zip(&b.layers).enumerate() {
            let (Some(dwa), Some(dwb), Some(dba), Some(dbb)) = (
                la.weight_grad(),
                lb.weight_grad(),
                la.bias_grad(),
                lb.bias_grad(),
            ) else {
                panic!("stage {s} layer {l}: no gradient accumulated: {what}");
            };
            let g = rel(dwa, dwb);
            let gb = rel(dba, dbb);
            let w = rel(&la.weight, &lb.weight);
            let bb = rel(&la.bias, &lb.bias);
            assert!(
                g <= TOL && gb <= TOL && w <= TOL && bb <= TOL,
                "stage {s} layer {l}: dW {g:e} db {gb:e} W {w:e} b {bb:e}: {what}"
            );
            assert!(
                dwa.iter().any(|v| *v != 0.0) || dwb.iter().all(|v| *v == 0.0),
                "no gradient reached stage {s}: {what}"
            );
        }
    }
}

#[test]
fn every_family_matches_sequential_training_after_one_step() {
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let mut covered = Vec::new();
    let mut not_generated = Vec::new();
    for family in families::FAMILIES {
        let mut cases = 0;
        for attempt in 0..40 {
            if cases == 6 {
                break;
            }
            let ranks = rng.random_range(1..4);
            let microbatches = rng.random_range(1..7);
            let chunks = match family.default_chunks {
                1 => None,
                2 if family.placement == pipefill_host::schedule::Placement::Vshape => Some(2),
                _ => Some(rng.random_range(2..4)),
            };
            let params = Params {
                ranks,
                microbatches,
                chunks,
                group_size: None,
            };
            let Some(sched) = generate(family.name, &params) else {
                continue;
            };
            let spec = random_model(&mut rng, sched.stages(), microbatches);
            let opt = if attempt % 2 == 0 {
                Optimizer::sgd(0.05)
            } else {
                Optimizer::adamw(0.01)
            };
            check_one_step(family.name, sched, &spec, opt, attempt as u64);
            cases += 1;
        }
        if cases == 0 {
            not_generated.push(family.name);
        } else {
            covered.push(family.name);
        }
    }
    assert!(
        not_generated.is_empty(),
        "no case generated for {not_generated:?} (covered {covered:?})"
    );
}

#[test]
fn twenty_step_loss_curves_are_equal() {
    for family in families::FAMILIES {
        let params = Params {
            ranks: 2,
            microbatches: 4,
            chunks: None,
            group_size: None,
        };
        let sched = families::generate(family.name, &params)
            .unwrap_or_else(|e| panic!("{}: {e}", family.name));
        let spec = ModelSpec {
            input: 6,
            layers: (0..sched.stages() + 1)
                .map(|i| LayerSpec {
                    width: if i == sched.stages() { 3 } else { 8 },
                    activation: if i == sched.stages() {
                        Activation::Identity
                    } else {
                        Activation::Silu
                    },
                })
                .collect(),
            loss: LossKind::Mse,
            batch: 32,
        };
        // AdamW (the default) and SGD with momentum (sensitive to the gradient's scale too).
        for opt in [Optimizer::adamw(0.03), Optimizer::sgd(0.2)] {
            let teacher = Teacher::new(&spec, 5);
            let mut seq = stages_for(&spec, &sched, opt, 5);
            let mut ex = Executor::new(sched.clone(), stages_for(&spec, &sched, opt, 5)).unwrap();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for step in 0..20 {
                let (x, t) = teacher.batch(step, spec.batch, 4);
                a.push(ex.step(x.clone(), &t, &spec.loss).unwrap().loss);
                ex.optimizer_step().unwrap();
                b.push(sequential_step(&mut seq, x, &t, &spec.loss).unwrap().loss);
            }
            let what = format!("{} {opt}", family.name);
            assert!(rel(&a, &b) <= TOL, "{what}: {a:?} vs {b:?}");
            let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
            assert!(
                mean(&a[15..]) < mean(&a[..5]),
                "{what}: the loss must fall: {a:?}"
            );
        }
    }
}
