//! Section 7 of the [simulator's docs](crate::sim#lower-bound): staircase heads and tails, the
//! one-machine jobs of a rank one microbatch at a time (derivation in the parent module's docs).
//!
//! The jobs of sections 3 and 5 give all `M` copies of a stage's forward (or input gradient, or
//! rest) the head and the tail of one microbatch's chain. But the `k`-th copy to start waits for
//! `k + 1` microbatches to have passed every action it needs, and those ran one at a time on their
//! ranks; the `j`-th copy from the last to end is followed by `j + 1` microbatches' actions that
//! need it. Each copy gets its own head and tail from that count (a staircase), which lifts the
//! one-machine relaxation where a pipeline fills or drains through busy neighbours.

use super::chain::Chain;
use super::jackson::Job;
use crate::cost::CostModel;
use crate::schedule::{Op, Placement};

/// A forward, in a group index `3 s + kind`.
const FWD: usize = 0;
/// An input gradient (`I`, or the `I` part of a `B`).
const INPUT: usize = 1;
/// The rest of the backward (`W`, or what a `B` does beyond its `I` part).
const REST: usize = 2;

/// At most this many jobs per group in a rank's relaxation: above it, neighbouring copies are
/// merged into one job with the earliest head and the shortest tail of its copies (a relaxation,
/// so still a bound), which keeps the cost flat in `M`.
pub(super) const MAX_BLOCKS: usize = 64;

/// Up to this many candidate predecessors on one rank, every subset cut by two thresholds is
/// tried; above it, each member alone and all of them.
const FULL_CUTS: usize = 8;

/// The staircases are computed when `9 P S^2` (every rank's groups against every group, once per
/// rank's span) stays under this; above it (thousands of stages) the jobs keep one microbatch's
/// head and tail, as sections 3 and 5, so the bound stays a fraction of a second at any size.
const STAIR_WORK: f64 = 2e8;

/// The groups of one microbatch's actions (per stage: its forward, input gradient and rest) along
/// its dependency chain, with their ranks and times.
pub(super) struct Groups {
    /// Stages.
    stages: usize,
    /// Per group: its rank.
    rank: Vec<usize>,
    /// Per group: its time in the chain of one microbatch.
    chain: Vec<f64>,
    /// Per group: the machine time one copy takes on its rank (a forward less what an overlapped
    /// pair may save).
    work: Vec<f64>,
    /// Per group: its earliest start after the start of `F(0)` along the chain.
    pos: Vec<f64>,
    /// Per rank: its groups.
    by_rank: Vec<Vec<usize>>,
    /// Whether the staircases are affordable at this size ([`STAIR_WORK`]).
    stairs: bool,
}

/// Where a rank's relaxation measures heads and tails from.
#[derive(Clone, Copy)]
pub(super) enum Anchor {
    /// The step: heads from time 0, tails to the last end over all ranks (the makespan).
    Step,
    /// Rank `r`'s own span: heads from its first action (a forward of its lowest stage, which
    /// every one of its actions needs), tails to its own last action.
    Rank(usize),
}

/// Which of a rank's groups become jobs.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Which {
    /// Forwards, input gradients and rests.
    All,
    /// Input gradients and rests (the memory terms give the forwards heads of their own).
    Backward,
}

