//! One rank's worker: runs the rank's lowered list strictly in order (its compute items and the
//! sends and receives [`lower`](crate::schedule::lower) put around them), exchanging activations
//! and gradients with the other ranks through channels at those sends and receives, holding stashes
//! until their `W` (or `B`), and timing every item. Only a receive waits; a compute action finds
//! its input already there (on its own rank, or received just before).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvError, Sender, TryRecvError};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use super::clock::{panic_message, Clock};
use super::executor::Program;
use super::hook::{Hooked, StepEvent};
use super::{Loss, RuntimeError, Stage, Tensor};
use crate::schedule::deps::{Edge, Flow};
use crate::schedule::{Action, Comm, Item, Op, Schedule};
use crate::timeline::{Span, Transfer};

/// What a tensor in flight is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    /// The input activation of `F(stage, microbatch)`.
    Input,
    /// The output gradient that `I`/`B` of `(stage, microbatch)` starts from.
    GradOutput,
}

/// Which tensor: its kind and the `(stage, microbatch)` that consumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Key {
    kind: Kind,
    stage: usize,
    microbatch: usize,
}

/// What travels between ranks.
pub(super) enum Message {
    /// A tensor produced by `producer` on rank `from`, sent at `sent_at` (seconds since the epoch).
    Data {
        key: Key,
        tensor: Tensor,
        producer: Action,
        from: usize,
        sent_at: f64,
    },
    /// Another rank failed: stop now.
    Abort,
}

/// A tensor waiting in a rank's mailbox, with where it came from if it crossed ranks.
struct Parcel {
    tensor: Tensor,
    arrival: Option<Arrival>,
}

/// How a tensor crossed from another rank.
struct Arrival {
    from: usize,
    producer: Action,
    sent_at: f64,
    received_at: f64,
    bytes: usize,
}

/// A stash and whether `I` has already run on it.
struct Stashed<T> {
    stash: T,
    input_done: bool,
    bytes: usize,
}

/// Why a worker stopped early.
pub(super) enum Stop {
    /// This rank failed.
    Failed(RuntimeError),
    /// Another rank failed and told us to stop.
    Aborted,
}

/// What all workers of one step share (read-only, or atomics).
pub(super) struct StepContext<'a, L> {
    pub schedule: &'a Schedule,
    /// The lowered lists the ranks run.
    pub program: &'a Program,
    pub targets: &'a [Tensor],
    pub loss: &'a L,
    pub epoch: Instant,
    pub failed: &'a AtomicBool,
    pub barrier: &'a Barrier,
    /// When set, every layer call holds this lock: one action at a time over all ranks.
    pub exclusive: Option<&'a Mutex<()>>,
    /// How long a waiting rank polls its channel (yielding its core between polls) before it
    /// blocks; see [`Executor::set_poll`](super::Executor::set_poll).
    pub poll: Duration,
    /// The trainer's step hook, if any: told of every action as it completes.
    pub hook: Option<&'a (dyn Fn(StepEvent) + Sync)>,
}

/// What a worker hands back at the end of a step.
pub(super) struct WorkerOutput {
    pub spans: Vec<Span>,
    pub transfers: Vec<Transfer>,
    pub losses: Vec<(usize, f32)>,
    pub peak_held: usize,
    /// Seconds spent in layer calls, per action, in execution order.
    pub action_seconds: Vec<(Action, f64)>,
    pub result: Result<(), Stop>,
}

/// The channel ends and local stages of one rank.
pub(super) struct Worker<'s, S: Stage> {
    pub rank: usize,
    /// `(global stage index, stage)` for the stages this rank holds.
    pub stages: Vec<(usize, &'s mut S)>,
    /// Microbatch inputs of stage 0 (only on the rank that holds it).
    pub inputs: Vec<Option<Tensor>>,
    pub rx: Receiver<Message>,
    /// Senders to the other ranks (`None` for this rank).
    pub peers: Vec<Option<Sender<Message>>>,
}

