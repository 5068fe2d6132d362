"""fastcoll.all_reduce's own Python a gated call, on the CPU (NOTES 82): each rank's device played
by the test's simulated one (tests/gate_sim.py), whose launch is timed and taken out.
    FASTCOLL_FAST_SYNC=1 python -m fastcoll.launch -n 2 python lane.py"""
import os
import statistics
import sys
import time

import mlx.core as mx

import fastcoll
from fastcoll import testhooks
from fastcoll.gate import Gate
from fastcoll.gate.layout import ControlLayout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
from gate_sim import SimDevice  # noqa: E402

N = 64
spent = [0.0]


class TimedDevice(SimDevice):
    def launch(self, *args):
        t0 = time.perf_counter()
        try:
            return super().launch(*args)
        finally:
            spent[0] += time.perf_counter() - t0


testhooks.set_gate_factory(lambda c: Gate(TimedDevice(ControlLayout(c.gate_max_bytes, c.world_size)), c))
g = fastcoll.init()
x = mx.ones((1, 1, 1024), dtype=mx.bfloat16)
mx.eval(x)
res = []
for _ in range(40):
    spent[0] = 0.0
    t0 = time.perf_counter()
    outs = [fastcoll.all_reduce(x, "sum", group=g) for _ in range(N)]
    t1 = time.perf_counter()
    for o in outs:
        o.wait(20)
    res.append(((t1 - t0) - spent[0]) * 1e6 / N)
print(f"LANE rank={g.rank()} fastcoll us a call (launch excluded): median {statistics.median(res[5:]):.2f} "
      f"min {min(res[5:]):.2f}", flush=True)
fastcoll.finalize()
