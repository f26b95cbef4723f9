//! Full and selective recomputation on every runner: a stage that keeps only its input from `F`
//! and runs its forward again before `I`/`B`, or drops the part of its stash it rebuilds cheaply
//! ([`Stage::shrink`], [`Stage::rebuild`]), gives the losses, gradients and weights of the run
//! without it, bit for bit, over several steps (threads, the stream executor on `CpuStreams`,
//! `RankStreams` over `CpuPeers`; 1F1B, ZB-H1 with split `I`/`W`, ZB-V); the forwards really ran
//! twice with full recomputation and once with selective (counted), the rebuilds were timed apart;
//! the measured peak held bytes are lower (none > selective > full), and equal the simulator's
//! footprint curve for the same order and byte sizes (an independent count), in every mode.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pipefill_host::cost::{CostModel, LinkCost, Recompute, StageCost};
use pipefill_host::runtime::streams::{
    CpuPeers, CpuStreams, OnStreams, Pending, PostOrder, RankBatch, RankStreams, StreamExecutor,
};
use pipefill_host::runtime::{assemble, Executor, Stage, StageError, Tensor};
use pipefill_host::schedule::deps::Edge;
use pipefill_host::schedule::{families, Params, Schedule};
use pipefill_host::sim::{peak_activations, simulate};

mod streams_support;

use streams_support::{cells, mse, Cell};

const STEPS: usize = 3;
const FAMILIES: [&str; 3] = ["1f1b", "zb-h1", "zbv"];

/// A [`Cell`] that counts its forwards (shared by every stage of a run), keeps one more tensor
/// (a copy of its input, 16 bytes: what selective recomputation keeps beyond full's input) and can
/// drop its output `y = tanh(w x + b)` after `F` (rebuilt from `x` before `I`/`B`).
struct Counted {
    cell: Cell,
    forwards: Arc<AtomicUsize>,
}

type CellStash = <Cell as Stage>::Stash;

impl Stage for Counted {
    type Stash = (CellStash, Tensor);

    fn forward(&mut self, x: Tensor) -> Result<(Tensor, Self::Stash), StageError> {
        self.forwards.fetch_add(1, Ordering::SeqCst);
        let extra = x.clone();
        let (y, st) = self.cell.forward(x)?;
        Ok((y, (st, extra)))
    }

    fn backward_input(&mut self, st: &mut Self::Stash, dy: Tensor) -> Result<Tensor, StageError> {
        if st.0 .1.is_empty() {
            return Err(StageError::new("backward on a shrunk stash"));
        }
        self.cell.backward_input(&mut st.0, dy)
    }

    fn backward_weight(&mut self, st: Self::Stash) -> Result<(), StageError> {
        self.cell.backward_weight(st.0)
    }

    fn held_bytes(&self, st: &Self::Stash) -> usize {
        self.cell.held_bytes(&st.0) + st.1.bytes()
    }

    fn shrink(&mut self, st: &mut Self::Stash) -> Result<bool, StageError> {
        st.0 .1 = Tensor::empty();
        Ok(true)
    }

    fn rebuild(&mut self, st: &mut Self::Stash) -> Result<(), StageError> {
        if st.0 .1.is_empty() {
            let mut y = st.0 .0.clone();
            let (w, b) = (self.cell.w, self.cell.b);
            y.data_mut()
                .iter_mut()
                .for_each(|v| *v = (w * *v + b).tanh());
            st.0 .1 = y;
        }
        Ok(())
    }

    fn zero_grad(&mut self) {
        self.cell.zero_grad();
    }

    fn optimizer_step(&mut self) -> Result<(), StageError> {
        self.cell.optimizer_step()
    }
}

fn counted(n: usize, forwards: &Arc<AtomicUsize>) -> Vec<Counted> {
    cells(n)
        .into_iter()
        .map(|cell| Counted {
            cell,
            forwards: Arc::clone(forwards),
        })
        .collect()
}

/// Step `step`'s microbatches: 2 x 2 inputs and targets.
fn batch(m: usize, step: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    let s = step as f32;
    let x = |k: usize| {
        Tensor::new(
            vec![2, 2],
            vec![0.1 * k as f32 - 0.2 * s, -0.3, 0.7, 0.2 + s],
        )
        .unwrap()
    };
    let t = |k: usize| Tensor::new(vec![2, 2], vec![0.4, 0.05 * k as f32, -0.2, 0.3 - s]).unwrap();
    ((0..m).map(x).collect(), (0..m).map(t).collect())
}

/// What a run of [`STEPS`] steps left: each step's losses (as bits), every stage's `(w, b)` (as
/// bits) at the end, the largest peak held bytes of each rank, and the forwards run.
#[derive(Debug, PartialEq)]
struct Run {
    losses: Vec<Vec<u32>>,
    weights: Vec<(u32, u32)>,
    peaks: Vec<usize>,
    forwards: usize,
    /// The rebuilds timed apart (threads only), over all steps.
    rebuilds: usize,
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn weights<'a>(cells: impl Iterator<Item = &'a Cell>) -> Vec<(u32, u32)> {
    cells.map(|c| (c.w.to_bits(), c.b.to_bits())).collect()
}

