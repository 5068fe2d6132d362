"""One rank of tests/test_waits_long.py: rank 1 works (sleeps) 40 ms before each of 12 all_reduces,
so rank 0's every wait idles about that long; rank 0 prints `CPU <seconds>`, the CPU time its
process took over those calls, which is the yields it spent waiting."""

from __future__ import annotations

import os
import time

import numpy as np

import fastcoll

g = fastcoll.init()
print("ENGINE", g.transport_info(), flush=True)
x = np.ones(4, np.float32)
fastcoll.all_reduce(x)  # the links warm
start = os.times()
for _ in range(12):
    if g.rank() == 1:
        time.sleep(0.04)
    y = fastcoll.all_reduce(x)
    assert float(y[0]) == 2.0, y
took = os.times()
if g.rank() == 0:
    print("CPU", (took.user + took.system) - (start.user + start.system), flush=True)
fastcoll.finalize()
