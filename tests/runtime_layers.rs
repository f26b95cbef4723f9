//! The built-in CPU layers against an independent f64 reference: loss, input gradient, weight and
//! bias gradients of a small MLP, for every activation, both losses and both GEMM crates.
//! Tolerance: relative (norm-wise) 1e-4, the f32 rounding of these small products.

use pipefill::layers::gemm::GemmBackend;
use pipefill::layers::{LinearStage, LossKind, Optimizer};
use pipefill::model::{LayerSpec, ModelSpec, Teacher};
use pipefill_host::runtime::{Loss, Stage, Tensor};
use pipefill_kernels::Activation;

fn act(a: Activation, z: f64) -> f64 {
    match a {
        Activation::Identity => z,
        Activation::Relu => z.max(0.0),
        Activation::Gelu => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * z * (1.0 + (k * (z + 0.044715 * z.powi(3))).tanh())
        }
        Activation::Silu => z / (1.0 + (-z).exp()),
    }
}

/// The derivative by a central difference in f64 (independent of the kernels' closed forms).
fn act_grad(a: Activation, z: f64) -> f64 {
    let h = 1e-6;
    (act(a, z + h) - act(a, z - h)) / (2.0 * h)
}

fn rel(a: &[f32], b: &[f64]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let n: f64 = b.iter().map(|y| y * y).sum();
    d.sqrt() / n.sqrt().max(1e-30)
}

/// f64 forward + backward of the whole model for one batch: (loss, dX, per layer (dW, db)).
#[allow(clippy::type_complexity)]
fn reference(
    stage: &LinearStage,
    x: &[f32],
    rows: usize,
    target: &[f32],
    loss: LossKind,
) -> (f64, Vec<f64>, Vec<(Vec<f64>, Vec<f64>)>) {
    let mut xs = vec![x.iter().map(|&v| v as f64).collect::<Vec<f64>>()];
    let mut zs = Vec::new();
    for l in &stage.layers {
        let xin = xs.last().unwrap();
        let mut z = vec![0.0; rows * l.outputs];
        for r in 0..rows {
            for j in 0..l.outputs {
                z[r * l.outputs + j] = l.bias[j] as f64
                    + (0..l.inputs)
                        .map(|i| xin[r * l.inputs + i] * l.weight[i * l.outputs + j] as f64)
                        .sum::<f64>();
            }
        }
        xs.push(z.iter().map(|&v| act(l.activation, v)).collect());
        zs.push(z);
    }
    let y = xs.last().unwrap().clone();
    let out = stage.outputs();
    let (value, mut g) = match loss {
        LossKind::Mse => {
            let n = y.len() as f64;
            let v = y
                .iter()
                .zip(target)
                .map(|(a, &b)| (a - b as f64).powi(2))
                .sum::<f64>()
                / n;
            let g = y
                .iter()
                .zip(target)
                .map(|(a, &b)| 2.0 * (a - b as f64) / n)
                .collect();
            (v, g)
        }
        LossKind::CrossEntropy => {
            let mut v = 0.0;
            let mut g = vec![0.0; y.len()];
            for r in 0..rows {
                let row = &y[r * out..(r + 1) * out];
                let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = row.iter().map(|z| (z - mx).exp()).sum();
                let c = target[r] as usize;
                v += mx + s.ln() - row[c];
                for j in 0..out {
                    g[r * out + j] =
                        ((row[j] - mx).exp() / s - if j == c { 1.0 } else { 0.0 }) / rows as f64;
                }
            }
            (v / rows as f64, g)
        }
    };
    let mut grads = vec![(Vec::new(), Vec::new()); stage.layers.len()];
    for (li, l) in stage.layers.iter().enumerate().rev() {
        let dz: Vec<f64> = g
            .iter()
            .zip(&zs[li])
            .map(|(d, &z)| d * act_grad(l.activation, z))
            .collect();
        let xin = &xs[li];
        let mut dw = vec![0.0; l.inputs * l.outputs];
        let mut db = vec![0.0; l.outputs];
        let mut dx = vec![0.0; rows * l.inputs];
        for r in 0..rows {
            for j in 0..l.outputs {
                let d = dz[r * l.outputs + j];
                db[j] += d;
                for i in 0..l.inputs {
                    dw[i * l.outputs + j] += xin[r * l.inputs + i] * d;
                    dx[r * l.inputs + i] += d * l.weight[i * l.outputs + j] as f64;
                }
            }
        }
        grads[li] = (dw, db);
        g = dx;
    }
    (value, g, grads)
}

