//! A lower bound on the makespan: no schedule with these costs, ranks, chunks and placement can finish
//! earlier. [`bound_for`] is the maximum of the arguments of sections 1-3 and 7 (and the span
//! bound); [`bound_with_limit`] adds sections 4, 9, 10, 13 and 14, for schedules that must keep
//! each rank under an in-flight limit; [`span_bound`] bounds the longest per-rank span (sections
//! 5-14).
//!
//! ## 1. The chain of one microbatch
//!
//! `F(0) + send + F(1) + ... + F(S-1)`, then the backward chain down to stage 0 (`I` or `B` of each
//! stage, the transfers, and stage 0's whole backward). Where a stage may run `B` or `I` then `W`
//! the cheaper choice is taken, here and below, so the argument holds for any schedule.
//!
//! ## 2. Work after the head (the bound before the one-machine relaxation; kept as a term)
//!
//! For every rank `r` whose first stage is `s0`: no action of `r` can start before `F(s0, ·)` can
//! (the **head**, the forward chain below `s0`); `r` runs `M * sum(F + min(B, I + W))` over its
//! stages one item at a time; and every `F`, `I` and `B` of `r` ends before the last `I/B(s0, ·)`,
//! after which the gradient still has to go down to stage 0 (the **tail**). So
//! `makespan >= max_r max(head + work, head + non_deferrable_work + tail)`.
//!
//! ## 3. One machine with heads and tails (Jackson's preemptive schedule)
//!
//! Every action `j` on rank `r` has a **head** `r_j`, the earliest it can start given the
//! dependency chain alone (other ranks infinitely fast, transfers included), and a **tail** `q_j`,
//! the least time that must pass after it ends before the step can end (the chain that depends on
//! it). For `F(s, k)`, `I/B(s, k)` and the rest of the backward (`W`, or what `B` does beyond `I`):
//!
//! | job | head | work | tail |
//! | --- | --- | --- | --- |
//! | `F(s,k)` | forward chain below `s` | `F` | to `I(s)` through the stages above, then `min(I,B)`, then `max(gradient chain below s, rest)` |
//! | `I(s,k)` | head of `F` + `F` + the way up and back | `min(I, B)` | the gradient chain below `s` |
//! | rest of `s` | head of `I` + `min(I, B)` | `min(B, I + W) - min(I, B)` | 0 |
//!
//! (Splitting a `B` into its `I` part and its rest is a relaxation: both parts fit inside the `B`'s
//! interval and end no later than it.) Any schedule is a non-preemptive schedule of these jobs on
//! rank `r` that respects the heads, and its makespan is at least `max_j (C_j + q_j)`; the
//! preemptive optimum of that problem (`1 | r_j, q_j, pmtn | max(C_j + q_j)`) is Jackson's
//! preemptive schedule (module `jackson`), so its value bounds the makespan from below. The `M`
//! copies of a job share head and tail, so each group is one job of `M` times the work (same
//! preemptive optimum); the relaxation costs `O(V log V)` per rank.
//!
//! When the schedule overlaps F/B pairs, a pair takes `f + b - (1 - overlap_share) * min(f, b)`:
//! each forward's work is reduced by `(1 - overlap_share) * min(F, longest backward on the rank)`
//! (the same saving the term of section 2 subtracts), which keeps every job of a pair inside the
//! pair's interval.
//!
//! ## 4. Memory (bound_with_limit)
//!
//! A rank that may hold at most `L` rank-microbatches (the unit `simulate` reports: a stage's
//! activations for one microbatch count `1 / V`) holds at most `n = floor(L * V)`
//! stage-microbatches, each from the start of its `F` to the end of its `W` (or `B`). Let `σ_i` be the
//! start of the `i`-th forward on the rank (in start order). A forward of stage `s` that starts at
//! `t` (no earlier than its head `h_s`) frees its activations no earlier than `t + R_s`, `R_s` the
//! stage's round trip (its `F`, the way up and back, its whole backward), so no earlier than
//! `g(t) = min_s (max(t, h_s) + R_s)`, which grows with `t`. When the `(n + j)`-th forward starts,
//! `j` stage-microbatches must already be freed; one of them started `σ_j` or later, so the `j`-th
//! freeing ends no earlier than `g(σ_j)`. With `Fmin` the shortest forward, lower bounds on the
//! `σ_i` follow:
//!
//! `σ_1 >= min_s h_s`, `σ_i >= σ_(i-1) + Fmin`, `σ_(n+j) >= g(σ_j)`.
//!
//! Giving the `i`-th forward the head `σ_i`, the shortest forward work and the shortest forward tail
//! (a relaxation: any schedule's `i`-th forward starts no earlier and is no shorter) and solving the
//! one-machine problem again gives the memory term. With one stage per rank and `n = 1` it is the
//! serial chain, `M` times the round trip of the first rank (tested). Forwards inside overlapped
//! pairs still start at least `Fmin` apart (a pair holds one forward and lasts at least as long).
//!
//! *Packing.* When the `(n + j)`-th forward starts, `j` slots were freed, so the first `j` input
//! gradients and the first `j` rests in start order have ended, and so have the `n + j - 1` earlier
//! forwards: all ran one at a time on the rank before it, none before its head. The `k`-th input
//! gradient to start has its head at least `σ_k` plus the shortest `F` and way up and back (one of
//! the first `k + 1` is of a forward that started at `σ_k` or later), the `k`-th rest that plus the
//! shortest `I`; so `σ_(n+j)` is at least the latest of those heads plus the work of every one of
//! those jobs with that head or a later one, the largest over heads (where `count^2` times the
//! ranks stays under `PACKED_WORK`). The preemptive one-machine problem alone let the rests wait
//! for the drain, which the slots forbid: at 1F1B's memory this makes the bound reach the optimum
//! in 6 more V-shape rows (P = 4, M = 8, 2:2:1 with transfers: 44.9 -> 46.1) and CP-SAT's proven
//! optima in all six V-Half makespan rows at P = 4, M = 4.
//!
//! ## 5. The span under a memory limit (span_bound)
//!
//! The span of rank `r` is the time from the start of its first action to the end of its last;
//! the span objective is the largest over ranks. Times here are relative to the start `a` of the
//! rank's first action. Every action of the rank needs a forward of the rank's lowest stage `s0`
//! first (the chain of any higher stage passes through it), so that forward comes first and every
//! forward of stage `s` starts at `a + h_s` or later, `h_s = head_F(s) - head_F(s0)` (the forward
//! chain from `s0` to `s`; on V-shape rank 0 waits for its first microbatch to climb to stage
//! `2P - 1`). After `I(s, k)` ends, the rank still runs its rest (`W`), and, for every lower stage
//! `t` of the rank, the gradient chain down to `t`, `t`'s input gradient and rest (stage 0's whole
//! backward): the **own tail** of `s` is the longest of these.
//!
//! *Per stage, no limit.* Each stage's `M` forwards are one job with head `h_s` and tail the way
//! up and back, its input gradient and its own tail; its `M` input gradients one job with head
//! `h_s + F + up` and the own tail; its rests one job with head `h_s + F + up + I` and tail 0.
//!
//! *The limit.* With at most `n` stage-microbatches held, the `i`-th forward (in start order)
//! starts at `a + x_i` or later, where `x_1 = 0`, `x_i >= x_(i-1) + Fmin`, `x_i >= ` the
//! `ceil(i / M)`-th smallest `h_s` (the first `i` forwards hold at most `M` of each stage, so one
//! of them is of a stage with that head or a later one), and for `i = n + j`
//! `x_i >= g(x_j) = min_s (max(x_j, h_s) + R_s)` (when the `(n + j)`-th forward starts, `j` of the
//! earlier ones were freed; one of those is the `j`-th or later, of some stage `s`, and frees no
//! earlier than a round trip `R_s` after it starts). The `i`-th forward gets head `x_i`, the
//! shortest forward work and the shortest forward tail over the rank's stages; the backward jobs
//! are as above.
//!
//! Every action of the rank lies in `[a, a + span]`, so the span is at least the value of either
//! one-machine problem (Jackson's preemptive schedule solves them exactly, section 3), at least
//! the rank's work `M * sum(F + min(B, I + W))`, and at least the holding term of section 6; the
//! largest over ranks bounds the span objective ([`span_bound`]).
//!
//! ## 6. Holding
//!
//! Every stage-microbatch holds one of at most `n` slots of its rank from its forward's start to
//! the end of its backward, at least its round trip `R_s`; the slots are held within the rank's
//! span (and after `head_F(s0)` for the makespan), so `n * span >= M * sum_s R_s`. Section 4's
//! recurrence takes the same two forward-start bounds as section 5 (with absolute heads).
//!
//! ## 7. Staircases: one microbatch at a time
//!
//! Sections 3 and 5 give all `M` copies of a group (a stage's forwards, its input gradients, or its
//! rests) the head and the tail of one microbatch's chain. Microbatches are interchangeable, so
//! number a group's copies in the order they run on their rank (one machine: start order is end
//! order). The `k`-th copy (from 0) to start needs `k + 1` microbatches to have passed every action
//! it depends on; take any rank `R` and any set `A` of the groups on `R` it depends on: those
//! `(k + 1) |A|` actions ran one at a time on `R`, none before the least head in `A`, and the copy
//! starts at least the least chain delay from `A` to it after the last of them ends:
//!
//! `head(k) >= min_A head + (k + 1) sum_A work + min_A delay`.
//!
//! Symmetrically the `j`-th copy from the last to end is followed, for any set `B` of groups on `R`
//! that depend on it, by `j + 1` microbatches' actions of `B`:
//! `tail(j) >= min_B delay + (j + 1) sum_B work + min_B tail`. The sets tried are those cut by two
//! thresholds (head or tail, and delay) taken from the members. Every copy becomes a job with its
//! own head and tail (above 64 copies, neighbouring copies merge into one job with the earliest
//! head and the shortest tail of the block, a relaxation), and Jackson's schedule solves each rank
//! as in section 3. For the makespan the heads count from time 0 and the tails to the last end;
//! for a rank's span (section 5) from the rank's first forward and to its last action, keeping only
//! the groups that follow the one and precede the other, on the rank itself and (in [`span_bound`],
//! up to P = 16 at V = 2) on every other machine (`R`'s work between rank `r`'s first and last
//! actions also lies in `r`'s span). Above `9 P S^2 = 2e8` (thousands of stages) every copy keeps
//! one microbatch's head and tail, so the bound stays cheap at any size. The
//! makespan bound also takes the span bound without the pairs of section 8: a makespan is at least
//! every rank's span.
//!
//! ## 8. Two spans at once
//!
//! Let rank `q`'s first action start at 0 and rank `r`'s at `d`, every forward of `r` needing one
//! of `q` (so `d >= ` the chain from `q`'s lowest stage to `r`'s). A copy on `r` starts no earlier
//! than its head from `q` (section 7, anchor `q`) and than `d` plus its head from `r`; it ends at
//! least its tail from `q` before `q`'s last action (when some action of `q` needs it) and its tail
//! from `r` before `r`'s last action. With `Z` the span objective, both last actions end by `Z` and
//! `d + Z`: for a given `d` that is a one-machine problem with heads and tails, the tail of a copy
//! being the larger of its `q`-tail and its `r`-tail less `d`. `d` is unknown: for a range `[d1,
//! d2]`, heads from `d1` and tails less `d2` give a problem no harder than any `d` in the range, so
//! the least value over ranges covering `[d_min, inf)` bounds `Z`. The ranges start as 8 equal parts
//! below `d_min + ` the bound known so far (above it the open range), and the range with the least
//! value is halved 40 times; every ordered pair of ranks is tried (while `P^2` times the jobs per
//! rank stays small: up to P = 16 at V = 2), and a pair stops once its least range cannot beat the
//! bound known. This is what the one-machine terms miss where a middle rank's
//! work and the first rank's span constrain each other: at P = 4, M = 4 it lifts the span bound
//! from 24.9 to CP-SAT's proven optimum, 25.7 (test `staircases_and_pairs_reach_a_proven_optimum`).
//!
//! ## 9. Two slots of one microbatch (module `nest`)
//!
//! Where every rank has two stages (`V = 2`), a microbatch at a rank's upper stage still holds its
//! slot of the rank's lower stage, so it needs two slots at once there. Numbering each stage's
//! forwards in start order, the `j`-th forward of a rank's upper stage cannot start while the
//! lower-stage slots of the microbatches of the first `j` of them (unless freed, each no earlier
//! than the chain allows after its own upper forward), the upper slots still held (each at least
//! that stage's round trip) and its own exceed the limit; the `(n + j)`-th lower forward waits for
//! the `j`-th freeing; and the `j`-th forward of stage `s + 1` starts no earlier than the `j`-th of
//! stage `s` plus its forward and the transfer. Every action of a rank gets its own head from these
//! sequences, and Jackson's schedule (section 3) bounds the makespan. It is infinite when a rank
//! can hold only one stage-microbatch (no microbatch could pass both of its stages). The term of
//! the rank that holds stage 0 also bounds that rank's span ([`span_bound`]): its first action is a
//! stage-0 forward, every head counts from one, and every tail ends on that rank (the gradient
//! chain's last step or a rest of its own). At V-Half's
//! limit with transfers it raises the makespan bound by up to 6.7 % (P = 4, M = 16, 2:2:1: 89.8 to
//! 95.8), and the span bound in every V-Half row of the V-shape grid (mean auto / bound 1.28-1.37 to
//! 1.18-1.27);
//! it does not see that a rank's `I` and `W` compete with its forwards for the same machine while
//! slots wait to be freed: section 10 does.
//!
//! ## 10. Microbatch by microbatch (module `flow`)
//!
//! Sorting each op's start times per stage keeps every dependency, every rank's intervals and every
//! rank's slot count, so a bound may take each stage's ops in microbatch order. Then every action
//! gets a lower bound on its start, microbatch by microbatch: after its producers and the previous
//! microbatch's same op; after the rests that must have ended for its forward to find a slot (on a
//! two-stage rank, the least over the ways to free enough, and a rank's lower forward also waits
//! for upper forwards, since `n` microbatches holding only their lower slot could never move);
//! and after everything that must run before it on its own rank, run one at a time on that
//! machine (`max_τ (τ + Σ work of those with head >= τ)`, followed back over every microbatch
//! where that is cheap, else the last 8-32). Jackson's schedule per rank (section 3) with these
//! heads bounds the makespan, and for the rank that holds stage 0 its span. It reaches CP-SAT's proven optima in all 24
//! V-Half rows at P = 2 (M = 2-6), where section 9 stopped up to 20 % below, and lies 2.5-3.1 %
//! below them at P = 4, M = 4 (11-15 % before); it applies where ranks have one or two stages,
//! without overlapped pairs, under a limit that binds.
//!
//! ## 11. Two levels of holding ([`bound_with_limit_until_input`], [`span_bound_until_input`])
//!
//! Sections 4-6 count a slot from a forward's start to the end of its whole backward, and in bytes
//! a slot is the least a stage-microbatch holds over that interval: where `I` releases most of a
//! stage (the zero-bubble authors' model keeps only `W`'s share after `I`), that least is small and
//! the count large. Over the shorter interval from the forward's start to the end of its `I` (or
//! `B`) a stage-microbatch holds at least what its `F` allocates (a whole slot), and from there to
//! the end of its `W` at least what its `W` releases (`w` of a slot); a rank holds at most `cap`
//! slots. When the `i`-th forward starts (`i` earlier ones), `a` of those are before the end of
//! their `I` and `b` after it but before the end of their `W`, with `a + w b <= cap - 1`: so for
//! some `a <= cap - 1`, `i - a` have passed their `I` and all but `floor((cap - 1 - a) / w)` of
//! those their `W`. The `k`-th end of an `I` (of a `W`) comes no earlier than a round trip to the
//! end of `I` (to the end of `W`) after the `k`-th forward's start, as in section 4, so the
//! forward's start is at least the least over `a` of the later of the two, and (where `count^2`
//! times the slots stays under `PACKED_WORK`) of the end of the jobs that must have run before
//! it on the rank: the `i` earlier forwards, the first `i - a` input gradients and the first
//! `i - a - b` rests, each from its head (the `k`-th input gradient in start order starts no
//! earlier than the `k`-th forward's start plus `F` and the way up and back, since one of the first
//! `k + 1` gradients is of a forward that started then or later; the `k`-th rest no earlier than
//! that plus `I`), one at a time: the latest head plus the work of every one with that head or a
//! later one. That recurrence gives the heads of section 4 and 5's one-machine problems; section 6
//! holds `cap` slots against a whole slot for each round trip to `I` and `w` of one for each `W`.
//! The `W`s still run as work; the terms that do not involve memory are the other functions', so
//! the caller takes the larger. `auto` takes both levels per rank from its budget and its stages'
//! footprints. On the zero-bubble paper's inputs at 1F1B's memory the bound reaches ZB-1p's
//! (and ZB-H1's) bubble rate in all 12 rows (`bench auto --part paper`), so ZB-H1 is optimal there
//! under the authors' memory model; before the packing it stopped at 66-79 % of that rate, and
//! with the slots counted at `W`'s share only at 0-42 %. `auto::exact`'s test
//! `two_level_bounds_never_above_proven_optima` checks it against 96 proven optima under byte
//! limits.
//!
//! ## 12. The first rank's span through every rank's memory
//!
//! Every action needs a forward of stage 0, and those run on one rank (`first`), so `first`'s
//! first action starts the step: for `first`'s span, heads may count from the step's start, as
//! for the makespan. Section 4's memory term of any other rank `r` (its forwards released by the
//! slot recurrence, its input gradients from their heads) then bounds `first`'s span once each
//! job's tail runs only to the end of `first`'s last action that needs it: a forward's own way up
//! and back, its input gradient and the gradient chain down to stage 0's whole backward (which runs
//! on `first`), an input gradient's chain down the same way; `r`'s rests drop out (nothing of
//! `first` waits for them), and so does section 6's holding (slots freed on `r` end nothing on
//! `first`). The span bound takes it for every rank but `first` (whose own memory term is already a
//! span term); the makespan bound has the same terms with the longer tails. At V-Half's limit the
//! span bound was up to 4.5 % below the makespan's where the rank that holds the last stages is what
//! sets the step (P = M = 8, 1:1:1, transfers 0.1 of F: 38.2 against 39.7, CP-SAT's proven span
//! optimum): with this term it reaches CP-SAT's proven span optima in all five proven V-Half rows at
//! P = M = 8, and at P = 4, M = 4 and 8 the V-Half rows more than 2 % below the optimum fall from
//! 11 of 12 to 5.
//!
//! ## 13. The tip rank's own problem (module `own`)
//!
//! The rank at the tip of the V holds stages `P - 1` and `P`; per microbatch it runs `F(P-1)`,
//! `F(P)`, then waits the whole way up and back above it, then `I(P)`, `I(P-1)` and the two rests,
//! and through that wait the microbatch holds two of its slots. Relax every other rank to the
//! chain's delays (the `k`-th `F(P-1)` no earlier than `head_F(P-1)` plus `k` times the longest
//! forward below it) and what is left is small: one machine, six op kinds, each in microbatch order
//! (section 10's sorting argument) and as early as the machine and its inputs allow, at most `cap`
//! slots. A search over the sequences of op kinds, layer by layer, keeps per count of each kind
//! only the states no other state beats in every time that matters (ready times the machine has
//! already passed count as the machine's free time, so they no longer tell states apart; equal
//! rests are one kind), and gives the least of `max(machine end, last I(P-1) end + down(P-1))` (a
//! makespan bound) and of the second alone (the span of the rank that holds stage 0). It runs where
//! at most 16 stage-microbatches fit (V-Half's limit up to P = 16, 1F1B's up to P = 8), within a
//! budget of 2 M states tried: a layer with more than its share merges runs of states into their
//! least times, which keeps the value a lower bound (on the V-shape grid 18 of its 168 searches
//! merge, at 16 slots and M = 32 or 64, and every value equals the unbudgeted search's; each takes
//! at most 130 ms, and 140 ms at P = 16, M = 128). The other two-stage ranks' own
//! problems are as valid but ask 4-100 times the search and, on V-Half at P = 8, M = 16 and 32,
//! all came out below the tip's. At P = 4, M = 8 under V-Half's limit it equals CP-SAT's optimum
//! for that rank alone in all five rows where the bound was more than 2 % short, raising both
//! bounds by 2.0-5.2 %, and at P = 8, M = 16 (118.5 for 2:2:1 with transfers, 115.5 before) too
//! (test `the_tip_rank_s_own_problem_reaches_cp_sat_s_one_rank_optima`); over the V-shape grid it
//! raises 16 bounds and proves `auto` optimal in 4 more rows.
//!
//! ## 14. The tip rank with a second rank (module `own`)
//!
//! Where microbatches are few (`M = P` on V-shape) or slots tight, the step is set by several ranks
//! together: every rank's forward/backward alternation loses the transfers at both ends, and the
//! bound's other terms, which relax the step to one rank's machine (or to chains), stop short of
//! it. The tip rank and rank `q` (stages `q` and `2P - 1 - q`) share one microbatch chain of eight
//! op kinds (`q`'s forward, the tip's two, `q`'s upper forward, then the input gradients back down);
//! the search of section 13 runs over both machines at once, every other rank relaxed to the
//! chain's delays. Its least `max(either machine's end, last I(q) end + down(q))` bounds the
//! makespan, its least `last I(q) end + down(q)` the span of the rank that holds stage 0.
//!
//! *No limit binds* (on the tip or rank 1): `q = 1`, and the rests run as filler in the gaps (each
//! machine owes the rest work its input gradients made due; a relaxation), so the states count
//! only the chain's kinds; with at most `min(P, 10)` microbatches (the counts grow as
//! `C(M + 8, 8)`), within 4 M tries (P = M = 8: 0.11 s, exact). Of all pairs it is the tip with
//! rank 1 or 2 that binds: at P = M = 8, 2:2:1 with transfers of 0.1 F, CP-SAT's optimum with only
//! two ranks kept to one action at a time is 53.3 for `{1, 7}` and `{2, 7}`, 52.9 for `{3, 7}` and
//! at most 52.7 for every other pair, and the search equals it (test
//! `the_pair_problem_reaches_cp_sat_s_two_rank_optima`): the bound of both objectives rises from
//! 52.9 to 53.3 against the proven optimum 54.1. At P = 16, M = 16 the pairs' optima (at most
//! 108.1 by CP-SAT) stay below what a 2 % gap would need.
//!
//! *A limit binds* (on the tip or its neighbour): `q = P - 2`, the tip's neighbour, rests as op
//! kinds and each rank's slots counted, where each rank holds at most 4 stage-microbatches
//! (V-Half's limit up to P = 4; at P = 8 with 8 slots the pair came out no higher than the tip
//! alone, at many times the cost). At P = 4, M = 8 under V-Half's limit it reaches CP-SAT's proven
//! optimum of the whole problem in four of the five rows where the tip alone stopped short (60.9,
//! 56.5, 33.1, 34.9; 31.7 of 32.1 in the fifth; test
//! `the_tip_with_its_neighbour_reaches_the_v_half_optima_at_four_ranks`), in 3-6 ms. The pair's
//! search gives up (no term) past 10^8 comparisons between states.
//!
//! `host/tests/sim_span_bound.rs` checks both memory-aware bounds against the proven optimum (all
//! per-rank orders enumerated) on small instances, V-shape with transfers and uneven `F:I:W`
//! included; the exact method's proofs (`auto::exact`) check the makespan bounds on 80 more of up
//! to 36 actions and 34 V-shape ones of 48 to 96 actions (P = 2-4, M = 3-4), and
//! `host/tests/sim_bound.rs` checks on random instances that no family's makespan or longest span
//! falls below them.
//!
//! For GPipe/1F1B-type costs the bound is reached by the zero-bubble schedules (e.g. ZB-H1 with
//! `F = I = W` and zero communication), so `makespan / lower_bound` measures how far a schedule is from
//! the best any schedule could do. `host/tests/sim_bound.rs` checks on random instances that the bound
//! never exceeds the simulated makespan of any family and never falls below the bound of section 2.

