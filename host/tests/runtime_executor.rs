//! The executor on hand-written schedules: results, memory accounting, order, and failures that
//! stop every rank.

use std::sync::mpsc;
use std::time::Duration;

use pipefill_host::runtime::{Executor, RuntimeError, Stage, StageError, StepReport, Tensor};
use pipefill_host::schedule::{Action, Item, Op, Placement, Schedule};

/// How a test stage misbehaves.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// Return an error from this op of this microbatch.
    Error(Op, usize),
    /// Panic in this op of this microbatch.
    Panic(Op, usize),
    /// Panic when asked how many bytes a stash holds.
    PanicInHeldBytes,
}

/// `y = w * x` elementwise with a scalar weight; records the order of its calls.
struct ScaleStage {
    w: f32,
    grad: f32,
    fault: Fault,
    calls: Vec<(Op, usize)>,
    steps: usize,
}

/// Input (for W), microbatch id, and the output gradient after I.
struct Stash {
    x: Tensor,
    k: usize,
    dy: Option<Tensor>,
}

impl ScaleStage {
    fn new(w: f32) -> Self {
        ScaleStage {
            w,
            grad: 0.0,
            fault: Fault::None,
            calls: Vec::new(),
            steps: 0,
        }
    }

    fn maybe_fail(&mut self, op: Op, k: usize) -> Result<(), StageError> {
        self.calls.push((op, k));
        match self.fault {
            Fault::Error(o, m) if o == op && m == k => Err(StageError::new("injected error")),
            Fault::Panic(o, m) if o == op && m == k => panic!("injected panic"),
            _ => Ok(()),
        }
    }
}

impl Stage for ScaleStage {
    type Stash = Stash;

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Stash), StageError> {
        // The microbatch id rides in the last value (tests keep it unscaled there by using w on the
        // other values only).
        let k = *x.data().last().unwrap_or(&0.0) as usize;
        self.maybe_fail(Op::F, k)?;
        let mut y = x.clone();
        let n = y.len();
        y.data_mut()[..n - 1].iter_mut().for_each(|v| *v *= self.w);
        Ok((y, Stash { x, k, dy: None }))
    }

    fn backward_input(&mut self, st: &mut Stash, dy: Tensor) -> Result<Tensor, StageError> {
        self.maybe_fail(Op::I, st.k)?;
        let mut dx = dy.clone();
        dx.scale(self.w);
        st.dy = Some(dy);
        Ok(dx)
    }

    fn backward_weight(&mut self, st: Stash) -> Result<(), StageError> {
        self.maybe_fail(Op::W, st.k)?;
        let dy = st.dy.ok_or_else(|| StageError::new("W before I"))?;
        let n = dy.len() - 1;
        self.grad += st.x.data()[..n]
            .iter()
            .zip(&dy.data()[..n])
            .map(|(a, b)| a * b)
            .sum::<f32>();
        Ok(())
    }

    fn held_bytes(&self, st: &Stash) -> usize {
        if self.fault == Fault::PanicInHeldBytes && st.k == 1 {
            panic!("held_bytes panicked");
        }
        st.x.bytes() + st.dy.as_ref().map_or(0, Tensor::bytes)
    }

    fn zero_grad(&mut self) {
        self.grad = 0.0;
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        self.w -= 0.1 * self.grad;
        self.steps += 1;
        Ok(())
    }
}

/// A deadlock-free order for any placement: every rank runs its forwards by ascending stage, then
/// its backwards by descending stage (`B`, or `I` then `W` at once, or all `W`s at the end).
fn breadth_first(
    ranks: usize,
    chunks: usize,
    m: usize,
    placement: Placement,
    split: u8,
) -> Schedule {
    let stages = ranks * chunks;
    let mut actions = vec![Vec::new(); ranks];
    for s in 0..stages {
        for k in 0..m {
            actions[placement.rank_of(s, ranks)].push(Item::One(Action::new(Op::F, s, k)));
        }
    }
    for s in (0..stages).rev() {
        let r = placement.rank_of(s, ranks);
        for k in 0..m {
            match split {
                0 => actions[r].push(Item::One(Action::new(Op::B, s, k))),
                1 => {
                    actions[r].push(Item::One(Action::new(Op::I, s, k)));
                    actions[r].push(Item::One(Action::new(Op::W, s, k)));
                }
                _ => actions[r].push(Item::One(Action::new(Op::I, s, k))),
            }
        }
    }
    if split > 1 {
        for s in 0..stages {
            for k in 0..m {
                actions[placement.rank_of(s, ranks)].push(Item::One(Action::new(Op::W, s, k)));
            }
        }
    }
    Schedule {
        name: "test-bfs".into(),
        ranks,
        chunks,
        microbatches: m,
        placement,
        actions,
    }
}