impl Groups {
    /// The groups of `costs`' stages on `ranks` ranks placed by `placement`, with `chain`'s
    /// times; `overlap` lets each forward's machine time lose what a pair may save (section 3).
    pub fn new(
        ranks: usize,
        placement: Placement,
        costs: &CostModel,
        chain: &Chain,
        overlap: bool,
    ) -> Groups {
        let st = &costs.stages;
        let n = st.len();
        let rank_of = |s: usize| placement.rank_of(s, ranks).min(ranks.saturating_sub(1));
        let mut longest_back = vec![0.0f64; ranks];
        for (s, c) in st.iter().enumerate() {
            let r = rank_of(s);
            longest_back[r] = longest_back[r].max(c.time(Op::B).max(c.time(Op::I)));
        }
        let (mut rank, mut time, mut work, mut pos) = (vec![], vec![], vec![], vec![]);
        let mut by_rank = vec![Vec::new(); ranks];
        for s in 0..n {
            let r = rank_of(s);
            let saving = if overlap {
                (1.0 - costs.overlap_share) * chain.forward[s].min(longest_back[r])
            } else {
                0.0
            };
            let head_i = chain.head_i(s);
            for (t, w, p) in [
                (
                    chain.forward[s],
                    (chain.forward[s] - saving).max(0.0),
                    chain.head_f[s],
                ),
                (chain.input[s], chain.input[s], head_i),
                (chain.rest[s], chain.rest[s], head_i + chain.input[s]),
            ] {
                by_rank[r].push(rank.len());
                rank.push(r);
                time.push(t);
                work.push(w);
                pos.push(p);
            }
        }
        let stairs = 9.0 * ranks as f64 * (n as f64).powi(2) <= STAIR_WORK;
        Groups {
            stairs,
            stages: n,
            rank,
            chain: time,
            work,
            pos,
            by_rank,
        }
    }

    /// Position along the chain of a forward or input gradient (forwards up, then gradients down).
    fn index(&self, g: usize) -> usize {
        let s = g / 3;
        match g % 3 {
            FWD => s,
            _ => 2 * self.stages - 1 - s,
        }
    }

    /// Whether every copy of `b` needs the copy of `a` of its microbatch (through the chain).
    fn precedes(&self, a: usize, b: usize) -> bool {
        match (a % 3, b % 3) {
            (REST, _) => false,
            (_, REST) => self.index(a) <= self.index(b - REST + INPUT),
            _ => self.index(a) < self.index(b),
        }
    }

    /// From the end of `a` to the start of `b` along the chain, when `a` precedes `b`.
    fn delay(&self, a: usize, b: usize) -> f64 {
        (self.pos[b] - self.pos[a] - self.chain[a]).max(0.0)
    }

    /// The earliest start of `a` after the anchor, or `None` when `a` need not follow it.
    fn head(&self, anchor: Anchor, a: usize) -> Option<f64> {
        match anchor {
            Anchor::Step => Some(self.pos[a]),
            Anchor::Rank(r) => {
                let &first = self.by_rank[r].first()?;
                (a == first || self.precedes(first, a)).then(|| self.pos[a] - self.pos[first])
            }
        }
    }

    /// Rank `r`'s stages, lowest first.
    pub fn stages_of(&self, r: usize) -> Vec<usize> {
        self.by_rank.get(r).map_or_else(Vec::new, |g| {
            g.iter()
                .filter(|&&x| x % 3 == FWD)
                .map(|&x| x / 3)
                .collect()
        })
    }

    /// The machine time of one forward of stage `s` (less what an overlapped pair may save).
    pub fn forward_work(&self, s: usize) -> f64 {
        self.work[3 * s + FWD]
    }

