#!/usr/bin/env python3
"""`auto` against the zero-bubble authors' V-shape schedulers, as a measurement peer (issue 20). Not
run by CI: it needs a checkout of sail-sg/zero-bubble-pipeline-parallelism (measured at 064369d6),
whose `zbv.py` (ZB-V greedy) and `zbv_greedy.py` (V-Half, V-Min) it imports unmodified (their one
Megatron import is answered by a stub), and it takes 3-6 minutes on 2 cores.

usage: compare_v.py PIPEFILL ZB_CHECKOUT OUT.json [--jobs N] [--ranks 4,8,16]

For each case of `bench auto --part vshape`'s grid (P 4, 8, 16; M = P, 2P, 4P; F:I:W 1:1:1, 2:2:1,
1:1.2:0.8 per rank, each chunk half of it; transfer 0 and 0.1 of a rank's F per hop) it runs:

- their ZB-V at `max_mem` 2P and 4P chunk activations (pipefill's `--max-in-flight` P and 2P), in
  pipefill's memory model (`f_mem` 1, `b_mem` 0, `w_mem` -1: `I` frees nothing, `W` frees the chunk)
  and in their usual one (2, -1, -1, limit doubled), the latter kept only where pipefill's simulator
  finds its peak within the limit; the better of the two counts, per objective; their four
  `fill_b`/`fill_f` runs, the least `max_bubble` taken, as their `create_schedule` does;
- their V-Half and V-Min (stable pattern, squeeze, `W`s split), compared at their own simulated peak.

Each schedule is written as a pipefill CSV (rank r: chunk 0 is stage r, chunk 1 stage 2P-1-r; their
`B` is `I`), simulated by `pipefill simulate` (makespan; the span is the longest first-start-to-
last-end over ranks, from the trace), and compared with `pipefill schedule --schedule auto
--placement vshape --chunks 2 --costs C.json --max-in-flight L --objective makespan|span` at the same
limit, with the same per-stage cost file (`overlap_share` 1, the authors' model: no free overlap, so
`auto` forms no overlapped pairs). Prints a markdown table; OUT.json has every comparison.
"""
import json
import os
import subprocess
import sys
import tempfile
import types
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

RATIOS = {'1:1:1': (1, 1, 1), '2:2:1': (2, 2, 1), '1:1.2:0.8': (1, 1.2, 0.8)}


def load_theirs(checkout):
    """Their two modules, imported from the checkout with a stub for the Megatron graph module."""
    stub = types.ModuleType('megatron.core.pipeline_parallel.zerobubble.scheduler.graph')
    for name in ('ScheduledNode', 'F', 'B', 'W', 'FuncType'):
        setattr(stub, name, object())
    parts = stub.__name__.split('.')
    for i in range(1, len(parts)):
        sys.modules.setdefault('.'.join(parts[:i]), types.ModuleType('.'.join(parts[:i])))
    sys.modules[stub.__name__] = stub
    base = os.path.join(checkout, 'megatron/core/pipeline_parallel/zerobubble/scheduler')
    mods = []
    for name in ('zbv', 'zbv_greedy'):
        spec_path = os.path.join(base, name + '.py')
        mod = types.ModuleType('theirs_' + name)
        exec(compile(open(spec_path).read(), spec_path, 'exec'), mod.__dict__)
        mods.append(mod)
    return mods


def csv_zbv(sched, p):
    """ZB-V's per-stage (cat, chunk, microbatch): B's and W's chunk index is the model chunk reversed."""
    rows = []
    for r in range(p):
        cells = []
        for cat, ichunk, mb in sched[r]:
            chunk = ichunk if cat == 0 else 1 - ichunk
            stage = r if chunk == 0 else 2 * p - 1 - r
            cells.append(f"{stage}{'FIW'[cat]}{mb}")
        rows.append(','.join(cells))
    return '\n'.join(rows) + '\n'


def csv_pattern(order, p):
    """V-Half / V-Min's per-stage (type, microbatch), type in F f B b W w (lower case: chunk 1's forward,
    chunk 0's backward; B flows up, so it is chunk 1's; W splits as B, w as b)."""
    stage_of = {0: 0, 1: 1, 2: 1, 3: 0, 4: 1, 5: 0}
    rows = []
    for r in range(p):
        cells = []
        for t, mb in order[r]:
            stage = r if stage_of[t] == 0 else 2 * p - 1 - r
            cells.append(f"{stage}{'FFIIWW'[t]}{mb}")
        rows.append(','.join(cells))
    return '\n'.join(rows) + '\n'


def simulate(pf, path, costs):
    trace = path + '.trace.json'
    out = subprocess.run([pf, 'simulate', '--schedule-file', path, '--costs', costs, '--format', 'json',
                          '--trace', trace], capture_output=True, text=True, check=True).stdout
    result = json.loads(out)['results'][0]
    events = json.load(open(trace))
    events = events['traceEvents'] if isinstance(events, dict) else events
    lanes = {}
    for e in events:
        if e.get('ph') == 'X' and e.get('args', {}).get('op') in ('F', 'I', 'W', 'B'):
            key = (e.get('pid'), e.get('tid'))
            s, t = e['ts'] / 1e6, (e['ts'] + e['dur']) / 1e6
            lo, hi = lanes.get(key, (s, t))
            lanes[key] = (min(lo, s), max(hi, t))
    span = max(hi - lo for lo, hi in lanes.values())
    return result['makespan'], span, max(result['peak_activations'])


