"""series.py for mpi4py over MPICH: the same windows, the same file."""
import os, time
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
x = np.ones(1, np.float32); y = np.empty_like(x)
n = int(os.environ.get("N", "500"))
rows = []
for w in range(int(os.environ.get("W", "30"))):
    ts = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter(); c.Allreduce(x, y); ts[i] = time.perf_counter() - t0
    rows.append(np.median(ts) * 1e6)
if c.rank == 0:
    open(os.environ["SERIES_OUT"], "a").write("mpi " + " ".join(f"{m:.0f}" for m in rows) + "\n")