/// Microbatch `k`: `[1, 2]` values `(k + 1, k)` (the second value is the id the stage reads).
fn data(m: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    let x = (0..m)
        .map(|k| Tensor::new(vec![1, 2], vec![k as f32 + 1.0, k as f32]).unwrap())
        .collect();
    let t = (0..m)
        .map(|k| Tensor::new(vec![1, 2], vec![0.0, k as f32]).unwrap())
        .collect();
    (x, t)
}

/// Half the squared error of the first value.
fn loss(y: &Tensor, t: &Tensor) -> Result<(f32, Tensor), StageError> {
    let d = y.data()[0] - t.data()[0];
    Ok((0.5 * d * d, Tensor::new(vec![1, 2], vec![d, 0.0])?))
}

/// Runs one step on another thread, failing the test instead of hanging if it never returns.
fn step_with_deadline(
    mut ex: Executor<ScaleStage>,
    m: usize,
) -> (Result<StepReport, RuntimeError>, Executor<ScaleStage>) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (x, t) = data(m);
        let r = ex.step(x, &t, &loss);
        let _ = tx.send((r, ex));
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the step hung: a worker never returned")
}

/// The exact gradient of the step's mean loss for a chain of scalar weights: every microbatch's
/// output is `prod(w) * (k + 1)`; computed in f64.
fn expected_grads(ws: &[f32], m: usize) -> Vec<f64> {
    let prod: f64 = ws.iter().map(|&w| w as f64).product();
    (0..ws.len())
        .map(|i| {
            let others = prod / ws[i] as f64;
            (0..m)
                .map(|k| {
                    let x = k as f64 + 1.0;
                    (prod * x) * others * x / m as f64
                })
                .sum()
        })
        .collect()
}

#[test]
fn every_op_split_and_placement_gives_the_exact_gradient() {
    for placement in [Placement::Looped, Placement::Vshape] {
        for (ranks, chunks) in [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2)] {
            if placement == Placement::Vshape && chunks != 2 {
                continue;
            }
            for split in 0..3 {
                let m = 4;
                let ws: Vec<f32> = (0..ranks * chunks).map(|s| 0.9 + 0.05 * s as f32).collect();
                let sched = breadth_first(ranks, chunks, m, placement, split);
                let stages = ws.iter().map(|&w| ScaleStage::new(w)).collect();
                let ex = Executor::new(sched, stages).unwrap();
                let (r, mut ex) = step_with_deadline(ex, m);
                let r = r.unwrap();
                assert!(
                    ex.stages().iter().all(|s| s.steps == 0),
                    "the step leaves the gradients to the trainer's optimizer step"
                );
                ex.optimizer_step().unwrap();
                assert_eq!(
                    ex.optimizer_step(),
                    Err(RuntimeError::NoGradients),
                    "one step's gradients are applied once"
                );
                let want = expected_grads(&ws, m);
                for (s, st) in ex.stages().iter().enumerate() {
                    let rel = (st.grad as f64 - want[s]).abs() / want[s].abs();
                    assert!(
                        rel < 1e-5,
                        "{placement} P={ranks} V={chunks} split={split} stage {s}: {rel}"
                    );
                    assert_eq!(st.steps, 1, "the optimizer steps once per step");
                    assert!((st.w - (ws[s] - 0.1 * st.grad)).abs() < 1e-6);
                }
                assert_eq!(r.losses.len(), m);
                assert_eq!(
                    r.timeline.spans.iter().map(Vec::len).sum::<usize>(),
                    ex.schedule().action_count()
                );
            }
        }
    }
}