/// The mutable state of a running worker.
struct RankRun<'c, 's, S: Stage, L> {
    ctx: &'c StepContext<'c, L>,
    rank: usize,
    stages: Vec<(usize, &'s mut S)>,
    inputs: Vec<Option<Tensor>>,
    rx: Receiver<Message>,
    peers: Vec<Option<Sender<Message>>>,
    mailbox: HashMap<Key, Parcel>,
    /// Outputs for another rank, waiting for their send.
    outbox: HashMap<Key, (Tensor, Action)>,
    stashes: HashMap<(usize, usize), Stashed<S::Stash>>,
    held: usize,
    clock: Clock<'c>,
    hook: Option<Hooked<'c>>,
    out: WorkerOutput,
}

impl<'s, S: Stage> Worker<'s, S> {
    /// Runs this rank's part of one step: zero-grad, the items in order, then (once every rank is
    /// done and none failed) the optimizer step.
    pub(super) fn run<L: Loss>(self, ctx: &StepContext<'_, L>) -> WorkerOutput {
        let rank = self.rank;
        let mut run = RankRun {
            ctx,
            rank: self.rank,
            stages: self.stages,
            inputs: self.inputs,
            rx: self.rx,
            peers: self.peers,
            mailbox: HashMap::new(),
            outbox: HashMap::new(),
            stashes: HashMap::new(),
            held: 0,
            clock: Clock::new(ctx.epoch, ctx.exclusive),
            hook: ctx.hook.map(|h| Hooked::new(h, ctx.schedule, rank)),
            out: WorkerOutput {
                spans: Vec::new(),
                transfers: Vec::new(),
                losses: Vec::new(),
                peak_held: 0,
                action_seconds: Vec::new(),
                result: Ok(()),
            },
        };
        // Layer calls are guarded one by one; this outer guard only keeps a bug in the runtime
        // itself from leaving the other ranks waiting at the barrier.
        let result = catch_unwind(AssertUnwindSafe(|| {
            run.zero_grad().and_then(|()| run.items())
        }))
        .unwrap_or_else(|p| {
            Err(Stop::Failed(RuntimeError::Internal {
                rank,
                message: format!("the runtime panicked: {}", panic_message(&*p)),
            }))
        });
        if let Err(Stop::Failed(_)) = result {
            run.abort_others();
        }
        // Everybody waits here, failed or not, so that no rank steps its optimizer unless all
        // ranks finished their lists.
        ctx.barrier.wait();
        let result = match result {
            Ok(()) if !ctx.failed.load(Ordering::SeqCst) => run.optimizer_step(),
            other => other,
        };
        run.out.result = result;
        run.out
    }
}

impl<S: Stage, L: Loss> RankRun<'_, '_, S, L> {
    fn now(&self) -> f64 {
        self.ctx.epoch.elapsed().as_secs_f64()
    }

    fn zero_grad(&mut self) -> Result<(), Stop> {
        let rank = self.rank;
        for (s, stage) in self.stages.iter_mut() {
            catch_unwind(AssertUnwindSafe(|| stage.zero_grad())).map_err(|p| {
                Stop::Failed(RuntimeError::OptimizerFailed {
                    rank,
                    stage: *s,
                    message: format!("zero_grad panicked: {}", panic_message(&*p)),
                })
            })?;
        }
        Ok(())
    }

    fn optimizer_step(&mut self) -> Result<(), Stop> {
        let rank = self.rank;
        for (s, stage) in self.stages.iter_mut() {
            let message = match catch_unwind(AssertUnwindSafe(|| stage.optimizer_step())) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(p) => format!("panicked: {}", panic_message(&*p)),
            };
            return Err(Stop::Failed(RuntimeError::OptimizerFailed {
                rank,
                stage: *s,
                message,
            }));
        }
        Ok(())
    }

    /// Tells every other rank to stop.
    fn abort_others(&self) {
        self.ctx.failed.store(true, Ordering::SeqCst);
        for tx in self.peers.iter().flatten() {
            // A rank that already left does not need telling.
            let _ = tx.send(Message::Abort);
        }
    }

