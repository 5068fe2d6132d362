import numpy as np, time
keep = []; ts = []
for i in range(14):
    t = time.perf_counter(); a = np.empty(16 << 20, np.float32); a.fill(1.0); ts.append(time.perf_counter() - t); keep.append(a)
cs = []
for i in range(0, 14, 2):
    a, b = keep[i], keep[i + 1]; r = []
    for _ in range(7):
        t = time.perf_counter(); np.copyto(b, a); r.append(time.perf_counter() - t)
    r.sort(); cs.append(r[3])
print("touch", " ".join("%.0f" % (t * 1e3) for t in ts), "| copy pairs", " ".join("%.1f" % (t * 1e3) for t in cs), flush=True)
