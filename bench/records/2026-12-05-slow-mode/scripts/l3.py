import numpy as np, time
def med(f, k):
    ts = []
    for _ in range(k):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2]
bufs = [(np.ones(1 << 19, np.float32), np.empty(1 << 19, np.float32)) for _ in range(4)]  # 4 x 2 MiB pairs: 16 MiB
def l3():
    for a, b in bufs: np.copyto(b, a)
big = np.ones(16 << 20, np.float32); bigo = np.empty_like(big)
print("l3 %.2f ms/8MiB  dram %.1f ms/64MiB" % (med(l3, 60) * 1e3, med(lambda: np.copyto(bigo, big), 9) * 1e3))
