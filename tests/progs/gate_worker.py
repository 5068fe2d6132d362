"""One rank of tests/test_gate_ranks.py: the fence gate's host mode across real rank processes,
each rank's device played by a thread (tests/gate_sim.py), on the engine FASTCOLL_NATIVE
names (the native one serves the host half in C, the Python one on its service thread).

    gate_worker.py many      300 gated all-reduces of every gated dtype and op, of several
                             sizes, between host-path collectives; every result checked exactly
    gate_worker.py kill      rank 1 dies between two gates; rank 0's next gate is released with
                             an error status (its device never left waiting) and check() raises
    gate_worker.py kill late the same, with the recording of rank 0's error held up 0.5 s (the
                             test hook gate-failed): check() right after the release still raises
    gate_worker.py exit      a gate whose device never arrives (the stream held: its result is
                             never evaluated) is pending when main() returns without finalize()

Prints ENGINE <transport_info>, then OK <gates> or, for kill on rank 0, RELEASED <status>
<seconds> and ERROR <class>.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import mlx.core as mx
import numpy as np

import fastcoll
from fastcoll import dtypes, testhooks
from fastcoll.gate import Gate
from fastcoll.gate.protocol import layout as L
from fastcoll.gate.protocol.layout import ControlLayout

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for the test double
from gate_sim import SimDevice  # noqa: E402

DEVICES: list[SimDevice] = []


def make_gate(c):
    DEVICES.append(SimDevice(ControlLayout(c.gate_max_bytes, c.world_size)))
    return Gate(DEVICES[-1], c)


testhooks.set_gate_factory(make_gate)
SCENARIO = sys.argv[1]
g = fastcoll.init()
r, n = g.rank(), g.size()
print("ENGINE", g.transport_info(), flush=True)
KINDS = [(mx.float32, "float32"), (mx.float16, "float16"), (mx.bfloat16, "bfloat16")]


def gated(x: mx.array, op: str, i: int = 0) -> np.ndarray:
    """A gated all_reduce's bytes, as the simulated device leaves them, in the host dtype. Most
    calls take the planned submit; every tenth passes a timeout and one runs on another thread,
    which take the general one, in the same sequence of calls."""
    if i % 10 == 3:
        result = fastcoll.all_reduce(x, op=op, timeout=30)
    elif i == 100:
        box = []
        mx.eval(x)  # (MLX's streams belong to the thread that made them)

        def call() -> None:
            box.append(fastcoll.all_reduce(x, op=op))

        side = threading.Thread(target=call, name="side")
        side.start()
        side.join()
        result = box[0]
    else:
        result = fastcoll.all_reduce(x, op=op)
    return result.wait(20).value(dtypes.host_dtype(x.dtype.__str__().rsplit(".", 1)[-1]))


def expected(values: np.ndarray, name: str, op: str) -> np.ndarray:
    """What every rank must get: the host path's own reduction of every rank's values."""
    host = dtypes.host_dtype(name)
    parts = [np.asarray(mx.array(values * (p + 1)).astype(getattr(mx, name)).view(
        mx.uint16 if name == "bfloat16" else getattr(mx, name))).view(host) for p in range(n)]
    combine = dtypes.reducer(name, op)
    acc = parts[0].copy()
    for p in parts[1:]:
        combine(acc, p, acc)
    if op == "mean":
        dtypes.finish_mean(name, acc, n)
    return acc


def many() -> int:
    count = 0
    for i in range(300):
        mx_dtype, name = KINDS[i % 3]
        op = ("sum", "max", "min", "mean", "prod")[i % 5]
        size = (64, 256, 1024)[i % 3]
        values = (np.arange(size, dtype=np.float32) % 7) + i % 3
        x = mx.array(values * (r + 1)).astype(mx_dtype)
        got = gated(x, op, i)
        want = expected(values, name, op)
        assert got.tobytes() == want.tobytes(), (i, name, op, size, got[:4], want[:4])
        count += 1
        if i % 50 == 0:  # the host path between gates, in the same sequence of calls
            y = fastcoll.all_reduce(np.full(8, r, np.float32))
            assert np.array_equal(y, np.full(8, sum(range(n)), np.float32))
    fastcoll.check()
    print("OK", count, flush=True)
    return 0


def kill() -> int:
    if sys.argv[2:] == ["late"]:  # the error is recorded well after the exchange failed
        testhooks.set_hook(lambda point: time.sleep(0.5) if point == "gate-failed" else None)
    x = mx.ones(256, dtype=mx.float32)
    for _ in range(5):
        gated(x, "sum")
    fastcoll.barrier()
    if r == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)  # rank 1 is gone when rank 0 gates again
    start = time.monotonic()
    result = fastcoll.all_reduce(x).wait(20)  # released, never left waiting
    print("RELEASED", L.STATUS_NAMES[result.status], f"{time.monotonic() - start:.3f}", flush=True)
    try:
        fastcoll.check()
    except fastcoll.FastcollError as e:
        print("ERROR", type(e).__name__, flush=True)
    fastcoll.finalize()
    return 0


def exit_pending() -> int:
    x = mx.ones(256, dtype=mx.float32)
    gated(x, "sum")
    DEVICES[0].hold()  # the next gate's "kernel" never runs: its arrival never comes
    fastcoll.all_reduce(x)
    time.sleep(0.3)  # its host half is waiting for the arrival now (on the Python engine's thread)
    print("PENDING", flush=True)
    return 0


sys.exit({"many": many, "kill": kill, "exit": exit_pending}[SCENARIO]())