#[test]
fn linear_stage_matches_an_f64_reference() {
    for &gemm in GemmBackend::ALL {
        for activation in Activation::ALL {
            for loss in [LossKind::Mse, LossKind::CrossEntropy] {
                let spec = ModelSpec {
                    input: 7,
                    layers: vec![
                        LayerSpec {
                            width: 9,
                            activation,
                        },
                        LayerSpec {
                            width: 6,
                            activation,
                        },
                        LayerSpec {
                            width: 4,
                            activation: Activation::Identity,
                        },
                    ],
                    loss,
                    batch: 5,
                };
                let mut stages = spec
                    .build_stages(std::slice::from_ref(&(0..3)), Optimizer::sgd(0.1), gemm, 3)
                    .unwrap();
                let mut stage = stages.remove(0);
                stage.first = false; // compute the input gradient too
                let (xs, ts) = Teacher::new(&spec, 3).batch(0, 5, 1);
                let (x, t) = (&xs[0], &ts[0]);
                let (want_loss, want_dx, want_grads) =
                    reference(&stage, x.data(), 5, t.data(), loss);
                stage.zero_grad();
                let (y, stash) = stage.forward(x.clone()).unwrap();
                let (value, dy) = loss.loss(&y, t).unwrap();
                let dx: Tensor = stage.backward(stash, dy).unwrap();
                let what = format!("{gemm} {activation} {loss}");
                assert!(
                    ((value as f64) - want_loss).abs() <= 1e-5 * want_loss.abs().max(1.0),
                    "loss {what}"
                );
                assert!(
                    rel(dx.data(), &want_dx) < 1e-4,
                    "dX {what}: {}",
                    rel(dx.data(), &want_dx)
                );
                for (l, (dw, db)) in want_grads.iter().enumerate() {
                    let layer = &stage.layers[l];
                    let (Some(got_dw), Some(got_db)) = (layer.weight_grad(), layer.bias_grad())
                    else {
                        panic!("no gradient accumulated in layer {l} {what}");
                    };
                    assert!(rel(got_dw, dw) < 1e-4, "dW layer {l} {what}");
                    assert!(rel(got_db, db) < 1e-4, "db layer {l} {what}");
                }
            }
        }
    }
}

#[test]
fn the_first_stage_skips_its_input_gradient() {
    let spec = ModelSpec::uniform(2, 4, 2, Activation::Relu, LossKind::Mse, 4).unwrap();
    let mut stage = spec
        .build_stages(
            std::slice::from_ref(&(0..2)),
            Optimizer::sgd(0.1),
            GemmBackend::default(),
            1,
        )
        .unwrap()
        .remove(0);
    let (xs, _) = Teacher::new(&spec, 1).batch(0, 4, 1);
    let (y, mut stash) = stage.forward(xs[0].clone()).unwrap();
    let held = stage.held_bytes(&stash);
    assert_eq!(
        held,
        4 * (4 * 4 + 4 * 4 + 4 * 4),
        "X0, Z0, X1 (Z1 not kept: identity)"
    );
    let dx = stage
        .backward_input(&mut stash, Tensor::zeros(y.shape().to_vec()))
        .unwrap();
    assert!(dx.is_empty());
    assert!(
        stage
            .backward_input(&mut stash, Tensor::zeros(y.shape().to_vec()))
            .is_err(),
        "I twice"
    );
}

/// Selective recomputation on the built-in stage: after `F` every layer input that is the
/// activation of a kept pre-activation is dropped (the bytes counted), rebuilt before `I`, and
/// the input gradient, the weight and bias gradients are those of the stage that kept it, bit for
/// bit; nothing is dropped where the layer before is the identity, or with BF16 activations.
#[test]
fn shrunk_and_rebuilt_stashes_give_the_same_gradients_bit_for_bit() {
    use pipefill_host::cost::ActivationDtype;
    for &gemm in GemmBackend::ALL {
        for activation in Activation::ALL {
            let spec = ModelSpec {
                input: 7,
                layers: [9, 6, 4]
                    .map(|width| LayerSpec { width, activation })
                    .to_vec(),
                loss: LossKind::Mse,
                batch: 5,
            };
            let build = || {
                let mut s = spec
                    .build_stages(std::slice::from_ref(&(0..3)), Optimizer::sgd(0.1), gemm, 3)
                    .unwrap()
                    .remove(0);
                s.first = false;
                s
            };
            let (xs, ts) = Teacher::new(&spec, 3).batch(0, 5, 1);
            let (mut kept, mut shrunk) = (build(), build());
            let what = format!("{gemm} {activation}");
            let (y, mut a) = kept.forward(xs[0].clone()).unwrap();
            let (y2, mut b) = shrunk.forward(xs[0].clone()).unwrap();
            assert_eq!(y.data(), y2.data(), "{what}");
            let whole = shrunk.held_bytes(&b);
            let dropped = shrunk.shrink(&mut b).unwrap();
            // Layers 1 and 2 read act(Z) of the layer before: 5 rows of 9 and of 6 values.
            let expect = if activation == Activation::Identity {
                0
            } else {
                4 * 5 * (9 + 6)
            };
            assert_eq!(dropped, expect > 0, "{what}");
            assert_eq!(whole - shrunk.held_bytes(&b), expect, "{what}");
            shrunk.rebuild(&mut b).unwrap();
            assert_eq!(shrunk.held_bytes(&b), whole, "{what}");
            let (_, dy) = LossKind::Mse.loss(&y, &ts[0]).unwrap();
            kept.zero_grad();
            shrunk.zero_grad();
            let dx = kept.backward_input(&mut a, dy.clone()).unwrap();
            let dx2 = shrunk.backward_input(&mut b, dy).unwrap();
            kept.backward_weight(a).unwrap();
            shrunk.backward_weight(b).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(dx.data()), bits(dx2.data()), "dX {what}");
            for (l, (p, q)) in kept.layers.iter().zip(&shrunk.layers).enumerate() {
                assert_eq!(
                    bits(p.weight_grad().unwrap()),
                    bits(q.weight_grad().unwrap()),
                    "dW layer {l} {what}"
                );
                assert_eq!(
                    bits(p.bias_grad().unwrap()),
                    bits(q.bias_grad().unwrap()),
                    "db layer {l} {what}"
                );
            }
            let mut bf16 = build().with_activations(ActivationDtype::Bf16);
            let (_, mut c) = bf16.forward(xs[0].clone()).unwrap();
            assert!(!bf16.shrink(&mut c).unwrap(), "{what}: bf16 drops nothing");
        }
    }
}
