#!/usr/bin/env python3
"""The proven optimum of small V-shape (V = 2) instances, as a measurement peer for `auto` and its
lower bound (issue 20). Not run by CI: it needs Google OR-Tools (`python3 -m venv V && V/bin/pip
install ortools`), and solving takes seconds to minutes per row.

For each row of `pipefill bench auto --part vshape`'s grid that is asked for (P, M, F:I:W per rank,
transfer as a share of a rank's F, limit `half` = P/2, `1f1b` = P, `2x` = 2P microbatches in flight,
objective), it builds the scheduling problem in CP-SAT under pipefill's own model and asks for the
optimum, then runs `pipefill schedule --schedule auto` on the same row and prints both with the
bound pipefill reports:

- stage s runs on rank s for s < P and on rank 2P-1-s above; each chunk costs half a rank's F, I, W;
- F(s,k) starts after F(s-1,k) ends plus the link latency, I(2P-1,k) after F(2P-1,k), I(s,k) after
  I(s+1,k) plus the latency, W(s,k) after I(s,k); the latency counts only between ranks, it occupies
  no rank (links without contention, as `simulate`);
- a rank runs one action at a time;
- memory: stage-microbatch (s,k) holds one of at most floor(2L) slots of its rank from the start of
  F(s,k) to the end of W(s,k) (a chunk counts 1/2 microbatch; F allocates when it starts, W frees when
  it ends, as `simulate`);
- makespan: the last end; span: the longest first-start-to-last-end over ranks.
B (fused I + W) and overlapped pairs are left out: with `overlap_share` 1 neither can do better.
Microbatches are interchangeable, so every op of every stage runs in microbatch order (no loss);
spans do not change when the whole schedule shifts, so the span objective starts F(0,0) at 0.

usage: vshape_optimum.py PIPEFILL P M[,M..] [--seconds S] [--objectives makespan,span]
                         [--limits half,1f1b,2x] [--ratios 1:1:1,2:2:1,1:1.2:0.8] [--transfers 0,0.1]
                         [--hint] [--budget SECONDS] [--machines R,R,..] [--csv FILE]
                         [--at-most VALUE] [--span-ranks R,R,..] [--memory-ranks R,R,..]
Prints one JSON object per row, then a summary; `status` OPTIMAL means the optimum is proven,
FEASIBLE that the time ran out (then `cp_bound` is CP-SAT's own proven lower bound).
"""
import argparse
import json
import subprocess
import sys
import tempfile

from ortools.sat.python import cp_model

RATIOS = {"1:1:1": (1.0, 1.0, 1.0), "2:2:1": (2.0, 2.0, 1.0), "1:1.2:0.8": (1.0, 1.2, 0.8)}
SCALE = 20  # every time in the grid is a multiple of 1/20


