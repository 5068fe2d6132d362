import numpy as np, time, sys
src = np.ones(16 << 20, np.float32); dst = np.empty_like(src); ring = np.empty(1 << 19, np.float32)
P = 1 << 18  # 1 MiB pieces
def once():
    for off in range(0, src.size, P):
        r = (off // P) % 2
        np.copyto(ring[r*P:(r+1)*P], src[off:off+P]); np.add(dst[off:off+P], ring[r*P:(r+1)*P], out=dst[off:off+P])
ts = []
for i in range(10):
    t = time.perf_counter(); once(); ts.append(time.perf_counter() - t)
ts.sort(); print("%.1f" % (ts[5] * 1e3), end=" ", flush=True)