def auto(pf, tmp, p, m, costs, limit, objective):
    tag = os.path.basename(costs)[:-5]
    out = os.path.join(tmp, f'auto_{tag}_{m}_{limit}_{objective}.json')
    subprocess.run([pf, 'schedule', '--schedule', 'auto', '--ranks', str(p), '--microbatches', str(m),
                    '--chunks', '2', '--placement', 'vshape', '--costs', costs,
                    '--max-in-flight', str(limit), '--objective', objective,
                    '--format', 'json', '--out', out], capture_output=True, text=True, check=True)
    solver = json.load(open(out))['solver']
    return solver['value'], solver['origin']


def one(args, case):
    pf, tmp, zbv, zbv_greedy = args
    p, m, name, fiw, transfer = case
    f, b, w = fiw[0] / 2, fiw[1] / 2, fiw[2] / 2
    lat = round(transfer * fiw[0], 6)
    tag = f'{p}_{m}_{name}_{transfer}'
    costs = os.path.join(tmp, f'c_{tag}.json')
    stage = {'forward': f, 'backward_input': b, 'backward_weight': w, 'activation_bytes': 0, 'parameter_bytes': 0}
    json.dump({'stages': [stage] * (2 * p), 'overlap_share': 1,
               'transfer': {'latency': lat, 'bandwidth': None}}, open(costs, 'w'))
    theirs = []
    for label, limit in (('ZB-V, 1F1B memory', p), ('ZB-V, twice that', 2 * p)):
        best = None
        for mem, max_mem in (((1, 0, -1), 2 * limit), ((2, -1, -1), 4 * limit)):
            graph = zbv.PipelineGraph(p, m, f, b, w, lat, *mem, max_mem)
            runs = []
            for fill_b in (True, False):
                for fill_f in (True, False):
                    try:
                        s, _, bubble = graph.try_v_schedule(fill_b=fill_b, fill_f=fill_f)
                    except AssertionError:
                        continue
                    runs.append((bubble, len(runs), s))
            if not runs:
                continue
            sched = min(runs)[2]
            path = os.path.join(tmp, f'zbv_{limit}_{tag}_{mem[0]}.csv')
            open(path, 'w').write(csv_zbv(sched, p))
            makespan, span, peak = simulate(pf, path, costs)
            if peak > limit + 1e-9:
                continue
            got = {'makespan': makespan, 'span': span}
            best = got if best is None else {k: min(best[k], got[k]) for k in got}
        if best:
            theirs.append((label, limit, best))
    for label, config in (('V-Half, its own peak', 'half'), ('V-Min, its own peak', 'min')):
        graph = zbv_greedy.PipelineGraph(p, m, config, f, b, w, lat)
        pattern = {'half': graph.stable_pattern_v_half, 'min': graph.stable_pattern_v_min}[config](p)
        cost = [graph.fbw_cost[x // 2] for x in range(6)]
        order = graph.schedule_from_pattern(pattern, m, cost)[2]
        path = os.path.join(tmp, f'{config}_{tag}.csv')
        open(path, 'w').write(csv_pattern(order, p))
        makespan, span, peak = simulate(pf, path, costs)
        theirs.append((label, peak, {'makespan': makespan, 'span': span}))
    rows = []
    for label, limit, values in theirs:
        for objective in ('makespan', 'span'):
            value, origin = auto(pf, tmp, p, m, costs, limit, objective)
            rows.append({'P': p, 'M': m, 'ratio': name, 'transfer': transfer, 'theirs': label, 'limit': limit,
                         'objective': objective, 'their_value': values[objective], 'auto': value,
                         'origin': origin})
    return rows


def main():
    argv = sys.argv[1:]
    jobs, ranks = 2, (4, 8, 16)
    if '--jobs' in argv:
        i = argv.index('--jobs')
        jobs = int(argv[i + 1])
        del argv[i:i + 2]
    if '--ranks' in argv:
        i = argv.index('--ranks')
        ranks = tuple(int(x) for x in argv[i + 1].split(','))
        del argv[i:i + 2]
    if len(argv) != 3:
        sys.exit(__doc__)
    pf, checkout, out = argv
    zbv, zbv_greedy = load_theirs(checkout)
    tmp = tempfile.mkdtemp()
    cases = [(p, m, name, fiw, t) for p in ranks for m in (p, 2 * p, 4 * p)
             for name, fiw in RATIOS.items() for t in (0.0, 0.1)]
    with ThreadPoolExecutor(jobs) as ex:
        rows = [r for rs in ex.map(lambda c: one((pf, tmp, zbv, zbv_greedy), c), cases) for r in rs]
    json.dump(rows, open(out, 'w'), indent=1)
    groups = defaultdict(list)
    for r in rows:
        groups[(r['theirs'], r['objective'])].append(r)
    print("| authors' schedule | objective | cases | auto worse | largest loss | mean auto / theirs |")
    print('| --- | --- | --- | --- | --- | --- |')
    for (label, objective), rs in groups.items():
        worse = [r for r in rs if r['auto'] > r['their_value'] * (1 + 1e-9)]
        loss = max((r['auto'] / r['their_value'] - 1 for r in worse), default=0.0)
        mean = sum(r['auto'] / r['their_value'] for r in rs) / len(rs)
        print(f'| {label} | {objective} | {len(rs)} | {len(worse)} | {loss:.2%} | {mean:.4f} |')


if __name__ == '__main__':
    main()