mod chain;
mod flow;
mod jackson;
mod nest;
mod own;
mod pair;
mod span;
mod stair;

use thiserror::Error;

use crate::cost::CostModel;
use crate::schedule::{Item, Op, Placement, Schedule};
use chain::Chain;
use jackson::Job;
pub use span::{span_bound, span_bound_until_input};
use stair::{Anchor, Groups, Which};

/// Why [`bound_with_limit`] refused its limits.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum BoundError {
    /// One limit per rank is needed.
    #[error("{got} in-flight limits given for {ranks} ranks. Fix: give one limit per rank")]
    Limits {
        /// Ranks of the schedule.
        ranks: usize,
        /// Limits given.
        got: usize,
    },
    /// A limit is negative or not a number.
    #[error(
        "in-flight limit of rank {rank} is {value}. Fix: give a finite number >= 0 of \
         rank-microbatches (a V-shape chunk counts 1/2)"
    )]
    Limit {
        /// The rank.
        rank: usize,
        /// The value given.
        value: f64,
    },
}

/// The lower bound for `schedule`'s `P`, `V`, `M` and placement under `costs` (overlap savings are
/// counted when the schedule contains overlapped pairs). How it is derived:
/// [the simulator's docs](crate::sim#lower-bound).
///
/// `costs` must have `schedule.stages()` stages (as [`super::simulate`] checks); with fewer the bound
/// uses what is there.
pub fn lower_bound(schedule: &Schedule, costs: &CostModel) -> f64 {
    bound_for(
        schedule.ranks,
        schedule.microbatches,
        schedule.placement,
        costs,
        has_pairs(schedule),
    )
}

