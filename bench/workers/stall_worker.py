"""One rank of `bench/multihost.py outage` (started by fastcoll-launch): all-reduce 4 KiB every
10 ms for SECONDS, then rank 0 writes OUT: the longest all-reduce and when it began.

    stall_worker.py OUT SECONDS
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import fastcoll

if __name__ == "__main__":
    out, seconds = sys.argv[1], float(sys.argv[2])
    g = fastcoll.init()
    x = np.ones(1024, np.float32)
    fastcoll.barrier()
    print("ready", flush=True)
    longest, longest_at, calls, end = 0.0, time.time(), 0, time.monotonic() + seconds
    while True:
        x[1] = 1.0 if time.monotonic() >= end else 0.0  # every rank stops after the same call
        began, t0 = time.time(), time.perf_counter()
        y = fastcoll.all_reduce(x)
        took = time.perf_counter() - t0
        assert y[0] == g.size()
        if y[1] > 0:
            break
        calls += 1
        if took > longest:
            longest, longest_at = took, began
        time.sleep(0.01)
    fastcoll.barrier()
    if g.rank() == 0:
        with open(out, "w") as f:
            json.dump({"longest_s": longest, "longest_at": longest_at, "calls": calls}, f)
    fastcoll.finalize()
