"""Where two ranks run beside a busy CPU (bench/NOTES.md 57): `python bench/placement.py` starts a
program spinning on CPU 1, then two ranks bound to CPU 0 that may then use CPUs 0 and 1; each
samples its CPU every 10th of 40,000 4 B all_reduces. Rank 0 prints how often both ran on one
CPU, the per-call median, mean and 90th percentile, and rank 1's CPU through the run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

import fastcoll

CALLS = 40_000
BUSY = "import os\nos.sched_setaffinity(0, {1})\nwhile True: pass\n"


def this_cpu() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def rank() -> None:
    os.sched_setaffinity(0, {0})
    g = fastcoll.init()
    fastcoll.barrier()
    os.sched_setaffinity(0, {0, 1})
    x = np.ones(1, np.float32)
    cpus, took = [], []
    for i in range(CALLS):
        start = time.perf_counter_ns()
        fastcoll.all_reduce(x)
        took.append(time.perf_counter_ns() - start)
        if i % 10 == 0:
            cpus.append(this_cpu())
    both = fastcoll.all_gather(np.asarray(cpus, np.int32)).reshape(2, -1)
    if g.rank() == 0:
        us = np.array(took) / 1000
        print(f"{g.transport_info()}\none CPU in {np.mean(both[0] == both[1]):.0%} of the samples; "
              f"median {np.median(us):.1f} us, mean {us.mean():.1f}, p90 {np.percentile(us, 90):.1f}\n"
              f"rank 1's CPU: {''.join(map(str, both[1][::40]))}")
    fastcoll.finalize()


def main() -> int:
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        return subprocess.call([sys.executable, "-m", "fastcoll.launch", "-n", "2", sys.executable,
                                os.path.abspath(__file__), "--rank"])
    finally:
        busy.kill()
        busy.wait()


if __name__ == "__main__":
    if "--rank" in sys.argv:
        rank()
    else:
        sys.exit(main())