fn peaks_max(peaks: &mut Vec<usize>, step: &[usize]) {
    peaks.resize(step.len().max(peaks.len()), 0);
    for (p, &s) in peaks.iter_mut().zip(step) {
        *p = (*p).max(s);
    }
}

fn modes(schedule: &Schedule, mode: Recompute) -> Vec<Recompute> {
    vec![mode; schedule.stages()]
}

fn threads(schedule: &Schedule, mode: Recompute) -> Run {
    let forwards = Arc::new(AtomicUsize::new(0));
    let stages = counted(schedule.stages(), &forwards);
    let mut ex = Executor::new(schedule.clone(), stages).unwrap();
    ex.set_recompute(&modes(schedule, mode));
    let (mut losses, mut peaks, mut rebuilds) = (Vec::new(), Vec::new(), 0);
    for step in 0..STEPS {
        let (xs, ts) = batch(schedule.microbatches, step);
        let r = ex.step(xs, &ts, &mse).unwrap();
        ex.optimizer_step().unwrap();
        losses.push(bits(&r.losses));
        peaks_max(&mut peaks, &r.peak_held_bytes);
        rebuilds += r.rebuild_seconds.len();
        let by_rank: f64 = r.rebuild_seconds_by_rank(schedule).iter().sum();
        assert!(by_rank >= 0.0 && (mode == Recompute::None) == r.rebuild_seconds.is_empty());
    }
    Run {
        losses,
        weights: weights(ex.stages().iter().map(|s| &s.cell)),
        peaks,
        forwards: forwards.load(Ordering::SeqCst),
        rebuilds,
    }
}

fn streams(schedule: &Schedule, mode: Recompute) -> Run {
    let forwards = Arc::new(AtomicUsize::new(0));
    let device = CpuStreams::new();
    let stages: Vec<OnStreams<Counted>> = counted(schedule.stages(), &forwards)
        .into_iter()
        .map(|c| device.stage(c))
        .collect();
    let loss = device.loss(mse);
    let mut ex = StreamExecutor::new(schedule.clone(), stages, device).unwrap();
    ex.set_recompute(&modes(schedule, mode));
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (xs, ts) = batch(schedule.microbatches, step);
        let inputs = xs.into_iter().map(Pending::ready).collect();
        let targets: Vec<_> = ts.into_iter().map(Pending::ready).collect();
        let r = ex.step(inputs, &targets, &loss).unwrap();
        ex.optimizer_step().unwrap();
        losses.push(bits(&r.losses));
    }
    let cells: Vec<Cell> = ex.stages().iter().map(|s| s.inner().cell.clone()).collect();
    Run {
        losses,
        weights: weights(cells.iter()),
        // `CpuStreams` stashes are pending payloads: their bytes are not counted.
        peaks: Vec::new(),
        forwards: forwards.load(Ordering::SeqCst),
        rebuilds: 0,
    }
}

/// Each step's losses, and every stage `(index, state)` after the last.
type Trained = (Vec<Vec<f32>>, Vec<(usize, Cell)>);

/// Every rank on its own thread with its own `CpuStreams` and `RankStreams`, over `CpuPeers`.
fn rank_streams(schedule: &Schedule, mode: Recompute) -> Run {
    let forwards = Arc::new(AtomicUsize::new(0));
    let peers = CpuPeers::connect(schedule.ranks, Duration::from_secs(20));
    let all = modes(schedule, mode);
    let shape = |_: Edge| vec![2, 2];
    let (losses, mut states): Trained = std::thread::scope(|scope| {
        let handles: Vec<_> = peers
            .into_iter()
            .enumerate()
            .map(|(rank, mut peer)| {
                let (forwards, all, shape) = (&forwards, &all, &shape);
                scope.spawn(move || {
                    let device = CpuStreams::new();
                    let mine: Vec<(usize, OnStreams<Counted>)> =
                        counted(schedule.stages(), forwards)
                            .into_iter()
                            .enumerate()
                            .filter(|(s, _)| schedule.rank_of(*s) == rank)
                            .map(|(s, c)| (s, device.stage(c)))
                            .collect();
                    let loss = device.loss(mse);
                    let mut runner =
                        RankStreams::new(schedule.clone(), rank, mine, device, PostOrder::Sender)
                            .unwrap();
                    runner.set_recompute(all);
                    let mut outcomes = Vec::new();
                    for step in 0..STEPS {
                        let (xs, ts) = batch(schedule.microbatches, step);
                        let inputs = if schedule.rank_of(0) == rank {
                            xs.into_iter().map(Pending::ready).collect()
                        } else {
                            Vec::new()
                        };
                        let targets: Vec<_> = ts.into_iter().map(Pending::ready).collect();
                        let batch = RankBatch {
                            inputs,
                            targets: &targets,
                            loss: &loss,
                            shape,
                        };
                        let outcome = runner.step(batch, &mut peer);
                        runner.optimizer_step().unwrap();
                        outcomes.push(outcome);
                    }
                    let states: Vec<(usize, Cell)> = runner
                        .stages()
                        .iter()
                        .map(|(s, st)| (*s, st.inner().cell.clone()))
                        .collect();
                    (outcomes, states)
                })
            })
            .collect();
        let done: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        // Steps are assembled across ranks: transpose rank x step into step x rank.
        let mut by_step: Vec<Vec<_>> = (0..STEPS).map(|_| Vec::new()).collect();
        let mut states = Vec::new();
        for (outcomes, s) in done {
            for (i, o) in outcomes.into_iter().enumerate() {
                by_step[i].push(o);
            }
            states.push(s);
        }
        let losses = by_step
            .into_iter()
            .map(|o| assemble(schedule, o, 0.0).unwrap().losses)
            .collect();
        (losses, states.into_iter().flatten().collect())
    });
    states.sort_by_key(|(s, _)| *s);
    Run {
        losses: losses.iter().map(|l| bits(l)).collect(),
        weights: weights(states.iter().map(|(_, c)| c)),
        peaks: Vec::new(),
        forwards: forwards.load(Ordering::SeqCst),
        rebuilds: 0,
    }
}