#[test]
fn each_rank_runs_its_list_in_order() {
    let sched = breadth_first(2, 2, 3, Placement::Looped, 2);
    let stages = (0..4).map(|_| ScaleStage::new(1.0)).collect();
    let (r, ex) = step_with_deadline(Executor::new(sched.clone(), stages).unwrap(), 3);
    let r = r.unwrap();
    for (rank, list) in sched.actions.iter().enumerate() {
        let ran: Vec<Item> = r.timeline.spans[rank].iter().map(|s| s.item()).collect();
        assert_eq!(&ran, list);
        for w in r.timeline.spans[rank].windows(2) {
            assert!(w[0].end <= w[1].start, "items on one rank never overlap");
        }
        // What each stage saw is its part of the rank's list, in the same order.
        for (s, st) in ex
            .stages()
            .iter()
            .enumerate()
            .filter(|(s, _)| s % 2 == rank)
        {
            let want: Vec<(Op, usize)> = list
                .iter()
                .flat_map(|i| i.actions())
                .filter(|a| a.stage == s)
                .map(|a| (a.op, a.microbatch))
                .collect();
            assert_eq!(st.calls, want);
        }
    }
    // Transfers only between different ranks: 2 boundaries between ranks per mb and direction,
    // times 3 microbatches: stage 0->1, 1->2, 2->3 all cross ranks in looped P=2.
    assert_eq!(r.timeline.transfers.len(), 3 * 3 * 2);
    assert!(r
        .timeline
        .transfers
        .iter()
        .all(|t| t.from_rank() != t.to_rank()));
}

#[test]
fn stashes_are_freed_at_w() {
    // Stage stash: x (8 bytes) after F, x + dy (16 bytes) after I, nothing after W.
    let m = 3;
    let all_w_last = breadth_first(1, 1, m, Placement::Looped, 2);
    let (r, _) = step_with_deadline(
        Executor::new(all_w_last, vec![ScaleStage::new(1.0)]).unwrap(),
        m,
    );
    assert_eq!(r.unwrap().peak_held_bytes, vec![16 * m]);
    let w_at_once = breadth_first(1, 1, m, Placement::Looped, 1);
    let (r, _) = step_with_deadline(
        Executor::new(w_at_once, vec![ScaleStage::new(1.0)]).unwrap(),
        m,
    );
    // All forwards held (8 each), then one grows to 16 and is freed before the next.
    assert_eq!(r.unwrap().peak_held_bytes, vec![8 * m + 8]);
}

fn failing_run(fault: Fault, fail_stage: usize) -> (RuntimeError, Executor<ScaleStage>) {
    let m = 4;
    let sched = breadth_first(3, 2, m, Placement::Looped, 2);
    let mut stages: Vec<ScaleStage> = (0..6).map(|_| ScaleStage::new(1.0)).collect();
    stages[fail_stage].fault = fault;
    let (r, ex) = step_with_deadline(Executor::new(sched, stages).unwrap(), m);
    (r.expect_err("the step must fail"), ex)
}

#[test]
fn an_error_in_a_layer_stops_every_rank_and_names_rank_and_action() {
    for (op, stage) in [(Op::F, 4), (Op::I, 1), (Op::W, 5), (Op::F, 0)] {
        let (e, mut ex) = failing_run(Fault::Error(op, 2), stage);
        let rank = stage % 3;
        assert_eq!(
            e,
            RuntimeError::ActionFailed {
                rank,
                action: Action::new(op, stage, 2),
                message: "injected error".into()
            }
        );
        assert!(e.to_string().contains(&format!("rank {rank}")), "{e}");
        assert_eq!(
            ex.optimizer_step(),
            Err(RuntimeError::NoGradients),
            "a failed step's gradients are refused"
        );
        assert!(
            ex.stages().iter().all(|s| s.steps == 0),
            "no optimizer step after a failure"
        );
    }
}

#[test]
fn a_panic_in_a_layer_stops_every_rank_and_names_rank_and_action() {
    let (e, ex) = failing_run(Fault::Panic(Op::I, 3), 2);
    assert_eq!(
        e,
        RuntimeError::ActionPanicked {
            rank: 2,
            action: Action::new(Op::I, 2, 3),
            message: "injected panic".into()
        }
    );
    assert_eq!(e.to_string(), "rank 2 panicked at 2I3: injected panic");
    assert!(ex.stages().iter().all(|s| s.steps == 0));
}