/// The bound for `ranks` ranks, `microbatches` microbatches and the stages of `costs` placed by
/// `placement`; `overlap` allows overlapped F/B pairs. The maximum of sections 1 to 3 of the
/// [simulator's docs](crate::sim#lower-bound).
pub fn bound_for(
    ranks: usize,
    microbatches: usize,
    placement: Placement,
    costs: &CostModel,
    overlap: bool,
) -> f64 {
    let classic = basic_bound(ranks, microbatches, placement, costs, overlap);
    if costs.stages.is_empty() || ranks == 0 || microbatches == 0 {
        return classic;
    }
    let chain = Chain::new(ranks, placement, costs);
    let groups = Groups::new(ranks, placement, costs, &chain, overlap);
    // The makespan is at least every rank's span (section 5).
    let span = span::span_bound_with(
        ranks,
        microbatches,
        placement,
        costs,
        overlap,
        None,
        span::Terms::NONE,
    )
    .unwrap_or(0.0);
    (0..ranks)
        .map(|r| {
            let jobs = groups.jobs(r, microbatches, Anchor::Step, Which::All, false);
            jackson::preemptive(&jobs)
        })
        .fold(classic.max(span), f64::max)
}

/// [`bound_for`] for a schedule that keeps rank `r` at or under `max_in_flight[r]` rank-microbatches
/// (the unit `simulate` reports: a stage's activations for one microbatch count `1 / V`), adding
/// sections 4 and 9 of the [simulator's docs](crate::sim#lower-bound). Infinite when a limit is
/// below one stage's microbatch (no forward could ever start), or, with two stages per rank, below
/// two (no microbatch could pass both).
///
/// ```
/// use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// use pipefill_host::schedule::Placement;
/// use pipefill_host::sim::{bound_for, bound_with_limit};
/// let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
/// let free = bound_for(4, 8, Placement::Looped, &c, false);
/// // One microbatch in flight per rank: rank 0 runs 8 times the chain of one microbatch
/// // (4 F, then I on stages 3 to 1, then stage 0's I and W: 9).
/// let one = bound_with_limit(4, 8, Placement::Looped, &c, false, &[1.0; 4]).unwrap();
/// assert_eq!((free, one), (27.0, 72.0));
/// ```
///
/// Errors: not one limit per rank ([`BoundError::Limits`]), a negative or NaN limit
/// ([`BoundError::Limit`]).
pub fn bound_with_limit(
    ranks: usize,
    microbatches: usize,
    placement: Placement,
    costs: &CostModel,
    overlap: bool,
    max_in_flight: &[f64],
) -> Result<f64, BoundError> {
    limited(
        ranks,
        microbatches,
        placement,
        costs,
        overlap,
        max_in_flight,
        None,
    )
}