    /// The groups on each rank (the most over ranks).
    pub fn per_rank(&self) -> usize {
        self.by_rank.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The earliest start of rank `r`'s first forward after rank `q`'s first action, when every
    /// forward of `r` needs one of `q` (`None` otherwise, or for a rank without stages).
    pub fn first_head(&self, q: usize, r: usize) -> Option<f64> {
        let &first = self.by_rank.get(r)?.first()?;
        self.head(Anchor::Rank(q), first)
    }

    /// Per group, the least time from its end to the anchor's end: to the last end of anything that
    /// needs it (`Step`), or to the end of the last action of rank `r` that is it or needs it
    /// (`Rank(r)`; `None` when there is none).
    fn tails(&self, anchor: Anchor) -> Vec<Option<f64>> {
        let counts = |g: usize| match anchor {
            Anchor::Step => true,
            Anchor::Rank(r) => self.rank[g] == r,
        };
        let end = |g: usize| self.pos[g] + self.chain[g];
        // Per chain position, the latest end of a counted group there (a gradient's rest hangs
        // off its gradient), then the latest at that position or after.
        let n = self.stages;
        let mut at = vec![f64::NEG_INFINITY; 2 * n + 1];
        for g in 0..3 * n {
            if counts(g) {
                let i = if g % 3 == REST {
                    self.index(g - REST + INPUT)
                } else {
                    self.index(g)
                };
                at[i] = at[i].max(end(g));
            }
        }
        for i in (0..2 * n).rev() {
            at[i] = at[i].max(at[i + 1]);
        }
        (0..3 * n)
            .map(|g| {
                let mut last = if counts(g) { end(g) } else { f64::NEG_INFINITY };
                match g % 3 {
                    REST => {}
                    INPUT => {
                        let rest = g - INPUT + REST;
                        if counts(rest) {
                            last = last.max(end(rest));
                        }
                        last = last.max(at[self.index(g) + 1]);
                    }
                    _ => last = last.max(at[self.index(g) + 1]),
                }
                last.is_finite().then(|| (last - end(g)).max(0.0))
            })
            .collect()
    }

    /// Rank `machine`'s one-machine jobs of `m` microbatches, copy by copy (at most
    /// [`MAX_BLOCKS`] jobs per group), measured from `anchor`: only the groups that follow the
    /// anchor's start and precede its end (for `Rank(r)` with another machine: that need `r`'s first
    /// forward and that some action of `r` needs). With `slack`, a job whose machine time is less
    /// than its chain time (a forward in a pair) has the difference added to its tail (its chain
    /// still ends that much later).
    pub fn jobs(
        &self,
        machine: usize,
        m: usize,
        anchor: Anchor,
        which: Which,
        slack: bool,
    ) -> Vec<Job> {
        self.copies(machine, m, anchor, which, slack)
            .into_iter()
            .filter_map(|c| {
                Some(Job {
                    head: c.head?,
                    work: c.work,
                    tail: c.tail?,
                })
            })
            .collect()
    }

    /// The blocks of copies behind [`Self::jobs`], all of them and always in the same order (the
    /// machine's groups, then copies in start order), with `None` where `anchor` gives the
    /// group no head (it need not follow the anchor's start) or no tail (it need not precede the
    /// anchor's end): two anchors' lists line up block by block.
    pub fn copies(
        &self,
        machine: usize,
        m: usize,
        anchor: Anchor,
        which: Which,
        slack: bool,
    ) -> Vec<Copies> {
        let Some(own) = self.by_rank.get(machine) else {
            return Vec::new();
        };
        if m == 0 {
            return Vec::new();
        }
        let tails = self.tails(anchor);
        let block = m.div_ceil(MAX_BLOCKS);
        let mut out = Vec::new();
        for &g in own {
            if which == Which::Backward && g % 3 == FWD {
                continue;
            }
            let (head, tail) = (self.head(anchor, g), tails[g]);
            let heads = match head {
                Some(_) => self.lines(g, anchor, &tails, true),
                None => Vec::new(),
            };
            let ends = match tail {
                Some(_) => self.lines(g, anchor, &tails, false),
                None => Vec::new(),
            };
            let extra = if slack {
                (self.chain[g] - self.work[g]).max(0.0)
            } else {
                0.0
            };
            let mut k = 0;
            while k < m {
                let count = block.min(m - k);
                // The block's earliest head is its first copy's; its shortest tail is its last's
                // (the copy with the fewest copies ending after it).
                let last = k + count - 1;
                out.push(Copies {
                    work: count as f64 * self.work[g],
                    head: head.map(|h| at(&heads, k, h)),
                    tail: tail.map(|t| at(&ends, m - 1 - last, t) + extra),
                });
                k += count;
            }
        }
        out
    }

    /// The staircase lines of group `g`: for the `k`-th copy to start (`start`) or the `k`-th
    /// from the last to end, `alpha + (k + 1) beta` bounds its head (tail), one line per rank and
    /// cut of that rank's groups that `g` needs (that need `g`), dominated lines dropped.
    fn lines(&self, g: usize, anchor: Anchor, tails: &[Option<f64>], start: bool) -> Vec<Line> {
        let mut lines = Vec::new();
        if !self.stairs {
            return lines;
        }
        let mut members = Vec::new();
        for groups in &self.by_rank {
            members.clear();
            for &a in groups {
                let member = if start {
                    match self.head(anchor, a) {
                        Some(h) if self.precedes(a, g) => Some((h, self.delay(a, g))),
                        _ => None,
                    }
                } else {
                    match tails[a] {
                        Some(t) if self.precedes(g, a) => Some((t, self.delay(g, a))),
                        _ => None,
                    }
                };
                if let Some((outer, delay)) = member {
                    members.push(Member {
                        outer,
                        delay,
                        work: self.work[a],
                    });
                }
            }
            cuts(&members, &mut lines);
        }
        pareto(lines)
    }
}

/// A block of copies of one group on its rank, seen from one anchor.
pub(super) struct Copies {
    /// Machine time of the block.
    pub work: f64,
    /// Earliest start after the anchor's start, if the group must follow it.
    pub head: Option<f64>,
    /// Least time from the block's end to the anchor's end, if the group must precede it.
    pub tail: Option<f64>,
}

/// A group on another rank (or the same) that a group needs, or that needs it: its head (tail)
/// from the anchor, its delay to (from) the group, its machine time.
struct Member {
    /// Head from the anchor (for predecessors) or tail to the anchor's end (for successors).
    outer: f64,
    /// Chain time between it and the group.
    delay: f64,
    /// Machine time of one copy.
    work: f64,
}

/// `alpha + (k + 1) beta`.
#[derive(Clone, Copy)]
struct Line {
    /// The least head (tail) and the least delay of the cut.
    alpha: f64,
    /// The cut's machine time per microbatch.
    beta: f64,
}

/// The value at copy `k` of the best line, at least `base`.
fn at(lines: &[Line], k: usize, base: f64) -> f64 {
    let n = (k + 1) as f64;
    lines
        .iter()
        .map(|l| l.alpha + n * l.beta)
        .fold(base, f64::max)
}

/// The lines of the cuts of `members`: the members with head (tail) and delay at or above two
/// thresholds taken from the members themselves (one threshold at a time when there are many).
/// The last of `k + 1` microbatches' copies of a cut ends no earlier than the least head plus
/// their machine time, and the group's copy starts at least the least delay later.
fn cuts(members: &[Member], lines: &mut Vec<Line>) {
    let mut push = |keep: &dyn Fn(&Member) -> bool| {
        let (mut outer, mut delay, mut beta) = (f64::INFINITY, f64::INFINITY, 0.0);
        for m in members.iter().filter(|m| keep(m)) {
            outer = outer.min(m.outer);
            delay = delay.min(m.delay);
            beta += m.work;
        }
        if beta > 0.0 && outer.is_finite() {
            lines.push(Line {
                alpha: outer + delay,
                beta,
            });
        }
    };
    if members.len() <= FULL_CUTS {
        for a in members {
            for b in members {
                push(&|m: &Member| m.outer >= a.outer && m.delay >= b.delay);
            }
        }
    } else {
        push(&|_: &Member| true);
        for m in members.iter().filter(|m| m.work > 0.0) {
            lines.push(Line {
                alpha: m.outer + m.delay,
                beta: m.work,
            });
        }
    }
}

/// The lines not dominated by another (one with both a larger `alpha` and a larger `beta`).
fn pareto(mut lines: Vec<Line>) -> Vec<Line> {
    lines.sort_by(|a, b| b.beta.total_cmp(&a.beta).then(b.alpha.total_cmp(&a.alpha)));
    let mut out: Vec<Line> = Vec::new();
    for l in lines {
        if out.last().is_none_or(|o| l.alpha > o.alpha) {
            out.push(l);
        }
    }
    out
}
