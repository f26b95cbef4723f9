//! Tests of truth: the simulator against closed forms with zero communication, over a grid of P, M, V,
//! on the schedules the generators produce (plus GPipe with latency, whose closed form is also known).
//!
//! - GPipe and 1F1B: makespan `(M+P-1)(F+B)`, bubble fraction `(P-1)/(M+P-1)`.
//! - Interleaved 1F1B (`M` a multiple of `P`): bubble time `makespan - M(F+B) = (P-1)(F+B)/V`, with `F`
//!   and `B` one rank's work (each of the `V` stages costs `1/V` of it).
//! - ZB-H1 (`M >= P`): bubble time `(P-1)(F+I-W)` with `B = I + W`.
//! - ZB-H2 and ZB-V with `F = I = W`: no idle time inside any rank's busy window, and the makespan equals
//!   the lower bound (no schedule can do better).

mod sim_support;

use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_host::sim::simulate;
use sim_support::{assert_critical_path, assert_matches_reference, close, costs};

const PS: &[usize] = &[1, 2, 3, 4, 8];
const MS: &[usize] = &[1, 2, 3, 4, 7, 8, 16, 32];

fn gen(name: &str, p: usize, m: usize, v: Option<usize>) -> Schedule {
    let params = Params {
        ranks: p,
        microbatches: m,
        chunks: v,
        group_size: None,
    };
    families::generate(name, &params).unwrap_or_else(|e| panic!("{name} P={p} M={m} V={v:?}: {e}"))
}

/// Idle time of rank `r` between its first start and its last end.
fn inner_idle(t: &pipefill_host::timeline::Timeline, r: usize) -> f64 {
    let lane = &t.spans[r];
    match (lane.first(), lane.last()) {
        (Some(a), Some(b)) => (b.end - a.start) - t.busy(r),
        _ => 0.0,
    }
}

#[test]
fn gpipe_and_1f1b_makespan_and_bubble() {
    for name in ["gpipe", "1f1b"] {
        for &p in PS {
            for &m in MS {
                for (f, i, w) in [(1.0, 1.0, 1.0), (1.0, 0.5, 1.5), (0.3, 0.2, 0.45)] {
                    let s = gen(name, p, m, None);
                    let c = costs(p, f, i, w, 0.0);
                    let sim = simulate(&s, &c).unwrap();
                    let b = i + w;
                    let want = (m + p - 1) as f64 * (f + b);
                    let t = &sim.timeline;
                    assert!(
                        close(t.makespan(), want),
                        "{name} P={p} M={m}: makespan {} want {want}",
                        t.makespan()
                    );
                    let bubble = (p - 1) as f64 / (m + p - 1) as f64;
                    assert!(
                        close(t.bubble_fraction(), bubble),
                        "{name} P={p} M={m}: bubble {} want {bubble}",
                        t.bubble_fraction()
                    );
                    assert!(sim.lower_bound <= t.makespan() + 1e-9);
                    assert_critical_path(&sim);
                }
            }
        }
    }
}

#[test]
fn gpipe_with_latency() {
    // Forward wave: rank p starts at p(F+T); backward wave returns with B+T per hop.
    for &p in PS {
        for &m in MS {
            let (f, b, lat) = (1.0, 2.0, 0.25);
            let s = gen("gpipe", p, m, None);
            let sim = simulate(&s, &costs(p, f, b / 2.0, b / 2.0, lat)).unwrap();
            let want = m as f64 * (f + b) + (p - 1) as f64 * (f + b + 2.0 * lat);
            assert!(
                close(sim.timeline.makespan(), want),
                "P={p} M={m}: {} want {want}",
                sim.timeline.makespan()
            );
            let hops = if p > 1 { 2 * m * (p - 1) } else { 0 };
            assert_eq!(sim.timeline.transfers.len(), hops);
            assert_critical_path(&sim);
        }
    }
}

#[test]
fn interleaved_1f1b_bubble_time() {
    for &p in &[2usize, 3, 4, 8] {
        for v in 2..=4usize {
            for mult in [1usize, 2, 4] {
                let m = p * mult;
                let s = gen("interleaved-1f1b", p, m, Some(v));
                // One rank's work F = 1, B = 2, split over V stages.
                let (f, b) = (1.0, 2.0);
                let c = costs(
                    p * v,
                    f / v as f64,
                    b / 2.0 / v as f64,
                    b / 2.0 / v as f64,
                    0.0,
                );
                let sim = simulate(&s, &c).unwrap();
                let bubble_time = sim.timeline.makespan() - m as f64 * (f + b);
                let want = (p - 1) as f64 * (f + b) / v as f64;
                assert!(
                    close(bubble_time, want),
                    "P={p} V={v} M={m}: bubble time {bubble_time} want {want}"
                );
                assert_critical_path(&sim);
            }
        }
    }
}

#[test]
fn zb_h1_bubble_time() {
    for &p in PS {
        for &m in MS.iter().filter(|&&m| m >= p) {
            for (f, i, w) in [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (2.0, 1.0, 1.0)] {
                let s = gen("zb-h1", p, m, None);
                let sim = simulate(&s, &costs(p, f, i, w, 0.0)).unwrap();
                let bubble_time = sim.timeline.makespan() - m as f64 * (f + i + w);
                let want = (p - 1) as f64 * (f + i - w);
                assert!(
                    close(bubble_time, want),
                    "P={p} M={m} F={f} I={i} W={w}: bubble time {bubble_time} want {want}"
                );
                assert_critical_path(&sim);
            }
        }
    }
}

#[test]
fn zb_h2_and_zbv_have_no_inner_bubble_when_f_i_w_equal() {
    for (name, v) in [("zb-h2", 1usize), ("zbv", 2)] {
        for &p in PS {
            for &m in MS.iter().filter(|&&m| m >= 2 * p) {
                let s = gen(name, p, m, Some(v));
                let sim = simulate(&s, &costs(p * v, 1.0, 1.0, 1.0, 0.0)).unwrap();
                let t = &sim.timeline;
                for r in 0..p {
                    let idle = inner_idle(t, r);
                    assert!(
                        close(idle, 0.0),
                        "{name} P={p} M={m} rank {r}: idle {idle} inside its busy window"
                    );
                }
                assert!(
                    close(t.makespan(), sim.lower_bound),
                    "{name} P={p} M={m}: makespan {} vs lower bound {}",
                    t.makespan(),
                    sim.lower_bound
                );
                assert_critical_path(&sim);
            }
        }
    }
}

#[test]
fn every_family_matches_the_reference_simulator_with_latency() {
    for fam in families::FAMILIES {
        for &p in &[1usize, 2, 3, 4] {
            for &m in &[1usize, 3, 4, 8] {
                let Ok(s) = (fam.generate)(&Params::new(p, m)) else {
                    continue;
                };
                let c = costs(s.stages(), 1.0, 0.7, 0.4, 0.3);
                let sim = simulate(&s, &c).unwrap();
                assert_matches_reference(&s, &c, &sim);
                assert!(
                    sim.lower_bound <= sim.timeline.makespan() + 1e-9,
                    "{} below the bound",
                    fam.name
                );
                assert_critical_path(&sim);
            }
        }
    }
}
