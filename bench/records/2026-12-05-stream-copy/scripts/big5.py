import time, os, statistics, numpy as np, fastcoll as fc
g = fc.init()
x = np.ones(int(os.environ["E"]), np.float32) * (g.rank() + 1)
ts = []
for i in range(int(os.environ.get("N", "30"))):
    fc.barrier()
    t = time.perf_counter(); y = fc.all_reduce(x); ts.append(time.perf_counter() - t)
if g.rank() == 0: print("%.2f" % (statistics.median(ts[3:]) * 1e3), flush=True)
fc.finalize()