    fn items(&mut self) -> Result<(), Stop> {
        let program = self.ctx.program;
        for item in &program.lists[self.rank] {
            if self.ctx.failed.load(Ordering::Relaxed) {
                return Err(Stop::Aborted);
            }
            self.clock.first_start = None;
            match *item {
                Item::One(a) => self.action(a)?,
                Item::Overlap { forward, backward } => {
                    // On CPU the two halves of an overlapped pair run one after the other.
                    self.action(forward)?;
                    self.action(backward)?;
                }
                Item::Comm(c) => {
                    self.transfer(c)?;
                    if !program.explicit {
                        continue;
                    }
                    // A transfer takes no time on its rank: it is marked where it completed.
                    let now = self.now();
                    self.clock.first_start = Some(now);
                    self.clock.last_end = now;
                }
                // Parameter operations have no work on one process.
                Item::Param(_) => {
                    let now = self.now();
                    self.clock.first_start = Some(now);
                    self.clock.last_end = now;
                }
            }
            let end = self.clock.last_end;
            let start = self.clock.first_start.unwrap_or(end);
            self.out.spans.push(Span::new(*item, start, end));
        }
        Ok(())
    }

    /// A send hands the output waiting in the outbox to its rank; a receive waits for its data.
    fn transfer(&mut self, c: Comm) -> Result<(), Stop> {
        let Some(e) = Edge::of(c, self.ctx.schedule.stages()) else {
            return Err(self.internal(format!("`{c}` names no boundary")));
        };
        let key = Key::consuming(&e);
        if c.op.is_send() {
            let (tensor, producer) = self.outbox.remove(&key).ok_or_else(|| {
                self.internal(format!(
                    "`{c}` has nothing to send: its producer has not run"
                ))
            })?;
            self.send(key, tensor, producer);
            return Ok(());
        }
        if !self.mailbox.contains_key(&key) {
            let op = match e.flow {
                Flow::Activation => Op::F,
                Flow::Gradient => Op::I,
            };
            let parcel = self.receive_until(key, Action::new(op, e.to(), e.microbatch))?;
            self.mailbox.insert(key, parcel);
        }
        Ok(())
    }

    fn internal(&self, message: String) -> Stop {
        Stop::Failed(RuntimeError::Internal {
            rank: self.rank,
            message,
        })
    }

    fn fail(&self, action: Action, message: impl Into<String>) -> Stop {
        Stop::Failed(RuntimeError::ActionFailed {
            rank: self.rank,
            action,
            message: message.into(),
        })
    }

    fn action(&mut self, a: Action) -> Result<(), Stop> {
        self.clock.action_start = None;
        match a.op {
            Op::F => self.forward(a),
            Op::I => self.backward_input(a),
            Op::W => self.backward_weight(a),
            Op::B => self.backward(a),
        }?;
        if let Some(hook) = &self.hook {
            let end = self.clock.last_end;
            hook.done(self.rank, a, self.clock.action_start.unwrap_or(end), end)?;
        }
        Ok(())
    }

    fn forward(&mut self, a: Action) -> Result<(), Stop> {
        let input = if a.stage == 0 {
            self.inputs
                .get_mut(a.microbatch)
                .and_then(Option::take)
                .ok_or_else(|| self.fail(a, "no input for this microbatch (run twice?)"))?
        } else {
            self.take(Key::new(Kind::Input, a), a)?
        };
        if self.stashes.contains_key(&(a.stage, a.microbatch)) {
            return Err(self.fail(a, "this forward already ran and its stash is still held"));
        }
        let rank = self.rank;
        let stage = local_stage(&mut self.stages, a.stage).ok_or_else(|| not_here(rank, a))?;
        let (output, stash, bytes) =
            self.clock.call(rank, a, &mut self.out.action_seconds, || {
                let (output, stash) = stage.forward(input)?;
                let bytes = stage.held_bytes(&stash);
                Ok((output, stash, bytes))
            })?;
        self.hold(bytes, 0);
        self.stashes.insert(
            (a.stage, a.microbatch),
            Stashed {
                stash,
                input_done: false,
                bytes,
            },
        );
        let last = self.ctx.schedule.stages() - 1;
        if a.stage == last {
            let target = self
                .ctx
                .targets
                .get(a.microbatch)
                .ok_or_else(|| self.fail(a, "no target for this microbatch"))?;
            let loss = self.ctx.loss;
            let (value, mut grad) =
                self.clock.call(rank, a, &mut self.out.action_seconds, || {
                    loss.loss(&output, target)
                })?;
            grad.scale(1.0 / self.ctx.schedule.microbatches as f32);
            self.out.losses.push((a.microbatch, value));
            self.deliver(Key::new(Kind::GradOutput, a), grad, a);
        } else {
            let key = Key {
                kind: Kind::Input,
                stage: a.stage + 1,
                microbatch: a.microbatch,
            };
            self.deliver(key, output, a);
        }
        Ok(())
    }