fn schedule(family: &str) -> Schedule {
    let params = Params::new(2, 4);
    let params = if family == "zbv" {
        params.with_chunks(2)
    } else {
        params
    };
    families::generate(family, &params).unwrap()
}

/// `run` with and without recomputation: the same numbers, the forwards run twice with full
/// recomputation, once with selective.
fn same_numbers(name: &str, run: fn(&Schedule, Recompute) -> Run) {
    for family in FAMILIES {
        let s = schedule(family);
        let none = run(&s, Recompute::None);
        let once = STEPS * s.stages() * s.microbatches;
        assert_eq!(none.forwards, once, "{name}, {family}");
        for (mode, forwards) in [(Recompute::Full, 2 * once), (Recompute::Selective, once)] {
            let with = run(&s, mode);
            let what = format!("{name}, {family}, {mode}");
            assert_eq!(with.losses, none.losses, "{what}: losses");
            assert_eq!(
                with.weights, none.weights,
                "{what}: weights after {STEPS} steps"
            );
            assert_eq!(with.forwards, forwards, "{what}: forwards run");
            if name == "threads" {
                assert_eq!(with.rebuilds, once, "{what}: every I or B rebuilt, timed");
            }
        }
        // The runs trained: the weights moved.
        let start = weights(cells(s.stages()).iter());
        assert_ne!(none.weights, start, "{name}, {family}");
    }
}

#[test]
fn threads_recomputing_give_the_same_losses_and_weights() {
    same_numbers("threads", threads);
}

#[test]
fn the_stream_executor_recomputing_gives_the_same_losses_and_weights() {
    same_numbers("StreamExecutor on CpuStreams", streams);
}

#[test]
fn rank_streams_recomputing_give_the_same_losses_and_weights() {
    same_numbers("RankStreams over CpuPeers", rank_streams);
}

/// The cost of a [`Counted`] stage on 2 x 2 tensors as the machine counts it: its stash is the
/// input, the output and the extra copy (48 bytes, kept through `I`), its input 16 bytes, the
/// output (16 bytes) rebuilt selectively.
fn cell_costs(schedule: &Schedule, mode: Recompute) -> CostModel {
    let mut st = StageCost::uniform(1.0, 1.0, 1.0);
    st.activation_bytes = 48.0;
    st.input_bytes = 16.0;
    (st.selective_bytes, st.selective_time) = (16.0, 0.1);
    st.output_bytes = 16.0;
    let st = st.with_recompute(mode);
    CostModel::uniform(st, schedule.stages(), LinkCost::default())
}

#[test]
fn measured_peaks_are_lower_with_recomputation_and_equal_the_simulators_count() {
    for family in FAMILIES {
        let s = schedule(family);
        let none = threads(&s, Recompute::None);
        let full = threads(&s, Recompute::Full);
        let selective = threads(&s, Recompute::Selective);
        let all = [
            (Recompute::None, &none),
            (Recompute::Full, &full),
            (Recompute::Selective, &selective),
        ];
        for (mode, run) in all {
            let costs = cell_costs(&s, mode);
            let t = simulate(&s, &costs).unwrap().timeline;
            let counted: Vec<usize> = peak_activations(&t, &costs)
                .iter()
                .map(|&b| b as usize)
                .collect();
            assert_eq!(run.peaks, counted, "{family} {mode}: measured vs simulated");
        }
        for (r, (f, n)) in full.peaks.iter().zip(&none.peaks).enumerate() {
            assert!(f <= n, "{family}: rank {r} holds more with recomputation");
        }
        // Rank 0 of each schedule keeps two or more microbatches in flight between their `F` and
        // their `I`/`B`: there, keeping 16 bytes instead of 32 per microbatch must show. (A rank
        // whose peak is made of stashes rebuilt and waiting between `I` and `W` holds as much
        // with recomputation: ZB-H1's last rank here.)
        assert!(
            full.peaks[0] < selective.peaks[0] && selective.peaks[0] < none.peaks[0],
            "{family}: full {:?}, selective {:?}, none {:?}",
            full.peaks,
            selective.peaks,
            none.peaks
        );
    }
}