#[test]
fn refuses_what_does_not_fit() {
    let sched = breadth_first(2, 1, 2, Placement::Looped, 0);
    let Err(e) = Executor::new(sched.clone(), vec![ScaleStage::new(1.0)]) else {
        panic!("one stage for two")
    };
    assert!(
        matches!(
            e,
            RuntimeError::StageCount {
                expected: 2,
                got: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("2 stages"), "{e}");
    let mut wrong_rank = sched.clone();
    wrong_rank.actions.swap(0, 1);
    assert!(matches!(
        Executor::new(wrong_rank, vec![ScaleStage::new(1.0), ScaleStage::new(1.0)]),
        Err(RuntimeError::Schedule(_))
    ));
    let mut ex = Executor::new(sched, vec![ScaleStage::new(1.0), ScaleStage::new(1.0)]).unwrap();
    let (x, t) = data(3);
    let e = ex.step(x, &t, &loss).unwrap_err();
    assert_eq!(
        e,
        RuntimeError::BatchCount {
            microbatches: 2,
            inputs: 3,
            targets: 3
        }
    );
    assert!(e.to_string().contains("M = 2"), "{e}");
}

#[test]
fn a_panic_in_held_bytes_is_caught_too() {
    let (e, _) = failing_run(Fault::PanicInHeldBytes, 3);
    assert_eq!(
        e,
        RuntimeError::ActionPanicked {
            rank: 0,
            action: Action::new(Op::F, 3, 1),
            message: "held_bytes panicked".into()
        }
    );
}

#[test]
fn exclusive_mode_gives_the_same_step_and_times_every_action() {
    let sched = breadth_first(3, 2, 4, Placement::Looped, 2);
    let run = |exclusive: bool| {
        let stages = (0..6)
            .map(|s| ScaleStage::new(0.9 + 0.01 * s as f32))
            .collect();
        let mut ex = Executor::new(sched.clone(), stages).unwrap();
        ex.set_exclusive(exclusive);
        let (r, ex) = step_with_deadline(ex, 4);
        (r.unwrap(), ex)
    };
    let (a, ea) = run(false);
    let (b, eb) = run(true);
    assert_eq!(a.losses, b.losses);
    for (x, y) in ea.stages().iter().zip(eb.stages()) {
        assert_eq!(x.grad, y.grad);
    }
    assert_eq!(b.action_seconds.len(), sched.action_count());
    // One layer call at a time over all ranks: the actions' times add up to no more than the
    // step's wall time (which also covers thread start, hand-offs and the optimizer step).
    let busy: f64 = b.action_seconds.iter().map(|(_, t)| t).sum();
    assert!(
        busy > 0.0 && busy <= b.seconds,
        "{busy} s of actions in a {} s step",
        b.seconds
    );
}

#[test]
fn a_measured_step_report_round_trips_through_json() {
    let sched = breadth_first(2, 1, 3, Placement::Looped, 1);
    let stages = vec![ScaleStage::new(0.5), ScaleStage::new(2.0)];
    let (r, _) = step_with_deadline(Executor::new(sched, stages).unwrap(), 3);
    let r = r.unwrap();
    let json = serde_json::to_string(&r).unwrap();
    assert!(json.contains(r#"["1W2","#), "{json}");
    let back: StepReport = serde_json::from_str(&json).unwrap();
    // serde_json reads floats to within an ulp (exactly only with its `float_roundtrip` feature).
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-12 * a.abs().max(1e-3);
    assert_eq!(
        (&back.losses, &back.peak_held_bytes),
        (&r.losses, &r.peak_held_bytes)
    );
    assert!(near(back.seconds, r.seconds));
    for (x, y) in back.action_seconds.iter().zip(&r.action_seconds) {
        assert!(x.0 == y.0 && near(x.1, y.1), "{x:?} vs {y:?}");
    }
    let (a, b) = (&back.timeline, &r.timeline);
    assert_eq!(
        (&a.name, a.source, a.ranks()),
        (&b.name, b.source, b.ranks())
    );
    for (x, y) in a.spans.iter().flatten().zip(b.spans.iter().flatten()) {
        assert_eq!(x.item(), y.item());
        assert!(
            near(x.start, y.start) && near(x.end, y.end),
            "{x:?} vs {y:?}"
        );
    }
    assert_eq!(a.span_count(), b.span_count());
    assert_eq!(a.transfers.len(), b.transfers.len());
    for (x, y) in a.transfers.iter().zip(&b.transfers) {
        assert_eq!(
            (x.producer(), x.consumer(), x.bytes),
            (y.producer(), y.consumer(), y.bytes)
        );
        assert!(
            near(x.start, y.start) && near(x.end, y.end),
            "{x:?} vs {y:?}"
        );
    }
}