def optimum(p, m, f, i, w, transfer, limit, objective, seconds, workers, csv=None, hint=None,
            machines=None, at_most=None, span_ranks=None, memory_ranks=None):
    """CP-SAT's answer: (status name, best value or None, proven lower bound, wall seconds); with
    `csv` a path, its best schedule is written there as pipefill's CSV (one row per rank, actions in
    start order); with `hint` a map (op, stage, microbatch) -> start time, CP-SAT starts from that
    schedule (`auto`'s, so that its answer says whether `auto` left anything on the table); with
    `machines` a list of ranks, only those run one action at a time (the others overlap their own
    actions freely): a relaxation, whose optimum says which ranks together set the step; with
    `at_most` a value, only schedules whose objective is at most that count (INFEASIBLE then proves
    the optimum above it, often far sooner than the optimisation proves its bound); with
    `span_ranks` a list of ranks, the span objective takes only their spans (a relaxation: its
    optimum is a lower bound on the span); with `memory_ranks` a list of ranks, only those keep
    the slot limit (a relaxation, with `machines` a one-rank problem)."""
    stages = 2 * p
    rank = lambda s: s if s < p else 2 * p - 1 - s
    cf, ci, cw = (round(SCALE * x / 2) for x in (f, i, w))
    link = round(SCALE * transfer * f)
    slots = int(2 * limit + 1e-9)
    comm = lambda s: link if rank(s) != rank(s + 1) else 0
    horizon = m * stages * (cf + ci + cw + link) + 10
    model = cp_model.CpModel()
    start, end = {}, {}
    work = [[] for _ in range(p)]
    holds = [[] for _ in range(p)]
    for s in range(stages):
        for k in range(m):
            for op, d in (("F", cf), ("I", ci), ("W", cw)):
                a = model.NewIntVar(0, horizon, f"s{op}{s}_{k}")
                b = model.NewIntVar(0, horizon, f"e{op}{s}_{k}")
                work[rank(s)].append(model.NewIntervalVar(a, d, b, f"{op}{s}_{k}"))
                start[op, s, k], end[op, s, k] = a, b
    for s in range(stages):
        for k in range(m):
            if s > 0:
                model.Add(start["F", s, k] >= end["F", s - 1, k] + comm(s - 1))
            if s == stages - 1:
                model.Add(start["I", s, k] >= end["F", s, k])
            else:
                model.Add(start["I", s, k] >= end["I", s + 1, k] + comm(s))
            model.Add(start["W", s, k] >= end["I", s, k])
            size = model.NewIntVar(0, horizon, f"h{s}_{k}")
            holds[rank(s)].append(
                model.NewIntervalVar(start["F", s, k], size, end["W", s, k], f"hold{s}_{k}")
            )
    # Microbatches are interchangeable: sorting each op's start times per stage keeps every
    # dependency, every rank's intervals and every rank's slot count (the argument of section 10 of
    # host/src/sim/bound/mod.rs), so every op of every stage may run in microbatch order. Without
    # this symmetry breaking P = M = 8 takes CP-SAT 1107 s to prove; with it, seconds.
    for s in range(stages):
        for op in "FIW":
            for k in range(m - 1):
                model.Add(start[op, s, k] <= start[op, s, k + 1])
    for r in range(p):
        if machines is None or r in machines:
            model.AddNoOverlap(work[r])
        if slots < 2 * m and (memory_ranks is None or r in memory_ranks):
            model.AddCumulative(holds[r], [1] * len(holds[r]), slots)
    if objective == "makespan":
        goal = model.NewIntVar(0, horizon, "makespan")
        model.AddMaxEquality(goal, [end["W", s, m - 1] for s in range(stages)])
    else:
        # Spans do not change when the whole schedule shifts, and F(0, 0) comes before every other
        # action (each needs a forward of stage 0, which run in microbatch order): it starts at 0.
        # Without this anchor CP-SAT's bound stays at the rank's work.
        model.Add(start["F", 0, 0] == 0)
        spans = []
        for r in (range(p) if span_ranks is None else span_ranks):
            # Every action of rank r needs a forward of its lower stage r, and those run in
            # microbatch order: the rank's first action is F(r, 0).
            first = start["F", r, 0]
            last = model.NewIntVar(0, horizon, f"last{r}")
            # ... and its last is the last weight pass of one of its two stages (every other
            # action of a stage comes before one of its weight passes, which run in order).
            model.AddMaxEquality(last, [end["W", s, m - 1] for s in (r, 2 * p - 1 - r)])
            # Redundant, for CP-SAT's own bound: a span holds the rank's work.
            model.Add(last - first >= m * 2 * (cf + ci + cw))
            spans.append(last - first)
        goal = model.NewIntVar(0, horizon, "span")
        model.AddMaxEquality(goal, spans)
    if at_most is not None:
        model.Add(goal <= round(SCALE * at_most))
    model.Minimize(goal)
    if hint:
        # Microbatches are interchangeable: sort the hint's start times of each op of each stage,
        # as the model asks (the same schedule under other labels; unsorted, CP-SAT would find the
        # hint infeasible).
        hint = {(op, s, j): t for op in "FIW" for s in range(stages)
                for j, t in enumerate(sorted(hint[op, s, k] for k in range(m)))}
        for x, a in start.items():
            t = round(SCALE * hint[x])
            model.AddHint(a, t)
            model.AddHint(end[x], t + {"F": cf, "I": ci, "W": cw}[x[0]])
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = workers
    status = solver.Solve(model)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    value = solver.ObjectiveValue() / SCALE if found else None
    if found and csv:
        with open(csv, "w") as fh:
            for r in range(p):
                acts = sorted((solver.Value(start[x]), x) for x in start if rank(x[1]) == r)
                fh.write(",".join(f"{s}{op}{k}" for _, (op, s, k) in acts) + "\n")
    return solver.StatusName(status), value, solver.BestObjectiveBound() / SCALE, solver.WallTime()


