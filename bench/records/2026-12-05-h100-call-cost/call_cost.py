"""What a gated all_sum costs the thread that builds the graph (NOTES 82): under
    fastcoll-launch -n 2 python3 -m fastcoll.mlx_compat call_cost.py [--profile]
each rank builds chains of 64 dependent all_sums of a (1, 1, 4096) bfloat16 row (a decode
step's shape), timing the building apart from the evaluation, beside the same chain of adds and
of fastcoll.all_reduce called directly (no mx.custom_function around it)."""
import cProfile
import io
import pstats
import statistics
import sys
import time

import mlx.core as mx

N, REPS = 64, 30
group = mx.distributed.init(strict=True)
x = (mx.random.normal((1, 1, 4096)) * 0.01).astype(mx.bfloat16)
mx.eval(x)
half = mx.array(0.5, dtype=mx.bfloat16)


def chain(step):
    y = x
    t0 = time.perf_counter()
    for _ in range(N):
        y = step(y) * half
    t1 = time.perf_counter()
    mx.eval(y)
    return (t1 - t0) * 1e6 / N, (time.perf_counter() - t1) * 1e3


def run(name, step):
    for _ in range(3):
        chain(step)
    res = [chain(step) for _ in range(REPS)]
    build = statistics.median(b for b, _ in res)
    ev = statistics.median(e for _, e in res)
    print(f"COST rank={group.rank()} {name}: build {build:.1f} us a call, eval {ev:.3f} ms a chain of {N}",
          flush=True)


import fastcoll  # noqa: E402

fc_group = group.fastcoll_group
for _ in range(2):
    run("add", lambda y: y + 1)
    run("all_sum", lambda y: mx.distributed.all_sum(y, group=group))
    run("fastcoll.all_reduce", lambda y: fastcoll.all_reduce(y, "sum", group=fc_group))
if "--profile" in sys.argv:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(10):
        chain(lambda y: mx.distributed.all_sum(y, group=group))
    prof.disable()
    if group.rank() == 0:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue(), flush=True)
mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))
