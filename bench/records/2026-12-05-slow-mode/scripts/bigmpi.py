import time, statistics, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
x = np.ones(16 << 20, np.float32) * (c.rank + 1); y = np.empty_like(x)
ts = []
for i in range(12):
    c.Barrier(); t = time.perf_counter(); c.Allreduce(x, y); ts.append(time.perf_counter() - t)
if c.rank == 0: print("mpi %.1f ms (min %.1f)" % (statistics.median(ts) * 1e3, min(ts) * 1e3), flush=True)