/// [`bound_with_limit`] with two levels of holding (module docs, section 11): a stage-microbatch
/// holds a whole slot from its forward's start to the end of its `I` (or `B`), then
/// `after_input[r]` of one (0 to 1) to the end of its `W`; rank `r` holds at most
/// `max_in_flight[r]` slots (rank-microbatches, not rounded) at once. Sections 9 and 10 are left
/// out, and the terms that do not involve memory (they are [`bound_with_limit`]'s), so take the
/// larger of the two.
///
/// ```
/// use pipefill_host::cost::{CostModel, LinkCost, StageCost};
/// use pipefill_host::schedule::Placement;
/// use pipefill_host::sim::{bound_with_limit, bound_with_limit_until_input};
/// let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
/// // One whole slot up to I and nothing after: rank 0 waits for 4 F and 4 I per microbatch.
/// let up_to_i = bound_with_limit_until_input(4, 8, Placement::Looped, &c, false, &[1.0; 4], &[0.0; 4]);
/// assert!(up_to_i.unwrap() >= 8.0 * 8.0);
/// // Held whole to the end of W as well, it is the plain bound's memory term (the plain bound
/// // has more terms besides).
/// let whole = bound_with_limit_until_input(4, 8, Placement::Looped, &c, false, &[1.0; 4], &[1.0; 4]);
/// assert!(whole.unwrap() <= bound_with_limit(4, 8, Placement::Looped, &c, false, &[1.0; 4]).unwrap());
/// ```
///
/// Errors: as [`bound_with_limit`], for either list.
pub fn bound_with_limit_until_input(
    ranks: usize,
    microbatches: usize,
    placement: Placement,
    costs: &CostModel,
    overlap: bool,
    max_in_flight: &[f64],
    after_input: &[f64],
) -> Result<f64, BoundError> {
    check_limits(ranks, after_input)?;
    limited(
        ranks,
        microbatches,
        placement,
        costs,
        overlap,
        max_in_flight,
        Some(after_input),
    )
}

