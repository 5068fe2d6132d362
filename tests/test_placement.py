"""Two ranks that the scheduler keeps on one CPU while a third program keeps the other CPU busy
(moving either rank would not even out the load, so it never does): the native engine's wait
moves the higher rank to another CPU it may run on (fastcoll/engine/csrc/core/fc_wait.c, step_aside),
else every exchange costs two context switches (bench/NOTES.md 53). Over shared memory and over
verbs links on the test fabric (a peer on this host: the link header says the sender's CPU,
bench/NOTES.md 97)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import assert_ok, fabric_missing
from engines import native_missing

BUSY = "import os\nos.sched_setaffinity(0, {1})\nwhile True: pass\n"


def placement_unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "CPU placement is a Linux scheduler matter"
    if not {0, 1} <= os.sched_getaffinity(0):
        return "needs CPUs 0 and 1"
    return native_missing()


@pytest.mark.skipif(placement_unavailable() is not None, reason=f"{placement_unavailable()}")
@pytest.mark.parametrize("transport", ["shm", "rdma"])
def test_two_ranks_on_one_cpu_beside_a_busy_one_move_apart(launch, transport):
    if transport == "rdma" and fabric_missing():
        pytest.skip(f"over verbs links: {fabric_missing()}")
    busy = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    try:
        results = launch(2, "placement_worker.py", transport=transport, FASTCOLL_NATIVE="1").wait(timeout=120)
    finally:
        busy.kill()
        busy.wait()
    assert_ok(results)
    out = results[0].out
    assert "; native engine" in out, out
    assert ("rdma (verbs" in out) == (transport == "rdma"), out
    colocated = float(next(line for line in out.splitlines() if line.startswith("COLOCATED")).split()[1])
    assert colocated <= 0.5, f"the ranks shared one CPU in {colocated:.0%} of the late samples"
