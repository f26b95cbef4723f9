//! The step hook: every action told once, on time, and "gradients ready" exactly once per stage per
//! step, after every `B`/`W` of that stage.

mod runtime_support;

use std::sync::{mpsc, Mutex};
use std::time::Duration;

use pipefill_host::runtime::{
    last_gradient_actions, Executor, RuntimeError, StepEvent, StepReport, Tensor,
};
use pipefill_host::schedule::{families, Action, Item, Op, Params, Schedule};
use runtime_support::{mse, Scale};

fn executor(schedule: Schedule) -> Executor<Scale> {
    let stages = (0..schedule.stages())
        .map(|s| Scale::new(1.0 - 0.05 * s as f32, 0.01))
        .collect();
    Executor::new(schedule, stages).unwrap()
}

/// Runs one hooked step on another thread (failing instead of hanging), then its optimizer step if
/// it succeeded; returns the report, the events in the order the hook saw them, and the executor.
fn hooked_step(
    mut ex: Executor<Scale>,
    panic_at: Option<Action>,
) -> (
    Result<StepReport, RuntimeError>,
    Vec<StepEvent>,
    Executor<Scale>,
) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let m = ex.schedule().microbatches;
        let x: Vec<Tensor> = (0..m)
            .map(|k| Tensor::new(vec![1, 2], vec![k as f32, 1.0]).unwrap())
            .collect();
        let events = Mutex::new(Vec::new());
        let r = ex.step_with(x.clone(), &x, &mse, |e| {
            events.lock().unwrap().push(e);
            if let StepEvent::ActionDone { action, .. } = e {
                if Some(action) == panic_at {
                    panic!("hook refused {action}");
                }
            }
        });
        if r.is_ok() {
            ex.optimizer_step().unwrap();
        }
        let _ = tx.send((r, events.into_inner().unwrap(), ex));
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the step hung: a worker never returned")
}

fn schedules() -> Vec<Schedule> {
    let p = |ranks, m| Params::new(ranks, m);
    vec![
        families::generate("1f1b", &p(3, 5)).unwrap(),
        families::generate("zb-h1", &p(2, 4)).unwrap(),
        families::generate("interleaved-1f1b", &p(2, 4).with_chunks(2)).unwrap(),
        families::generate("dualpipev", &p(2, 4)).unwrap(),
    ]
}

/// Checks one step's events against its schedule.
fn check_events(schedule: &Schedule, report: &StepReport, events: &[StepEvent]) {
    let name = &schedule.name;
    let done: Vec<(usize, Action, f64, f64)> = events
        .iter()
        .filter_map(|e| match *e {
            StepEvent::ActionDone {
                rank,
                action,
                start,
                end,
            } => Some((rank, action, start, end)),
            _ => None,
        })
        .collect();
    // Every action once, on its rank, in its rank's order.
    for (r, list) in schedule.actions.iter().enumerate() {
        let want: Vec<Action> = list.iter().flat_map(Item::actions).collect();
        let got: Vec<Action> = done.iter().filter(|d| d.0 == r).map(|d| d.1).collect();
        assert_eq!(got, want, "{name}: rank {r}");
    }
    // One clock: the timeline's and the hook's times both count from the step's start.
    for span in report.timeline.spans.iter().flatten() {
        if let Item::One(a) = span.item() {
            let d = done.iter().find(|d| d.1 == a).unwrap();
            assert_eq!((d.2, d.3), (span.start, span.end), "{name}: times of {a}");
            assert!(
                span.start > 0.0 && span.end <= report.seconds,
                "{name}: {a}"
            );
        }
    }
    for s in 0..schedule.stages() {
        let ready: Vec<usize> = (0..events.len())
            .filter(|&i| matches!(events[i], StepEvent::GradientsReady { stage, .. } if stage == s))
            .collect();
        assert_eq!(ready.len(), 1, "{name}: stage {s} gradients ready once");
        let i = ready[0];
        let StepEvent::GradientsReady { rank, at, .. } = events[i] else {
            unreachable!()
        };
        assert_eq!(rank, schedule.rank_of(s), "{name}: stage {s}");
        // After every B/W of the stage, and right after the last one.
        let grads: Vec<usize> = (0..events.len())
            .filter(|&j| {
                matches!(events[j], StepEvent::ActionDone { action, .. }
                    if action.stage == s && matches!(action.op, Op::B | Op::W))
            })
            .collect();
        assert_eq!(grads.len(), schedule.microbatches, "{name}: stage {s}");
        assert!(
            grads.iter().all(|&j| j < i),
            "{name}: stage {s} ready too early"
        );
        let last = *grads.last().unwrap();
        let StepEvent::ActionDone { action, end, .. } = events[last] else {
            unreachable!()
        };
        assert_eq!(Some(action), last_gradient_actions(schedule)[s], "{name}");
        assert_eq!(
            at, end,
            "{name}: stage {s} ready when its last gradient action ends"
        );
        let between = events[last + 1..i].iter().any(|e| match *e {
            StepEvent::ActionDone { rank: r, .. } | StepEvent::GradientsReady { rank: r, .. } => {
                r == rank
            }
        });
        assert!(!between, "{name}: stage {s} told late");
    }
}