/// [`bound_with_limit`], slots held whole to the end of `W`, or (`after_input`) whole to the end
/// of `I` and that share of one to the end of `W`.
fn limited(
    ranks: usize,
    microbatches: usize,
    placement: Placement,
    costs: &CostModel,
    overlap: bool,
    max_in_flight: &[f64],
    after_input: Option<&[f64]>,
) -> Result<f64, BoundError> {
    let until_input = after_input.is_some();
    check_limits(ranks, max_in_flight)?;
    let free = bound_for(ranks, microbatches, placement, costs, overlap);
    if costs.stages.is_empty() || ranks == 0 || microbatches == 0 {
        return Ok(free);
    }
    let mut chain = Chain::new(ranks, placement, costs);
    if until_input {
        chain.release_at_input();
    }
    let groups = Groups::new(ranks, placement, costs, &chain, overlap);
    let chunks = costs.stages.len() as f64 / ranks as f64;
    // Section 13 (each two-stage rank's own problem, exactly, where it is small: on V-shape the
    // tip rank's, one search of about a tenth of a second at P = 16, M = 128 under V-Half's limit,
    // as long as the other sections together) runs on a thread of its own beside them.
    let (own, rest) = std::thread::scope(|scope| {
        let own = (!overlap && !until_input).then(|| {
            let problem = (&chain, &groups, microbatches, chunks);
            own_beside(scope, problem, max_in_flight, None, |o| o.makespan)
        });
        let rest = other_sections(
            (ranks, microbatches, placement, costs, overlap),
            (&chain, &groups, chunks),
            (max_in_flight, after_input),
        );
        (own.map(joined), rest)
    });
    Ok(rest?.max(free).max(own.unwrap_or(0.0)))
}

/// Section 13's largest term, read by `value` (the makespan, or the first rank's span), over the
/// ranks of `limits` but `skip`, on a thread of `scope` beside the bound's other sections.
fn own_beside<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    (chain, groups, m, chunks): (&'env Chain, &'env Groups, usize, f64),
    limits: &'env [f64],
    skip: Option<usize>,
    value: fn(&own::Own) -> f64,
) -> std::thread::ScopedJoinHandle<'scope, f64> {
    scope.spawn(move || {
        let ranks = (0..limits.len()).filter(|&r| Some(r) != skip);
        let terms = ranks.filter_map(|r| {
            let slots = Slots::new(limits[r], chunks, None);
            own_term(chain, groups, r, m, slots)
        });
        terms.map(|o| value(&o)).fold(0.0, f64::max)
    })
}

/// The value of a scoped thread, its panic passed on.
fn joined<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// [`limited`]'s sections but 13 (the caller's `free` bound aside): 5, 4 and 6, and without
/// `after_input` 9, 14 and 10.
#[allow(clippy::type_complexity)]
fn other_sections(
    (ranks, microbatches, placement, costs, overlap): (usize, usize, Placement, &CostModel, bool),
    (chain, groups, chunks): (&Chain, &Groups, f64),
    (max_in_flight, after_input): (&[f64], Option<&[f64]>),
) -> Result<f64, BoundError> {
    let until_input = after_input.is_some();
    // The makespan is at least every rank's span under the same limits (section 5); section 10
    // runs below for every rank.
    let span = span::span_bound_with(
        ranks,
        microbatches,
        placement,
        costs,
        overlap,
        Some(max_in_flight),
        span::Terms {
            others: !until_input,
            flow: false,
            after_input,
        },
    )?;
    let mut bound = span;
    for (r, &limit) in max_in_flight.iter().enumerate() {
        let rank = RankJobs::new(r, chain, groups);
        let slots = Slots::new(limit, chunks, after_input.map(|w| w[r]));
        bound = bound.max(rank.memory_term(groups, r, microbatches, slots));
    }
    if until_input {
        return Ok(bound);
    }
    // Section 9, where every rank has two stages: a microbatch's two slots on one rank.
    if let Some(nest) = nest::Nest::new(chain, groups, max_in_flight, chunks, microbatches) {
        for r in 0..ranks {
            bound = bound.max(nest.term(r, |s| groups.forward_work(s)));
        }
    }
    // Section 14: the tip rank with a second rank, exactly, where small.
    if !overlap {
        if let Some(o) = pair_term(chain, groups, microbatches, max_in_flight, chunks) {
            bound = bound.max(o.makespan);
        }
    }
    // Section 10: microbatch by microbatch, with each rank's machine and slots.
    if let Some(f) = flow::flow(chain, groups, max_in_flight, chunks, microbatches, overlap) {
        bound = bound.max(f.makespan);
    }
    Ok(bound)
}