def auto(binary, p, m, f, i, w, transfer, limit, objective, budget=None):
    """`pipefill schedule --schedule auto` on the row (default budget), with the grid's costs
    (`overlap_share` 1: an overlapped pair saves nothing, as in the model above): its solver report
    and its start times, (op, stage, microbatch) -> time, read from `pipefill simulate --trace`."""
    stage = {"forward": f / 2, "backward_input": i / 2, "backward_weight": w / 2,
             "activation_bytes": 0, "parameter_bytes": 0}
    costs = {"stages": [stage] * (2 * p), "overlap_share": 1,
             "transfer": {"latency": transfer * f, "bandwidth": None}}
    with tempfile.TemporaryDirectory() as tmp:
        path, out = f"{tmp}/costs.json", f"{tmp}/auto.json"
        with open(path, "w") as fh:
            json.dump(costs, fh)
        cmd = [binary, "schedule", "--schedule", "auto", "--ranks", str(p), "--microbatches", str(m),
               "--chunks", "2", "--placement", "vshape", "--costs", path,
               "--max-in-flight", str(limit), "--objective", objective, "--format", "json",
               "--out", out] + (["--time-budget", str(budget)] if budget is not None else [])
        subprocess.run(cmd, check=True, capture_output=True)
        trace = f"{tmp}/trace.json"
        subprocess.run([binary, "simulate", "--schedule-file", out, "--costs", path, "--trace",
                        trace], check=True, capture_output=True)
        with open(trace) as fh:
            events = json.load(fh)
        events = events["traceEvents"] if isinstance(events, dict) else events
        starts = {}
        for e in events:
            a = e.get("args", {})
            if e.get("ph") == "X" and a.get("op") in ("F", "I", "W"):
                starts[a["op"], a["stage"], a["microbatch"]] = e["ts"] / 1e6
        with open(out) as fh:
            return json.load(fh)["solver"], starts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pipefill")
    ap.add_argument("ranks", type=int)
    ap.add_argument("microbatches")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--objectives", default="makespan,span")
    ap.add_argument("--limits", default="half,1f1b,2x")
    ap.add_argument("--ratios", default=",".join(RATIOS))
    ap.add_argument("--transfers", default="0,0.1")
    ap.add_argument("--reuse", help="take the optima from this earlier output (JSON lines) instead "
                    "of solving again; rows not in it are solved")
    ap.add_argument("--hint", action="store_true", help="start CP-SAT from auto's schedule "
                    "(its answer is then never worse than auto's)")
    ap.add_argument("--budget", type=float, help="auto's --time-budget (default: auto's own)")
    ap.add_argument("--csv", help="write the (last) row's CP-SAT schedule here, pipefill's CSV")
    ap.add_argument("--at-most", type=float, help="only schedules whose objective is at most "
                    "this (INFEASIBLE proves the optimum above it)")
    ap.add_argument("--span-ranks", help="the span objective over only these ranks "
                    "(comma-separated), a relaxation whose optimum bounds the span from below")
    ap.add_argument("--memory-ranks", help="only these ranks (comma-separated) keep the slot "
                    "limit, a relaxation (with --machines R, rank R's own problem)")
    ap.add_argument("--machines", help="only these ranks (comma-separated) run one action at a "
                    "time, a relaxation (with --hint or --reuse, not meaningful)")
    a = ap.parse_args()
    p = a.ranks
    machines = [int(r) for r in a.machines.split(",")] if a.machines else None
    span_ranks = [int(r) for r in a.span_ranks.split(",")] if a.span_ranks else None
    memory_ranks = [int(r) for r in a.memory_ranks.split(",")] if a.memory_ranks else None
    limits = {"half": p / 2, "1f1b": float(p), "2x": 2.0 * p}
    rows = []
    known = {}
    if a.reuse:
        with open(a.reuse) as fh:
            for line in fh:
                if line.startswith("{"):
                    r = json.loads(line)
                    known[key(r)] = r
    for m in map(int, a.microbatches.split(",")):
        for rn in a.ratios.split(","):
            f, i, w = RATIOS[rn]
            for t in map(float, a.transfers.split(",")):
                for ln in a.limits.split(","):
                    for obj in a.objectives.split(","):
                        old = known.get((p, m, rn, t, ln, obj))
                        s, starts = auto(a.pipefill, p, m, f, i, w, t, limits[ln], obj, a.budget)
                        if old:
                            st, best, proven, wall = (old["status"], old["cp_best"],
                                                      old["cp_bound"], old["cp_seconds"])
                        else:
                            st, best, proven, wall = optimum(p, m, f, i, w, t, limits[ln], obj,
                                                             a.seconds, a.workers, a.csv,
                                                             starts if a.hint else None,
                                                             machines, a.at_most, span_ranks,
                                                             memory_ranks)
                        row = dict(P=p, M=m, ratio=rn, transfer=t, limit=ln, objective=obj,
                                   status=st, optimum=best if st == "OPTIMAL" else None,
                                   cp_best=best, cp_bound=proven, cp_seconds=round(wall, 2),
                                   auto=s["value"], bound=s["lower_bound"], origin=s["origin"])
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    summary(rows)


def key(r):
    """A row's identity."""
    return (r["P"], r["M"], r["ratio"], r["transfer"], r["limit"], r["objective"])


def summary(rows):
    """auto against the optimum and the bound against the optimum, per limit and objective."""
    print("limit objective rows proven | auto/opt: mean max, >0.1% | bound/opt: mean min, "
          "rows with opt/bound > 1.02")
    groups = {}
    for r in rows:
        groups.setdefault((r["limit"], r["objective"]), []).append(r)
    for (ln, obj), rs in sorted(groups.items()):
        pr = [r for r in rs if r["optimum"] is not None]
        if not pr:
            print(f"{ln:5} {obj:9} {len(rs):4} {0:6} | none proven")
            continue
        a = [r["auto"] / r["optimum"] for r in pr]
        b = [r["bound"] / r["optimum"] for r in pr]
        print(f"{ln:5} {obj:9} {len(rs):4} {len(pr):6} | {sum(a) / len(a):.4f} {max(a):.4f} "
              f"{sum(x > 1.001 for x in a):3} | {sum(b) / len(b):.4f} {min(b):.4f} "
              f"{sum(1 / x > 1.02 for x in b):3}")


if __name__ == "__main__":
    sys.exit(main())