#[test]
fn gradients_ready_once_per_stage_per_step_after_its_last_backward() {
    for schedule in schedules() {
        let mut ex = executor(schedule.clone());
        for _ in 0..2 {
            let (r, events, back) = hooked_step(ex, None);
            let r = r.unwrap();
            check_events(&schedule, &r, &events);
            ex = back;
        }
        assert!(ex.stages().iter().all(|s| s.steps == 2));
    }
}

#[test]
fn a_hooked_step_trains_exactly_like_a_plain_one() {
    let schedule = families::generate("zb-h1", &Params::new(2, 4)).unwrap();
    let (hooked, _, a) = hooked_step(executor(schedule.clone()), None);
    let mut b = executor(schedule);
    let x: Vec<Tensor> = (0..4)
        .map(|k| Tensor::new(vec![1, 2], vec![k as f32, 1.0]).unwrap())
        .collect();
    let plain = b.step(x.clone(), &x, &mse).unwrap();
    b.optimizer_step().unwrap();
    assert_eq!(hooked.unwrap().losses, plain.losses);
    for (x, y) in a.stages().iter().zip(b.stages()) {
        assert_eq!((x.w, x.grad), (y.w, y.grad));
    }
}

#[test]
fn a_panicking_hook_stops_the_step_and_names_rank_and_action() {
    let schedule = families::generate("1f1b", &Params::new(3, 4)).unwrap();
    let at = Action::new(Op::B, 1, 2);
    let (r, _, ex) = hooked_step(executor(schedule), Some(at));
    let e = r.unwrap_err();
    assert_eq!(
        e,
        RuntimeError::HookPanicked {
            rank: 1,
            action: at,
            message: "hook refused 1B2".into()
        }
    );
    assert!(
        ex.stages().iter().all(|s| s.steps == 0),
        "no optimizer step"
    );
}

#[test]
fn step_events_round_trip_through_json() {
    let e = StepEvent::ActionDone {
        rank: 1,
        action: Action::new(Op::W, 3, 7),
        start: 0.5,
        end: 0.75,
    };
    let json = serde_json::to_string(&e).unwrap();
    assert!(json.contains(r#""action":"3W7""#), "{json}");
    assert_eq!(serde_json::from_str::<StepEvent>(&json).unwrap(), e);
}

#[test]
fn per_rank_hooks_see_their_own_ranks_events_in_order_on_one_thread() {
    for schedule in schedules() {
        let mut ex = executor(schedule.clone());
        let m = schedule.microbatches;
        let x: Vec<Tensor> = (0..m)
            .map(|k| Tensor::new(vec![1, 2], vec![k as f32, 1.0]).unwrap())
            .collect();
        let (tx, rx) = mpsc::channel();
        let report = ex
            .step_with_each(x.clone(), &x, &mse, |mine| {
                let tx = tx.clone();
                let mut thread = None;
                move |e: StepEvent| {
                    let here = std::thread::current().id();
                    assert_eq!(*thread.get_or_insert(here), here, "one thread per rank");
                    assert_eq!(e.rank(), mine, "an event of another rank");
                    tx.send(e).unwrap();
                }
            })
            .unwrap();
        drop(tx);
        let events: Vec<StepEvent> = rx.iter().collect();
        check_events(&schedule, &report, &events);
        // The collecting form gives the same events, by rank.
        let (report, by_rank) = ex.step_with_events(x.clone(), &x, &mse).unwrap();
        assert_eq!(by_rank.len(), schedule.ranks);
        let flat: Vec<StepEvent> = by_rank.iter().flatten().copied().collect();
        check_events(&schedule, &report, &flat);
        for (r, list) in by_rank.iter().enumerate() {
            assert!(list.iter().all(|e| e.rank() == r), "{}", schedule.name);
        }
    }
}
