"""Median latency of small all-reduces (4 B, 4 KiB, 64 KiB), one rank of a job.

    for r in 0 1; do FASTCOLL_RANK=$r FASTCOLL_WORLD_SIZE=2 FASTCOLL_COORDINATOR=127.0.0.1:29600 \
        FASTCOLL_TOKEN=t python bench/ab/small_latency.py & done; wait
(or: fastcoll-launch -n 2 python bench/ab/small_latency.py)
"""

import time

import numpy as np

import fastcoll

g = fastcoll.init(); r = g.rank()
out = []
for n in (1, 1024, 16384):
    x = np.ones(n, np.float32)
    for _ in range(200): fastcoll.all_reduce(x)
    ts = []
    for _ in range(2000):
        t = time.perf_counter(); fastcoll.all_reduce(x); ts.append(time.perf_counter() - t)
    out.append("%dB %.1f" % (n * 4, np.median(ts) * 1e6))
if r == 0: print(" | ".join(out))
fastcoll.finalize()