/// Section 13 for rank `r` when it is the tip of a V (two adjacent stages, the lower one not stage
/// 0) and at most [`own::MAX_CAP`] stage-microbatches fit (else `None`: with more the counts per
/// layer grow past what the search affords).
fn own_term(chain: &Chain, groups: &Groups, r: usize, m: usize, slots: Slots) -> Option<own::Own> {
    let mine = groups.stages_of(r);
    let &[s, u] = mine.as_slice() else {
        return None;
    };
    if u != s + 1 || slots.binds_none(2 * m) || slots.cap > own::MAX_CAP as f64 {
        return None;
    }
    own::own_problem(chain, s, u, m, slots.cap as usize)
}

/// Most microbatches for which section 14 runs (and at most `P`): its states grow with the
/// counts of eight op kinds, `C(M + 8, 8)` (43 758 at M = 10), and with more microbatches than
/// ranks the alternation's losses hide behind other work and the one-rank terms bind (at P = 4,
/// M = 8 the pair stops 9 % below the bound's other terms, merged past its budget).
const PAIR_MICROBATCHES: usize = 10;

/// Section 14's budget of tries (P = M = 8: 0.11 s and exact; at most about 0.3 s merged).
const PAIR_TRIES: usize = 4_000_000;

/// Most slots a rank may hold for section 14 under a limit that binds (V-Half's limit up to P = 4):
/// with more the pair's states grow past what the search affords, and at P = 8 (8 slots) the pair
/// came out no higher than the tip alone.
const PAIR_SLOTS: usize = 4;

/// Section 14 on V-shape. Where no limit binds on the tip or rank 1: the tip with rank 1, rests as
/// filler, for at most `min(P, `[`PAIR_MICROBATCHES`]`)` microbatches. Where a limit binds on the
/// tip or its neighbour (rank `P - 2`) and each holds at most [`PAIR_SLOTS`]: the tip with its
/// neighbour, rests as op kinds, slots counted. `None` elsewhere (another placement, fewer than 3
/// ranks, too large).
fn pair_term(
    chain: &Chain,
    groups: &Groups,
    m: usize,
    limits: &[f64],
    chunks: f64,
) -> Option<own::Own> {
    let ranks = limits.len();
    if ranks < 3 || chain.forward.len() != 2 * ranks {
        return None;
    }
    let slots = |r: usize| Slots::new(limits[r], chunks, None);
    let tip = ranks - 1;
    let v_shaped = |q: usize| {
        groups.stages_of(tip) == [tip, ranks] && groups.stages_of(q) == [q, tip + ranks - q]
    };
    let free = |r: usize| slots(r).binds_none(2 * m);
    if free(tip) && free(1) {
        if m > ranks.min(PAIR_MICROBATCHES) || !v_shaped(1) {
            return None;
        }
        return own::pair_problem(chain, ranks, 1, m, [2 * m; 2], PAIR_TRIES);
    }
    let q = ranks - 2;
    let caps = [slots(q).whole().min(2 * m), slots(tip).whole().min(2 * m)];
    if !v_shaped(q) || caps.iter().any(|&c| !(2..=PAIR_SLOTS).contains(&c)) {
        return None;
    }
    own::pair_problem(chain, ranks, q, m, caps, PAIR_TRIES)
}

/// One limit per rank, each a number `>= 0`.
fn check_limits(ranks: usize, max_in_flight: &[f64]) -> Result<(), BoundError> {
    if max_in_flight.len() != ranks {
        return Err(BoundError::Limits {
            ranks,
            got: max_in_flight.len(),
        });
    }
    match max_in_flight
        .iter()
        .enumerate()
        .find(|(_, v)| v.is_nan() || **v < 0.0)
    {
        Some((rank, &value)) => Err(BoundError::Limit { rank, value }),
        None => Ok(()),
    }
}

/// [`bound_with_limit`] for `schedule`'s `P`, `M`, placement and pairs.
pub fn lower_bound_with_limit(
    schedule: &Schedule,
    costs: &CostModel,
    max_in_flight: &[f64],
) -> Result<f64, BoundError> {
    bound_with_limit(
        schedule.ranks,
        schedule.microbatches,
        schedule.placement,
        costs,
        has_pairs(schedule),
        max_in_flight,
    )
}

/// Whether `schedule` has an overlapped F/B pair (the bounds then count what pairs save).
pub(crate) fn has_pairs(schedule: &Schedule) -> bool {
    schedule
        .actions
        .iter()
        .flatten()
        .any(|i| matches!(i, Item::Overlap { .. }))
}

/// One rank's part of the one-machine relaxation.
struct RankJobs<'a> {
    chain: &'a Chain,
    /// The groups (and each forward's machine time, less what a pair may save).
    groups: &'a Groups,
    /// The rank's stages.
    mine: Vec<usize>,
}

impl<'a> RankJobs<'a> {
    /// Rank `r`'s part, from `groups` and `chain` of the same stages.
    fn new(r: usize, chain: &'a Chain, groups: &'a Groups) -> Self {
        RankJobs {
            chain,
            groups,
            mine: groups.stages_of(r),
        }
    }

    /// A forward's work in the relaxation (less what a pair may save).
    fn forward_work(&self, s: usize) -> f64 {
        self.groups.forward_work(s)
    }

    /// Section 4: forwards released no earlier than the memory recurrence allows, when at most
    /// `slots` fit (`m` microbatches); with the holding argument (section 6).
    fn memory_term(&self, groups: &Groups, r: usize, m: usize, slots: Slots) -> f64 {
        let c = self.chain;
        let tail = self.min_over(|s| c.tail_f(s));
        match (
            self.mine.first(),
            self.released(groups, (r, Anchor::Step), m, slots, tail),
        ) {
            (Some(&first), Some(value)) => value.max(c.head_f[first] + self.holding(m, slots)),
            _ => 0.0,
        }
    }

    /// Section 12: [`Self::memory_term`] as a bound on the span of rank `first`, the rank that
    /// holds stage 0 (`r` is another rank). Every action needs a forward of stage 0, so `first`'s
    /// first action starts the step, and heads from the step's start hold; only tails change: each
    /// job's is the chain to the end of `first`'s last action that needs it, so `r`'s rests (which
    /// nothing of `first` waits for) drop out, and so does the holding argument (slots freed on `r`
    /// end nothing on `first`).
    fn memory_term_for_first(
        &self,
        groups: &Groups,
        (r, first): (usize, usize),
        m: usize,
        slots: Slots,
    ) -> f64 {
        let c = self.chain;
        // A forward's own backward, then the gradient chain down to stage 0's end on `first`.
        let tail = self.min_over(|s| c.up[s] + c.input[s] + c.down[s]);
        self.released(groups, (r, Anchor::Rank(first)), m, slots, tail)
            .unwrap_or(0.0)
    }