    fn backward_input(&mut self, a: Action) -> Result<(), Stop> {
        let grad = self.take(Key::new(Kind::GradOutput, a), a)?;
        let rank = self.rank;
        let slot = self
            .stashes
            .get_mut(&(a.stage, a.microbatch))
            .ok_or_else(|| no_stash(rank, a))?;
        if slot.input_done {
            return Err(self.fail(a, "I already ran for this microbatch"));
        }
        let stage = local_stage(&mut self.stages, a.stage).ok_or_else(|| not_here(rank, a))?;
        let (grad_input, bytes) = self.clock.call(rank, a, &mut self.out.action_seconds, || {
            let grad_input = stage.backward_input(&mut slot.stash, grad)?;
            Ok((grad_input, stage.held_bytes(&slot.stash)))
        })?;
        let before = slot.bytes;
        slot.bytes = bytes;
        slot.input_done = true;
        let after = slot.bytes;
        self.hold(after, before);
        self.send_grad_input(a, grad_input);
        Ok(())
    }

    fn backward_weight(&mut self, a: Action) -> Result<(), Stop> {
        let rank = self.rank;
        let slot = self
            .stashes
            .remove(&(a.stage, a.microbatch))
            .ok_or_else(|| no_stash(rank, a))?;
        if !slot.input_done {
            return Err(self.fail(a, "W before I for this microbatch"));
        }
        self.hold(0, slot.bytes);
        let stage = local_stage(&mut self.stages, a.stage).ok_or_else(|| not_here(rank, a))?;
        self.clock.call(rank, a, &mut self.out.action_seconds, || {
            stage.backward_weight(slot.stash)
        })
    }

    fn backward(&mut self, a: Action) -> Result<(), Stop> {
        let grad = self.take(Key::new(Kind::GradOutput, a), a)?;
        let rank = self.rank;
        let slot = self
            .stashes
            .remove(&(a.stage, a.microbatch))
            .ok_or_else(|| no_stash(rank, a))?;
        if slot.input_done {
            return Err(self.fail(a, "B after I for this microbatch"));
        }
        self.hold(0, slot.bytes);
        let stage = local_stage(&mut self.stages, a.stage).ok_or_else(|| not_here(rank, a))?;
        let grad_input = self.clock.call(rank, a, &mut self.out.action_seconds, || {
            stage.backward(slot.stash, grad)
        })?;
        self.send_grad_input(a, grad_input);
        Ok(())
    }

    /// Passes an input gradient to the previous stage; the first stage's is dropped.
    fn send_grad_input(&mut self, a: Action, grad_input: Tensor) {
        if a.stage > 0 {
            let key = Key {
                kind: Kind::GradOutput,
                stage: a.stage - 1,
                microbatch: a.microbatch,
            };
            self.deliver(key, grad_input, a);
        }
    }

    /// Accounts for a stash that now holds `add` bytes instead of `remove`.
    fn hold(&mut self, add: usize, remove: usize) {
        self.held = (self.held + add).saturating_sub(remove);
        self.out.peak_held = self.out.peak_held.max(self.held);
    }

    /// Hands a tensor to its consumer: directly on this rank, else into the outbox until its send.
    fn deliver(&mut self, key: Key, tensor: Tensor, producer: Action) {
        let dest = self.ctx.schedule.rank_of(key.stage);
        if dest == self.rank {
            self.mailbox.insert(
                key,
                Parcel {
                    tensor,
                    arrival: None,
                },
            );
        } else {
            self.outbox.insert(key, (tensor, producer));
        }
    }

