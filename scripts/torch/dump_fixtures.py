"""Make PyTorch write its own schedule CSVs, for pipefill's tests (not run in CI).

Usage: python scripts/torch/dump_fixtures.py OUT_DIR      (needs torch 2.15; no process group, no GPU)

For every schedule family PyTorch 2.15 has, at a few (ranks, microbatches), writes
  {family}_p{P}_m{M}_compute_only.csv   the family's compute-only order, as its _dump_csv writes it
  {family}_p{P}_m{M}_compute_comms.csv  the order lowered by _PipelineScheduleRuntime (sends, receives,
                                        WAIT_SEND_*, UNSHARD/RESHARD, REDUCE_GRAD/WAIT_REDUCE_GRAD)
The single-stage families (GPipe, 1F1B) have no _dump_csv of their own: their compute-only file is their
_get_pipeline_order() written by the same csv.writer, and their compute+comms file is that order (without
its REDUCE_GRAD entries, which _load_csv's compute_only form refuses) loaded into a
_PipelineScheduleRuntime and dumped again. The stages are stand-ins that carry only what the schedules
read at construction (stage index, number of stages, rank and group size).
"""

import csv
import os
import sys

import torch
from torch.distributed.pipelining import schedules as S

if torch.__version__.split("+")[0] != "2.15.0":
    sys.exit(f"needs torch 2.15.0, found {torch.__version__}")


class Stage:
    """What a schedule's constructor reads from a pipeline stage."""

    def __init__(self, index, num_stages, rank, ranks):
        self.stage_index = index
        self.num_stages = num_stages
        self.group_rank = rank
        self.group_size = ranks
        self.is_first = index == 0
        self.is_last = index == num_stages - 1
        self.stage_index_to_group_rank = {}
        self.submod = None


MULTI = {
    "looped_bfs": (S.ScheduleLoopedBFS, "looped"),
    "interleaved_1f1b": (S.ScheduleInterleaved1F1B, "looped"),
    "interleaved_zb": (S.ScheduleInterleavedZeroBubble, "looped"),
    "zbv": (S.ScheduleZBVZeroBubble, "vshape"),
    "dualpipev": (S.ScheduleDualPipeV, "vshape"),
}
SINGLE = {"gpipe": S.ScheduleGPipe, "1f1b": S.Schedule1F1B}
SHAPES = [(2, 4), (4, 8), (3, 6)]


def stage_ids(rank, ranks, placement):
    if placement == "looped":
        return [rank, rank + ranks]
    return [rank, 2 * ranks - 1 - rank]


def write(path, order):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for rank in sorted(order):
            writer.writerow(order[rank])


def multi(cls, placement, ranks, m):
    stages = [Stage(i, 2 * ranks, 0, ranks) for i in stage_ids(0, ranks, placement)]
    return cls(stages, n_microbatches=m, loss_fn=lambda y, t: (y - t).sum())


def main(out):
    os.makedirs(out, exist_ok=True)
    written = []
    for name, (cls, placement) in MULTI.items():
        for ranks, m in SHAPES:
            try:
                sched = multi(cls, placement, ranks, m)
            except Exception as e:  # a family that refuses a shape: say so and go on
                print(f"skip {name} P={ranks} M={m}: {e}")
                continue
            base = os.path.join(out, f"{name}_p{ranks}_m{m}")
            sched._dump_csv(base + "_compute_only.csv", format="compute_only")
            sched._dump_csv(base + "_compute_comms.csv", format="compute_comms")
            written += [base + "_compute_only.csv", base + "_compute_comms.csv"]
    for name, cls in SINGLE.items():
        for ranks, m in SHAPES:
            stage = Stage(0, ranks, 0, ranks)
            sched = cls(stage, n_microbatches=m, loss_fn=lambda y, t: (y - t).sum())
            order = sched._get_pipeline_order()
            base = os.path.join(out, f"{name}_p{ranks}_m{m}")
            write(base + "_compute_only.csv", order)
            compute = {
                r: [a for a in acts if a is not None and a.is_compute_op] for r, acts in order.items()
            }
            tmp = base + ".tmp.csv"
            write(tmp, compute)
            rt = S._PipelineScheduleRuntime(
                [Stage(0, ranks, 0, ranks)], n_microbatches=m, loss_fn=lambda y, t: (y - t).sum()
            )
            written.append(base + "_compute_only.csv")
            try:
                rt._load_csv(tmp, format="compute_only")
            except AssertionError as e:  # PyTorch refuses its own order: say so and go on
                print(f"PyTorch refuses its own {name} P={ranks} M={m} order: {str(e).splitlines()[0]}")
                continue
            finally:
                os.remove(tmp)
            rt._dump_csv(base + "_compute_comms.csv", format="compute_comms")
            written.append(base + "_compute_comms.csv")
    print(f"torch {torch.__version__}: wrote {len(written)} files to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "host/tests/data/torch215")
