//! The machine on its own: each order check refuses what it names before the stage is called, the
//! held bytes follow the stage's reports, and the loss gradient is scaled and kept for the last
//! stage's backward.

use super::*;
use crate::runtime::Tensor;
use crate::schedule::deps::Flow;
use crate::schedule::Schedule;

/// Doubles its input; its stash is the input (4 bytes per value), half of it released by `I`.
/// Counts its calls.
#[derive(Default)]
struct Twice {
    calls: usize,
}

impl Stage for Twice {
    type Stash = (usize, bool);

    fn forward(&mut self, mut x: Tensor) -> Result<(Tensor, (usize, bool)), StageError> {
        self.calls += 1;
        let bytes = x.bytes();
        x.scale(2.0);
        Ok((x, (bytes, false)))
    }

    fn backward_input(
        &mut self,
        st: &mut (usize, bool),
        mut g: Tensor,
    ) -> Result<Tensor, StageError> {
        self.calls += 1;
        st.1 = true;
        g.scale(2.0);
        Ok(g)
    }

    fn backward_weight(&mut self, _: (usize, bool)) -> Result<(), StageError> {
        self.calls += 1;
        Ok(())
    }

    fn held_bytes(&self, st: &(usize, bool)) -> usize {
        if st.1 {
            st.0 / 2
        } else {
            st.0
        }
    }

    fn zero_grad(&mut self) {}

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        Ok(())
    }
}

/// Plain calls: the stage's error becomes the action's.
struct Plain;

impl Calls<Tensor> for Plain {
    type Stop = RuntimeError;

    fn rank(&self) -> usize {
        0
    }

    fn keep(&mut self, _: Action, input: &Tensor) -> Result<Tensor, RuntimeError> {
        Ok(input.clone())
    }
}

/// Two stages on one rank, two microbatches.
fn schedule() -> Schedule {
    Schedule::looped("test", 1, 2, 2, vec![Vec::new()])
}

fn x() -> Tensor {
    Tensor::new(vec![1, 2], vec![1.0, 3.0]).expect("a 1 x 2 tensor")
}

fn act(a: &str) -> Action {
    a.parse().expect("an action")
}

/// The identity loss: the value is the output's first element, the gradient the output.
fn loss(y: &Tensor, _: &Tensor) -> Result<(f32, Tensor), StageError> {
    Ok((y.data()[0], y.clone()))
}

fn run(
    m: &mut Machine<Tensor, (usize, bool)>,
    stage: &mut Twice,
    a: &str,
) -> Result<Option<(Edge, Tensor)>, RuntimeError> {
    let targets = [x(), x()];
    m.run(act(a), stage, &targets, &loss, &mut Plain)
}

/// The message of an `ActionFailed`, or what else came.
fn refused(r: Result<Option<(Edge, Tensor)>, RuntimeError>) -> String {
    match r {
        Err(RuntimeError::ActionFailed { message, .. }) => message,
        other => format!("not refused: {other:?}"),
    }
}

#[test]
fn order_checks_refuse_before_the_stage_is_called() {
    let s = schedule();
    let mut st = Twice::default();
    let mut m: Machine<Tensor, (usize, bool)> = Machine::new(0, &s, vec![x(), x()]);
    assert!(refused(run(&mut m, &mut st, "0W0")).starts_with("no stash"));
    assert!(refused(run(&mut m, &mut st, "1F0")).starts_with("its input was neither"));
    let (edge, out) = run(&mut m, &mut st, "0F0")
        .expect("0F0 runs")
        .expect("0F0 hands its output on");
    assert_eq!(
        (edge.flow, edge.from, out.data()),
        (Flow::Activation, 0, &[2.0, 6.0][..])
    );
    assert_eq!(st.calls, 1);
    assert!(refused(run(&mut m, &mut st, "0F0")).starts_with("no input for this microbatch"));
    m.inputs[0] = Some(x());
    assert!(refused(run(&mut m, &mut st, "0F0")).starts_with("this forward already ran"));
    assert_eq!(st.calls, 1, "refused actions never reach the stage");
    m.put(edge, out);
    assert!(run(&mut m, &mut st, "1F0").is_ok());
    assert!(refused(run(&mut m, &mut st, "1W0")).starts_with("W before I"));
    // `W` consumed the stash it refused; the loss gradient waits, but `I` has no stash.
    let calls = st.calls;
    assert!(refused(run(&mut m, &mut st, "1I0")).starts_with("no stash"));
    assert_eq!(st.calls, calls);
}

#[test]
fn i_then_b_is_refused_and_bytes_follow_the_stage() {
    let s = schedule();
    let mut st = Twice::default();
    let mut m: Machine<Tensor, (usize, bool)> = Machine::new(0, &s, vec![x(), x()]);
    for a in ["0F0", "0F1"] {
        if let Ok(Some((e, data))) = run(&mut m, &mut st, a) {
            m.put(e, data);
        }
    }
    assert_eq!(m.peak(), 16, "two stashes of 8 bytes");
    // The last stage's forward computes the loss; its gradient, scaled by 1/M, waits for 1I0.
    assert!(matches!(run(&mut m, &mut st, "1F0"), Ok(None)));
    assert_eq!(m.peak(), 24);
    let to_last = Edge::gradient_of(act("1I0"));
    let grad = m.remove(to_last).expect("the loss gradient waits for 1I0");
    assert_eq!(grad.data(), &[2.0, 6.0], "the output (4, 12) scaled by 1/M");
    m.put(to_last, grad);
    let handed = run(&mut m, &mut st, "1I0").ok().flatten();
    assert_eq!(
        handed.map(|(e, _)| (e.flow, e.from)),
        Some((Flow::Gradient, 1))
    );
    assert!(refused(run(&mut m, &mut st, "1I0")).contains("neither"));
    assert_eq!(m.peak(), 24, "I released half of 1F0's stash");
    m.put(to_last, x());
    assert!(refused(run(&mut m, &mut st, "1I0")).starts_with("I already ran"));
    m.put(to_last, x());
    assert!(refused(run(&mut m, &mut st, "1B0")).starts_with("B after I"));
    assert_eq!(m.take_losses(), vec![(0, 4.0)]);
    assert_eq!(m.losses_by_microbatch(2), vec![None, None], "taken once");
}
