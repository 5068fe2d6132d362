"""What a thread hand-off costs next to the exchange itself: two processes swap 4 KiB over a
loopback TCP socket, first directly, then with each exchange handed to a service thread and
back (queue + event), as a naive service-thread design would.

    python bench/ab/handoff.py
"""

from __future__ import annotations

import queue
import socket
import threading
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "micro"))  # pair.py lives there
from pair import connect_pair, run_pair  # noqa: E402

N = 3000


def side(server: bool, port, out) -> None:
    s = connect_pair(server, port)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg, buf = b"x" * 4096, bytearray(4096)

    def exchange() -> None:
        s.sendall(msg)
        n = 0
        while n < 4096:
            n += s.recv_into(memoryview(buf)[n:])

    direct = []
    for _ in range(N):
        t = time.perf_counter()
        exchange()
        direct.append(time.perf_counter() - t)
    q: queue.SimpleQueue = queue.SimpleQueue()

    def service() -> None:
        while True:
            fn, done = q.get()
            fn()
            done.set()

    threading.Thread(target=service, daemon=True).start()
    handed = []
    for _ in range(N):
        t = time.perf_counter()
        done = threading.Event()
        q.put((exchange, done))
        done.wait()
        handed.append(time.perf_counter() - t)
    if server:
        out.put((np.median(direct) * 1e6, np.median(handed) * 1e6))


if __name__ == "__main__":
    d, h = run_pair(side)
    print(f"4 KiB exchange on loopback, median of {N}: direct {d:.1f} us; through a service thread {h:.1f} us")