    /// Section 4's one-machine problem on rank `r`: its forwards released by the slot recurrence
    /// (heads from the step's start), each with `tail`, and its backward groups with heads and
    /// tails under `anchor`; `None` where the slots bind nothing (or the rank has no stage),
    /// infinite where not one stage-microbatch fits.
    fn released(
        &self,
        groups: &Groups,
        (r, anchor): (usize, Anchor),
        m: usize,
        slots: Slots,
        tail: f64,
    ) -> Option<f64> {
        let c = self.chain;
        let count = self.mine.len() * m;
        if self.mine.is_empty() || slots.binds_none(count) {
            return None;
        }
        if slots.cap < 1.0 {
            return Some(f64::INFINITY);
        }
        let heads: Vec<f64> = self.mine.iter().map(|&s| c.head_f[s]).collect();
        let sigma = self.forward_starts(m, slots, &heads);
        let work = self.min_over(|s| self.forward_work(s));
        let mut jobs = groups.jobs(r, m, anchor, Which::Backward, false);
        jobs.extend(sigma.iter().map(|&head| Job { head, work, tail }));
        Some(jackson::preemptive(&jobs))
    }

    /// The least of `f` over the rank's stages.
    fn min_over(&self, f: impl Fn(usize) -> f64) -> f64 {
        self.mine
            .iter()
            .map(|&s| f(s))
            .fold(f64::INFINITY, f64::min)
    }

    /// Lower bounds on the start of the rank's `i`-th forward (in start order), `i < M x stages`,
    /// when at most `slots` are held and the forwards of stage `mine[j]` start at `heads[j]` or
    /// later (sections 4, 5 and 11): at least the previous one's plus the shortest forward; at
    /// least the `ceil((i + 1) / M)`-th smallest head (the first `i + 1` forwards hold at most `M`
    /// of each stage); for `i >= n`, at least the earliest the `(i - n)`-th forward or a later one
    /// can free its slot, and (where cheap) at least the end of the jobs that must have run before
    /// it on the rank, packed from their heads (the earlier forwards and the input gradients and
    /// rests of the slots freed). With a second level (section 11: a slot is held whole to the end
    /// of `I`, then `w` of it to the end of `W`), the `i`-th forward needs, for some `a` of the
    /// earlier ones still before the end of their `I`, `i - a` of them past their `I` and all but
    /// `floor((cap - 1 - a) / w)` of those past their `W`.
    fn forward_starts(&self, m: usize, slots: Slots, heads: &[f64]) -> Vec<f64> {
        let c = self.chain;
        let count = self.mine.len() * m;
        let mut sorted = heads.to_vec();
        sorted.sort_by(f64::total_cmp);
        let spacing = self.min_over(|s| c.forward[s]);
        // The earliest a forward started at `t` or later can free its slot (`rest` more: its
        // second level).
        let freed = |t: f64, more: bool| {
            self.mine
                .iter()
                .zip(heads)
                .map(|(&s, &h)| t.max(h) + c.round_trip(s) + if more { c.rest[s] } else { 0.0 })
                .fold(f64::INFINITY, f64::min)
        };
        let n = slots.whole();
        // Where it is cheap: the jobs that must have ended before a forward starts, run one at a
        // time from their heads (see below).
        let ranks = c.forward.len() / self.mine.len().max(1);
        let levels = if slots.after.is_some() { n } else { 1 };
        let packed = (count * count * levels * ranks) as f64 <= PACKED_WORK;
        let (fw, iw, ww) = (
            self.min_over(|s| self.forward_work(s)),
            self.min_over(|s| c.input[s]),
            self.min_over(|s| c.rest[s]),
        );
        // The earliest the `k`-th input gradient (in start order) can start, when the `k`-th
        // forward starts at `t` or later: one of the first `k + 1` gradients is of a forward that
        // started then or later.
        let i_head = |t: f64| {
            self.mine
                .iter()
                .zip(heads)
                .map(|(&s, &h)| t.max(h) + c.forward[s] + c.up[s])
                .fold(f64::INFINITY, f64::min)
        };
        // The earliest the `k`-th rest can start: after the `k`-th input gradient's earliest end.
        let w_head = |t: f64| {
            self.mine
                .iter()
                .zip(heads)
                .map(|(&s, &h)| t.max(h) + c.forward[s] + c.up[s] + c.input[s])
                .fold(f64::INFINITY, f64::min)
        };
        let mut x = vec![sorted[0]; count];
        // Per forward `k` (filled as `x[k]` is settled): the heads of the `k`-th input gradient and
        // of the `k`-th rest (after its input gradient: `freed` to the end of `I`).
        let (mut i_heads, mut w_heads) = (vec![0.0; count], vec![0.0; count]);
        if packed {
            i_heads[0] = i_head(x[0]);
            w_heads[0] = w_head(x[0]);
        }
        for i in 1..count {
            x[i] = (x[i - 1] + spacing).max(sorted[i / m.max(1)]);
            match slots.after {
                None if i >= n => {
                    x[i] = x[i].max(freed(x[i - n], false));
                    if packed {
                        // At least `i - n + 1` earlier ones freed their slots, so the first
                        // `i - n + 1` input gradients and rests (in start order) ended before it,
                        // as did the `i` earlier forwards: all run one at a time from their heads.
                        let done = i - n + 1;
                        x[i] = x[i].max(packed_end(
                            (&x[..i], fw),
                            (&i_heads[..done], iw),
                            (&w_heads[..done], ww),
                        ));
                    }
                }
                None => {}
                Some(w) => {
                    // At the start of forward `i` (0-based: `i` earlier ones), `a` of them hold a
                    // whole slot and `b <= (cap - 1 - a) / w` the second level: `i - a` are past
                    // their `I`, `i - a - b` past their `W`.
                    let mut least = f64::INFINITY;
                    for a in 0..=(n - 1).min(i) {
                        let past_i = i - a;
                        let second = if w > 0.0 {
                            ((slots.cap - 1.0 - a as f64) / w + 1e-9).floor().max(0.0)
                        } else {
                            f64::INFINITY
                        };
                        let t_i = if past_i >= 1 {
                            freed(x[past_i - 1], false)
                        } else {
                            0.0
                        };
                        let past_w = past_i as f64 - second;
                        let t_w = if past_w >= 1.0 {
                            freed(x[past_w as usize - 1], true)
                        } else {
                            0.0
                        };
                        let mut t = t_i.max(t_w);
                        if packed && t < least {
                            // Before forward `i` starts, its rank has run the `i` earlier forwards,
                            // the first `i - a` input gradients and the first `i - a - b` rests,
                            // each from its head: the last of them ends no earlier than the latest
                            // head plus the work of every one with that head or a later one.
                            // Each kind's heads grow with `k`: merged from the latest down. All
                            // of them start at `x[0]` or later, so when even that much work
                            // ends past the least so far, this `a` cannot lower it.
                            let ws = past_w.max(0.0) as usize;
                            let all = i as f64 * fw + past_i as f64 * iw + ws as f64 * ww;
                            if x[0] + all >= least {
                                continue;
                            }
                            t = t.max(packed_end(
                                (&x[..i], fw),
                                (&i_heads[..past_i], iw),
                                (&w_heads[..ws], ww),
                            ));
                        }
                        least = least.min(t);
                    }
                    x[i] = x[i].max(least);
                }
            }
            if packed {
                i_heads[i] = i_head(x[i]);
                w_heads[i] = w_head(x[i]);
            }
        }
        x
    }

