"""pipefill's schedules through PyTorch 2.15's own runtime (not run in CI).

Usage: python scripts/torch/roundtrip.py PIPEFILL_BINARY [--ranks 2] [--microbatches 4] [--steps 3]
                                         [--families gpipe,zbv,...]

For every family `pipefill schedule --list` names and `auto`, writes the schedule in both CSV forms:
  compute_only   pipefill schedule --schedule F --ranks P --microbatches M --format csv
  compute_comms  the same with --with-transfers
loads each with `_PipelineScheduleRuntime._load_csv(path, format=...)` and trains a small MLP (one
nn.Linear + tanh per stage, S = P*V stages) for a few SGD steps over gloo, one process per rank on CPU,
then compares each step's loss (mean over microbatches, as PyTorch's scale_grads=True averages the
gradients) with a sequential run of the same model on one process. Prints one line per
(family, form) and a Markdown table; exits 1 if any run failed or differed by more than 1e-5.
"""

import argparse
import csv
import os
import re
import socket
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

WIDTH, BATCH, LR, TOLERANCE = 8, 16, 0.1, 1e-5


def stage_module(s):
    torch.manual_seed(1000 + s)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())


def batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, WIDTH, generator=g)
    return x, torch.tanh(x.flip(1) * 0.5)


def mse(y, t):
    return torch.nn.functional.mse_loss(y, t)


def sequential(stages, m, steps):
    mods = [stage_module(s) for s in range(stages)]
    params = [p for mod in mods for p in mod.parameters()]
    opt = torch.optim.SGD(params, lr=LR)
    losses = []
    for step in range(steps):
        x, t = batch(step)
        opt.zero_grad()
        total = 0.0
        for xk, tk in zip(x.chunk(m), t.chunk(m)):
            y = xk
            for mod in mods:
                y = mod(y)
            loss = mse(y, tk) / m
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses


def stages_of(path):
    """Stage -> rank, read from the file (each stage's actions sit on its rank's row)."""
    where = {}
    with open(path, newline="") as f:
        for rank, row in enumerate(csv.reader(f)):
            for cell in row:
                for s in re.findall(r"(\d+)(?:F|B|I|W|SEND|RECV)", cell):
                    where[int(s)] = rank
    return where


def worker(rank, ranks, port, path, form, m, steps, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    try:
        where = stages_of(path)
        n = len(where)
        mine = sorted(s for s, r in where.items() if r == rank)
        mods = {s: stage_module(s) for s in mine}
        stages = [PipelineStage(mods[s], s, n, torch.device("cpu")) for s in mine]
        sched = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=mse)
        sched._load_csv(path, format=form)
        params = [p for mod in mods.values() for p in mod.parameters()]
        opt = torch.optim.SGD(params, lr=LR)
        losses = []
        for step in range(steps):
            x, t = batch(step)
            opt.zero_grad()
            got = []
            sched.step(x, target=t, losses=got)
            opt.step()
            if got:
                losses.append(sum(v.item() for v in got) / m)
        if (n - 1) in mine:
            torch.save(losses, out)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(path, form, ranks, m, steps, timeout=300):
    out = path + f".{form}.losses"
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=worker, args=(r, ranks, port, path, form, m, steps, out))
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
    if hung or any(p.exitcode != 0 for p in procs):
        return None, "hung" if hung else "exit " + ",".join(str(p.exitcode) for p in procs)
    return torch.load(out), ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pipefill")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--families", default="")
    a = ap.parse_args()
    listing = subprocess.run([a.pipefill, "schedule", "--list"], capture_output=True, text=True, check=True)
    families = [l.split()[0] for l in listing.stdout.splitlines()[1:] if l.strip()]
    if a.families:
        families = a.families.split(",")
    elif "auto" not in families:
        families.append("auto")
    rows, bad = [], 0
    tmp = tempfile.mkdtemp(prefix="pipefill-torch-")
    print(f"torch {torch.__version__}, P={a.ranks}, M={a.microbatches}, {a.steps} SGD steps, gloo")
    for fam in families:
        for form, extra in (("compute_only", []), ("compute_comms", ["--with-transfers"])):
            path = os.path.join(tmp, f"{fam}_{form}.csv")
            cmd = [a.pipefill, "schedule", "--schedule", fam, "--ranks", str(a.ranks),
                   "--microbatches", str(a.microbatches), "--format", "csv", "--out", path] + extra
            made = subprocess.run(cmd, capture_output=True, text=True)
            if made.returncode != 0:
                rows.append((fam, form, "FAIL", "", made.stderr.strip().splitlines()[-1]))
                bad += 1
                continue
            stages = len(stages_of(path))
            want = sequential(stages, a.microbatches, a.steps)
            got, why = run(path, form, a.ranks, a.microbatches, a.steps)
            if got is None or len(got) != len(want):
                rows.append((fam, form, "FAIL", "", why or f"{got}"))
                bad += 1
            else:
                diff = max(abs(x - y) for x, y in zip(got, want))
                ok = diff <= TOLERANCE
                bad += not ok
                rows.append((fam, form, "pass" if ok else "FAIL", f"{diff:.1e}", f"S={stages}"))
            print(" ".join(rows[-1]), flush=True)
    print("\n| family | form | result | max loss diff | note |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
