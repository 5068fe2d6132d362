"""4 B all_reduce timed in 30 windows of 500 calls from the job's first call; rank 0 appends each window's median (us) to $SERIES_OUT."""
import os, time
import numpy as np
import fastcoll
g = fastcoll.init()
x = np.ones(1, np.float32)
n = int(os.environ.get("N", "500"))
rows = []

for w in range(int(os.environ.get("W", "30"))):
    ts = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter(); fastcoll.all_reduce(x); ts[i] = time.perf_counter() - t0
    rows.append(np.median(ts) * 1e6)
if g.rank() == 0:
    open(os.environ["SERIES_OUT"], "a").write("fastcoll " + " ".join(f"{m:.0f}" for m in rows) + "\n")
fastcoll.finalize()
