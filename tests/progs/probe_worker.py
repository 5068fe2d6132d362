"""One rank of tests/test_doubling_probe.py: a job whose ranks each claim a host of their own
(the rendezvous table's host id, patched here, so four local ranks look like four hosts joined by
TCP), with the test hook delaying one algorithm's timed probe calls. Prints what the group chose
for small all_reduces, a split's choice, how many probe calls passed the hook, and checks one
all_reduce exactly.

    probe_worker.py DELAYED    DELAYED: doubling, direct or none (the algorithm slowed by 2 ms)
    probe_worker.py die        the last rank exits in its first timed call: the others' init()
                               must raise, naming it, and print "init failed: ..."
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import fastcoll
from checks import check, run
from fastcoll import engine, testhooks
from fastcoll.errors import FastcollError

DELAY_S = 0.002


def main() -> None:
    delayed = sys.argv[1]
    rank = int(os.environ["FASTCOLL_RANK"])
    engine.host_id = lambda: f"probehost{rank}"  # every rank a host of its own
    seen = {"doubling": 0, "direct": 0}

    def hook(point: str) -> None:
        name = point.partition(":")[2]
        if point.startswith("probe:"):
            seen[name] += 1
            if name == delayed:
                time.sleep(DELAY_S)
            if delayed == "die" and rank == int(os.environ["FASTCOLL_WORLD_SIZE"]) - 1:
                os._exit(3)

    testhooks.set_hook(hook)
    if delayed == "die":
        try:
            fastcoll.init()
        except FastcollError as e:
            print(f"init failed: {type(e).__name__}: {e}", flush=True)
            return
        raise AssertionError("init() returned though a rank died during its timing")
    g = fastcoll.init()
    n = g.size()
    sub = g.split(0)  # the same ranks, the same hosts: it must choose as its parent
    y = fastcoll.all_reduce(np.arange(5, dtype=np.int64) + g.rank())
    check(np.array_equal(y, n * np.arange(5) + n * (n - 1) // 2), f"all_reduce after the probe: {y}")
    print(f"chose {g.choose('all_reduce', 4)} split {sub.choose('all_reduce', 4)} "
          f"timed {seen['doubling']} {seen['direct']}", flush=True)
    fastcoll.finalize()


if __name__ == "__main__":
    run(main)