    /// Section 6: the time the rank must hold activations for, divided by what it can hold at
    /// once: every stage-microbatch holds a slot for at least its round trip (with a second level,
    /// `w` of one for its rest too), at most `cap` slots at a time.
    fn holding(&self, m: usize, slots: Slots) -> f64 {
        let c = self.chain;
        let w = slots.after.unwrap_or(0.0);
        let total: f64 = self
            .mine
            .iter()
            .map(|&s| c.round_trip(s) + w * c.rest[s])
            .sum();
        let cap = match slots.after {
            None => slots.whole() as f64,
            Some(_) => slots.cap,
        };
        m as f64 * total / cap.max(1.0)
    }
}

/// The earliest the last of three kinds of jobs can end on one machine, each kind's heads in
/// ascending order and all of one work: the latest head plus the work of every job with that head
/// or a later one, the largest over heads (a preemptive schedule from the heads reaches it).
fn packed_end(a: (&[f64], f64), b: (&[f64], f64), c: (&[f64], f64)) -> f64 {
    let (mut ka, mut kb, mut kc) = (a.0.len(), b.0.len(), c.0.len());
    let (mut after, mut end) = (0.0, f64::NEG_INFINITY);
    loop {
        let ha = if ka > 0 {
            a.0[ka - 1]
        } else {
            f64::NEG_INFINITY
        };
        let hb = if kb > 0 {
            b.0[kb - 1]
        } else {
            f64::NEG_INFINITY
        };
        let hc = if kc > 0 {
            c.0[kc - 1]
        } else {
            f64::NEG_INFINITY
        };
        let head = if ha >= hb && ha >= hc && ka > 0 {
            ka -= 1;
            after += a.1;
            ha
        } else if hb >= hc && kb > 0 {
            kb -= 1;
            after += b.1;
            hb
        } else if kc > 0 {
            kc -= 1;
            after += c.1;
            hc
        } else {
            return end;
        };
        end = end.max(head + after);
    }
}

/// The most `count^2` (times the slots with two levels) times the ranks for which the recurrence of
/// sections 4, 5 and 11 also packs the jobs that must precede each forward: about 0.25 s at this
/// size (P = 32, M = 256 at 1F1B's memory with two levels).
const PACKED_WORK: f64 = 1e8;

/// What a rank can hold, in stage-microbatch slots: `cap` of them (whole slots for the plain
/// terms); with `after`, a slot is held whole from a forward's start to the end of its `I` and `w`
/// of it from there to the end of its `W` (section 11).
#[derive(Debug, Clone, Copy)]
pub(super) struct Slots {
    /// Slots, stage-microbatches (not rounded with a second level).
    pub cap: f64,
    /// The share of a slot held after `I`, with a second level.
    pub after: Option<f64>,
}

impl Slots {
    /// At most `limit` rank-microbatches with `chunks` stages per rank, and the second level.
    pub(super) fn new(limit: f64, chunks: f64, after: Option<f64>) -> Slots {
        let cap = limit * chunks + 1e-9;
        Slots {
            cap: if after.is_some() { cap } else { cap.floor() },
            after,
        }
    }

    /// Whole slots.
    pub(super) fn whole(self) -> usize {
        self.cap.floor().max(1.0) as usize
    }

    /// Whether every one of `count` stage-microbatches fits at once at full size and to the end.
    pub(super) fn binds_none(self, count: usize) -> bool {
        self.cap >= count as f64
    }
}

/// Sections 1 and 2 of the [simulator's docs](crate::sim#lower-bound) alone: the bound before the one-machine relaxation
/// was added (one term of [`bound_for`], which is never below it).
pub fn basic_bound(
    ranks: usize,
    microbatches: usize,
    placement: Placement,
    costs: &CostModel,
    overlap: bool,
) -> f64 {
    let st = &costs.stages;
    let s_count = st.len();
    if s_count == 0 || ranks == 0 {
        return 0.0;
    }
    let m = microbatches as f64;
    let rank = |s: usize| placement.rank_of(s, ranks);
    let comm = |j: usize| {
        if j + 1 < s_count && rank(j) != rank(j + 1) {
            costs.boundary_time(j)
        } else {
            0.0
        }
    };
    // Backward needed on stage j for the chain to move on: I (or B), and at stage 0 the whole backward.
    let back = |j: usize| {
        let c = &st[j];
        if j == 0 {
            c.time(Op::B).min(c.time(Op::I) + c.time(Op::W))
        } else {
            c.time(Op::I).min(c.time(Op::B))
        }
    };
    let mut fchain = vec![0.0; s_count];
    let mut gchain = vec![0.0; s_count];
    for s in 1..s_count {
        fchain[s] = fchain[s - 1] + st[s - 1].forward + comm(s - 1);
        gchain[s] = gchain[s - 1] + back(s - 1) + comm(s - 1);
    }
    let last = s_count - 1;
    let mut bound = fchain[last] + st[last].forward + back(last) + gchain[last];
    for r in 0..ranks {
        let mine: Vec<usize> = (0..s_count).filter(|&s| rank(s) == r).collect();
        let Some(&s0) = mine.first() else { continue };
        let longest_back = mine
            .iter()
            .map(|&s| st[s].time(Op::B).max(st[s].time(Op::I)))
            .fold(0.0, f64::max);
        let mut work = 0.0;
        let mut non_deferrable = 0.0;
        let mut savings = 0.0;
        for &s in &mine {
            let c = &st[s];
            work += c.forward + c.time(Op::B).min(c.time(Op::I) + c.time(Op::W));
            non_deferrable += c.forward + c.time(Op::I).min(c.time(Op::B));
            if overlap {
                savings += (1.0 - costs.overlap_share) * c.forward.min(longest_back);
            }
        }
        let head = fchain[s0];
        bound = bound
            .max(head + m * (work - savings))
            .max(head + m * (non_deferrable - savings) + gchain[s0]);
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{LinkCost, StageCost};

    #[test]
    fn one_f_one_b_shape() {
        // P = 4, M = 8, F = 1, I = W = 1: the last rank cannot start before 3 and works 24.
        let c = CostModel::uniform(StageCost::uniform(1.0, 1.0, 1.0), 4, LinkCost::default());
        assert_eq!(bound_for(4, 8, Placement::Looped, &c, false), 27.0);
        // With latency 0.5 on every hop the head grows by 3 * 0.5.
        let c = CostModel::uniform(
            StageCost::uniform(1.0, 1.0, 1.0),
            4,
            LinkCost {
                latency: 0.5,
                bandwidth: f64::INFINITY,
            },
        );
        assert_eq!(bound_for(4, 8, Placement::Looped, &c, false), 28.5);
    }

    #[test]
    fn single_microbatch_chain() {
        // M = 1: the whole chain F0..F3, I3..I1, B0 (or I0 + W0) is the bound.
        let c = CostModel::uniform(StageCost::uniform(1.0, 2.0, 3.0), 4, LinkCost::default());
        assert_eq!(
            bound_for(4, 1, Placement::Looped, &c, false),
            4.0 + 3.0 * 2.0 + 5.0
        );
    }
}
