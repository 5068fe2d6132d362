"""One rank of a job that strangers connect to (tests/test_strangers.py).

    fault_stranger.py DIR PHASE[,PHASE...] OPS SIZE

After init it prints `READY <rank> <pid> <init seconds>`. Then, for each phase, every rank
waits for the file DIR/go.PHASE, and runs OPS all-reduces of SIZE int32 elements, timing each
and checking every result exactly; it writes DIR/done.PHASE.RANK holding the median and 90th
percentile latency in seconds and its resident size in KiB. Warnings (the listeners' refusals)
go to stderr.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import sys
import time

import numpy as np

import fastcoll

faulthandler.dump_traceback_later(120, exit=True)
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> int:
    folder, phases, ops, size = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
    start = time.monotonic()
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    print("READY", r, os.getpid(), f"{time.monotonic() - start:.4f}", flush=True)
    base = np.arange(size, dtype=np.int32)
    for phase in phases:
        go = os.path.join(folder, f"go.{phase}")
        while not os.path.exists(go):
            time.sleep(0.005)
        fastcoll.barrier()
        times = []
        for i in range(ops):
            x = base * (r + 1) + i
            t = time.perf_counter()
            y = fastcoll.all_reduce(x)
            times.append(time.perf_counter() - t)
            want = base * (n * (n + 1) // 2) + n * i
            if not np.array_equal(y, want):
                print(f"WRONG result in phase {phase} op {i}", flush=True)
                return 1
        times.sort()
        done = {"median": times[len(times) // 2], "p90": times[int(len(times) * 0.9)], "rss_kib": rss_kib()}
        path = os.path.join(folder, f"done.{phase}.{r}")
        with open(path + ".tmp", "w") as f:
            json.dump(done, f)
        os.rename(path + ".tmp", path)
    fastcoll.barrier()
    fastcoll.finalize()
    print("OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
