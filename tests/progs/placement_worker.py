"""One rank of tests/test_placement.py: two ranks that start on one CPU (this process binds
itself to CPU 0 before init) and may then run on CPUs 0 and 1, while a busy program the test
pinned keeps CPU 1 busy. Each rank samples the CPU it runs on every 10th of 3000 small
all_reduces; rank 0 prints `COLOCATED <fraction>` of the samples of the last half in which both
ran on one CPU."""

from __future__ import annotations

import os

import numpy as np

import fastcoll


def this_cpu() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


os.sched_setaffinity(0, {0})
g = fastcoll.init()
print("ENGINE", g.transport_info(), flush=True)
fastcoll.barrier()
os.sched_setaffinity(0, {0, 1})
x = np.ones(1, np.float32)
cpus = []
for i in range(3000):
    fastcoll.all_reduce(x)
    if i % 10 == 0:
        cpus.append(this_cpu())
both = fastcoll.all_gather(np.asarray(cpus, np.int32)).reshape(2, -1)
late = both[:, both.shape[1] // 2:]
if g.rank() == 0:
    print("COLOCATED", float(np.mean(late[0] == late[1])), flush=True)
fastcoll.finalize()