    /// Sends a tensor to the rank holding its consumer.
    fn send(&mut self, key: Key, tensor: Tensor, producer: Action) {
        let dest = self.ctx.schedule.rank_of(key.stage);
        if let Some(Some(tx)) = self.peers.get(dest) {
            let sent_at = self.now();
            // If the receiver already left, it failed (and we will be told) or did not need this.
            let _ = tx.send(Message::Data {
                key,
                tensor,
                producer,
                from: self.rank,
                sent_at,
            });
        }
    }

    /// Takes the tensor `key` for `consumer`: produced on this rank, or received by an earlier
    /// receive of the lowered list.
    fn take(&mut self, key: Key, consumer: Action) -> Result<Tensor, Stop> {
        let parcel = self.mailbox.remove(&key).ok_or_else(|| {
            self.fail(
                consumer,
                "its input was neither produced on this rank nor received before it (does the \
                 schedule validate?)",
            )
        })?;
        if let Some(a) = parcel.arrival {
            self.out.transfers.push(Transfer::new(
                a.from,
                self.rank,
                a.producer,
                consumer,
                a.sent_at,
                a.received_at,
                a.bytes as f64,
            ));
        }
        Ok(parcel.tensor)
    }

    /// The next message: polled for up to `ctx.poll`, yielding the core between polls (a
    /// hand-off that arrives meanwhile costs neither side a sleep and a wake-up), then blocking.
    fn next_message(&self) -> Result<Message, RecvError> {
        let start = Instant::now();
        while start.elapsed() < self.ctx.poll {
            match self.rx.try_recv() {
                Ok(m) => return Ok(m),
                Err(TryRecvError::Disconnected) => return Err(RecvError),
                Err(TryRecvError::Empty) => std::thread::yield_now(),
            }
        }
        self.rx.recv()
    }

    fn receive_until(&mut self, want: Key, consumer: Action) -> Result<Parcel, Stop> {
        loop {
            let message = self.next_message().map_err(|_| {
                self.fail(
                    consumer,
                    "waits for data that no rank will send (does the schedule validate?)",
                )
            })?;
            match message {
                Message::Abort => return Err(Stop::Aborted),
                Message::Data {
                    key,
                    tensor,
                    producer,
                    from,
                    sent_at,
                } => {
                    let parcel = Parcel {
                        arrival: Some(Arrival {
                            from,
                            producer,
                            sent_at,
                            received_at: self.now(),
                            bytes: tensor.bytes(),
                        }),
                        tensor,
                    };
                    if key == want {
                        return Ok(parcel);
                    }
                    self.mailbox.insert(key, parcel);
                }
            }
        }
    }
}

impl Key {
    /// The tensor an edge delivers: the input of `F` on the next stage, or the output gradient of
    /// the previous stage's backward.
    fn consuming(e: &Edge) -> Self {
        let kind = match e.flow {
            Flow::Activation => Kind::Input,
            Flow::Gradient => Kind::GradOutput,
        };
        Key {
            kind,
            stage: e.to(),
            microbatch: e.microbatch,
        }
    }

    fn new(kind: Kind, a: Action) -> Self {
        Key {
            kind,
            stage: a.stage,
            microbatch: a.microbatch,
        }
    }
}

/// The local stage with global index `stage` (a rank holds `V` of them: a short linear search).
fn local_stage<'a, S>(stages: &'a mut [(usize, &mut S)], stage: usize) -> Option<&'a mut S> {
    stages
        .iter_mut()
        .find(|(s, _)| *s == stage)
        .map(|(_, st)| &mut **st)
}

fn not_here(rank: usize, a: Action) -> Stop {
    Stop::Failed(RuntimeError::ActionFailed {
        rank,
        action: a,
        message: format!("stage {} is not held by rank {rank}", a.stage),
    })
}

fn no_stash(rank: usize, a: Action) -> Stop {
    Stop::Failed(RuntimeError::ActionFailed {
        rank,
        action: a,
        message: "no stash: the forward of this stage and microbatch has not run".into(),
    })
}
