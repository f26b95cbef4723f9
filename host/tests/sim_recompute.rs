//! Recomputation in the cost model: full recomputation keeps only a stage's input between `F` and
//! its backward, and the backward runs the forward again first; selective keeps all but the
//! part the stage declares (`selective_bytes`), rebuilt in `selective_time` before the backward.
//! Checked against an independent count over the simulated timeline, and against closed forms;
//! the cost file refuses a selective stage that declares nothing.

use pipefill_host::cost::{CostInput, CostModel, LinkCost, Recompute, StageCost};
use pipefill_host::schedule::{families, Op, Params};
use pipefill_host::sim::simulate;

/// Stages with F = 1, I = 1.5, W = 1, `activation` bytes held, `input` bytes of input, and
/// `released` freed at I.
fn model(stages: usize, activation: f64, input: f64, released: f64, mode: Recompute) -> CostModel {
    let mut st = StageCost::uniform(1.0, 1.5, 1.0);
    st.activation_bytes = activation;
    st.input_bytes = input;
    st.released_at_input = released;
    CostModel::uniform(st.with_recompute(mode), stages, LinkCost::default())
}

/// The peak per rank, counted from the timeline alone: walking each rank's spans in order, `F`
/// takes the kept bytes, `I`/`B` first takes the rebuilt part and then frees what it frees, `W`
/// frees the rest.
fn counted_peak(costs: &CostModel, spans: &[Vec<pipefill_host::timeline::Span>]) -> Vec<f64> {
    spans
        .iter()
        .map(|lane| {
            let (mut now, mut peak) = (0.0_f64, 0.0_f64);
            for span in lane {
                for a in span.item().actions() {
                    let c = &costs.stages[a.stage];
                    let kept = match c.recompute {
                        Recompute::Full => c.input_bytes.min(c.activation_bytes),
                        Recompute::Selective => c.activation_bytes - c.selective_bytes,
                        _ => c.activation_bytes,
                    };
                    let rebuilt = c.activation_bytes - kept;
                    match a.op {
                        Op::F => now += kept,
                        Op::I => {
                            now += rebuilt;
                            peak = peak.max(now);
                            now -= c.released_at_input;
                        }
                        Op::B => {
                            now += rebuilt;
                            peak = peak.max(now);
                            now -= c.activation_bytes;
                        }
                        Op::W => now -= c.activation_bytes - c.released_at_input,
                    }
                    peak = peak.max(now);
                }
            }
            peak
        })
        .collect()
}

#[test]
fn full_recomputation_holds_what_an_independent_count_says_and_less_than_without() {
    let mut compared = 0;
    for family in ["1f1b", "zb-h1", "zb-h2", "interleaved-1f1b", "zbv", "gpipe"] {
        let fam = families::family(family).expect("a known family");
        for (p, m) in [(2usize, 4usize), (4, 8), (4, 12)] {
            let params = Params {
                ranks: p,
                microbatches: m,
                chunks: None,
                group_size: None,
            };
            let Ok(s) = (fam.generate)(&params) else {
                continue;
            };
            let none = model(s.stages(), 100.0, 10.0, 30.0, Recompute::None);
            let full = model(s.stages(), 100.0, 10.0, 30.0, Recompute::Full);
            let a = simulate(&s, &none).unwrap();
            let b = simulate(&s, &full).unwrap();
            assert_eq!(
                b.peak_activations,
                counted_peak(&full, &b.timeline.spans),
                "{family} {p} {m}"
            );
            assert_eq!(
                a.peak_activations,
                counted_peak(&none, &a.timeline.spans),
                "{family} {p} {m}"
            );
            let (pa, pb) = (
                a.peak_activations.iter().cloned().fold(0.0, f64::max),
                b.peak_activations.iter().cloned().fold(0.0, f64::max),
            );
            assert!(
                pb < pa,
                "{family} P={p} M={m}: full {pb} not below none {pa}"
            );
            // The forward runs again inside every I or B: the step takes longer.
            assert!(
                b.timeline.makespan() > a.timeline.makespan(),
                "{family} {p} {m}"
            );
            compared += 1;
        }
    }
    assert!(compared >= 12, "only {compared} cases ran");
}

#[test]
fn one_stage_closed_form() {
    // One stage, M microbatches, GPipe order: all F first, then all B. Without recomputation the
    // peak is M * A; with it M * input + (A - input) (one stash rebuilt at a time), and each B
    // takes F longer.
    let s = (families::family("gpipe").unwrap().generate)(&Params {
        ranks: 1,
        microbatches: 5,
        chunks: None,
        group_size: None,
    })
    .unwrap();
    let none = model(1, 100.0, 10.0, 0.0, Recompute::None);
    let full = model(1, 100.0, 10.0, 0.0, Recompute::Full);
    let a = simulate(&s, &none).unwrap();
    let b = simulate(&s, &full).unwrap();
    assert_eq!(a.peak_activations, vec![500.0]);
    assert_eq!(b.peak_activations, vec![5.0 * 10.0 + 90.0]);
    assert_eq!(b.timeline.makespan() - a.timeline.makespan(), 5.0);
}

