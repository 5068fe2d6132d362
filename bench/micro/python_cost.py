"""What a small collective costs in Python alone, with no other process to wait for.

1. A 2-rank all_reduce of 4 bytes on a Group whose transport is an in-process echo (a message
   sent is the next one received): the public call, its checks, the output array, the service
   bookkeeping and the algorithm, without any I/O.
2. One message sent and received through the real TCP transport code over a ShmLink pair in
   one process (framing, msgpack header, ring copies), without a second process or a wait.

    python bench/micro/python_cost.py
"""

from __future__ import annotations

import sys
import time
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import fastcoll  # noqa: E402
from fastcoll.config import Config  # noqa: E402
from fastcoll.engine.python import PythonEngine  # noqa: E402
from fastcoll.group import Group  # noqa: E402
from fastcoll.transport import shm, tcp  # noqa: E402
from fastcoll.transport.base import Transport, data_header  # noqa: E402


class Echo(Transport):
    """Rank 0 of two, whose peer sends back exactly what it was sent."""

    def __init__(self):
        super().__init__(0, 2)
        self.queue: list = []

    def send(self, peer, header, payload, deadline=None):
        self.queue.append((header, None if payload is None else bytes(payload)))

    def flush(self, deadline=None):
        pass

    def _next_header(self, peer, chunk, deadline, nbytes=0):
        self.current = self.queue.pop(0)
        return self.current[0]

    def _read_payload(self, peer, chunk, out, deadline=None):
        out[:] = self.current[1]

    def _send_abort(self, header):
        pass

    def close(self):
        pass


def best(fn, n: int) -> float:
    """Microseconds per call, the best of 5 runs of n calls."""
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def main() -> None:
    x = np.ones(1, np.float32)
    g = Group(Config(rank=0, world_size=2), PythonEngine(Echo()))
    print(f"all_reduce of 4 B, in-process echo transport: {best(lambda: fastcoll.all_reduce(x, group=g), 20000):.2f} us")

    if not shm.available():
        print("no shared memory on this platform: part 2 skipped")
        return
    a, b = shm.pair()
    t0 = tcp.TcpTransport(0, 2, {1: [a]}, 30.0)
    t1 = tcp.TcpTransport(1, 2, {0: [b]}, 30.0)
    out = np.empty(1, np.float32)
    src, dst = memoryview(x).cast("B"), memoryview(out).cast("B")
    sig = "all_reduce(sum,float32,(1,))"
    header = data_header(5, sig, 0, 4)

    def one_message() -> None:
        t0.send(1, header, src)
        t1.recv(0, 5, sig, 0, dst, time.monotonic() + 10)

    print(f"one 4 B message through the TCP transport over shared memory, send + receive: {best(one_message, 50000):.2f} us")
    print(f"the bare ring: ShmLink.sendmsg + recv_into of 34 bytes: "
          f"{best(lambda: (a.sendmsg([b'x' * 30, src]), b.recv_into(bytearray(64))), 50000):.2f} us")


if __name__ == "__main__":
    main()