#[test]
fn the_cost_file_carries_recomputation_per_stage() {
    let text = r#"{"stages": [
        {"forward": 1, "backward": 2, "activation_bytes": 100, "parameter_bytes": 0, "output_bytes": 8},
        {"forward": 1, "backward": 2, "activation_bytes": 100, "parameter_bytes": 0, "recompute": "full"}
    ]}"#;
    let CostInput::Stages(m) = CostInput::parse(text).unwrap() else {
        panic!("per-stage costs")
    };
    assert_eq!(m.stages[0].recompute, Recompute::None);
    assert_eq!(m.stages[1].recompute, Recompute::Full);
    // The second stage's input defaults to what the first sends.
    assert_eq!(m.stages[1].input_bytes, 8.0);
    assert_eq!(m.stages[1].footprint().allocated_by(Op::F), 8.0);
    assert_eq!(m.stages[1].time(Op::I), 2.0);

    let bad = text.replace("\"full\"", "\"some\"");
    let e = CostInput::parse(&bad).unwrap_err().to_string();
    assert!(
        e.contains("stages[1].recompute") && e.contains("none, full"),
        "{e}"
    );

    let on_layer = r#"{"layers": [{"name": "a", "forward": 1, "backward": 2, "activation_bytes": 1,
        "parameter_bytes": 0, "recompute": "full"}]}"#;
    let e = CostInput::parse(on_layer).unwrap_err().to_string();
    assert!(
        e.contains("layers[0].recompute") && e.contains("per-stage"),
        "{e}"
    );
}

/// [`model`] with 40 of the 100 bytes declared selective, rebuilt in 0.25.
fn selective_model(stages: usize, mode: Recompute) -> CostModel {
    let mut m = model(stages, 100.0, 10.0, 30.0, Recompute::None);
    for st in &mut m.stages {
        (st.selective_bytes, st.selective_time) = (40.0, 0.25);
        *st = st.with_recompute(mode);
    }
    m
}

#[test]
fn selective_recomputation_holds_what_an_independent_count_says_between_none_and_full() {
    let mut compared = 0;
    for family in ["1f1b", "zb-h1", "zb-h2", "zbv", "gpipe"] {
        let fam = families::family(family).expect("a known family");
        let Ok(s) = (fam.generate)(&Params::new(4, 8)) else {
            continue;
        };
        let sims = [Recompute::None, Recompute::Selective, Recompute::Full].map(|mode| {
            let costs = selective_model(s.stages(), mode);
            let sim = simulate(&s, &costs).unwrap();
            let counted = counted_peak(&costs, &sim.timeline.spans);
            assert_eq!(sim.peak_activations, counted, "{family} {mode}");
            // Rank 0 keeps the most microbatches between F and I/B (a last rank that runs I right
            // after F saves nothing in any mode).
            (counted[0], sim.timeline.makespan(), sim.lower_bound)
        });
        let [none, selective, full] = sims;
        assert!(
            full.0 < selective.0 && selective.0 < none.0,
            "{family}: rank 0's peaks {sims:?}"
        );
        // The rebuild (0.25) is cheaper than the forward (1): between the two in time.
        assert!(
            none.1 < selective.1 && selective.1 < full.1,
            "{family}: times {sims:?}"
        );
        assert!(none.2 < selective.2, "{family}: the bound sees the rebuild");
        compared += 1;
    }
    assert!(compared >= 4, "only {compared} cases ran");
}

#[test]
fn the_cost_file_reads_selective_and_refuses_it_where_nothing_is_declared() {
    let text = r#"{"stages": [
        {"forward": 1, "backward": 2, "activation_bytes": 100, "parameter_bytes": 0},
        {"forward": 1, "backward": 2, "activation_bytes": 100, "parameter_bytes": 0,
         "selective_bytes": 40, "selective_time": 0.25, "recompute": "selective"}
    ]}"#;
    let CostInput::Stages(m) = CostInput::parse(text).unwrap() else {
        panic!("per-stage costs")
    };
    assert_eq!(m.recompute(), vec![Recompute::None, Recompute::Selective]);
    assert_eq!(m.stages[1].footprint().allocated_by(Op::F), 60.0);
    assert_eq!(m.stages[1].time(Op::I), 1.25);
    // A stage asking for it without declaring anything selective.
    let bad = text.replace("\"selective_bytes\": 40", "\"selective_bytes\": 0");
    let e = CostInput::parse(&bad).unwrap_err().to_string();
    assert!(
        e.contains("stages[1].recompute") && e.contains("selective_bytes"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    // More than the stash.
    let bad = text.replace("\"selective_bytes\": 40", "\"selective_bytes\": 400");
    let e = CostInput::parse(&bad).unwrap_err().to_string();
    assert!(e.contains("stages[1].selective_bytes"), "{e}");
    // A file written before selective recomputation: nothing declared, nothing selective.
    let old = r#"{"stages": [{"forward": 1, "backward": 2, "activation_bytes": 1, "parameter_bytes": 0}]}"#;
    let CostInput::Stages(m) = CostInput::parse(old).unwrap() else {
        panic!("per-stage costs")
    };
    assert!(!m.stages[0].selective() && m.selective_where_declared().is_none());
    // Per layer: counted from each stage's second layer on.
    let layers = r#"{"layers": [
        {"name": "a", "forward": 1, "backward": 2, "activation_bytes": 100, "parameter_bytes": 0, "selective_bytes": 30, "selective_time": 0.5},
        {"name": "b", "forward": 1, "backward": 2, "activation_bytes": 100, "parameter_bytes": 0, "selective_bytes": 30, "selective_time": 0.5}
    ]}"#;
    let CostInput::Layers(f) = CostInput::parse(layers).unwrap() else {
        panic!("per-layer costs")
    };
    let one = f.model(&[2]).unwrap();
    assert_eq!(
        (one.stages[0].selective_bytes, one.stages[0].selective_time),
        (30.0, 0.5)
    );
    let two = f.model(&[1, 1]).unwrap();
    assert!(two.stages.iter().all(|st| !st.selective()));
}
