"""Loopback TCP throughput of a 64 MiB transfer with the kernel's autotuned socket buffers and
with SO_SNDBUF/SO_RCVBUF fixed at 4 MiB (which turns autotuning off).

    python bench/ab/loopback_bw.py
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "micro"))  # pair.py lives there
from pair import connect_pair, run_pair  # noqa: E402

N = 64 << 20


def side(server: bool, port, bufsize: int, out) -> None:
    s = connect_pair(server, port)
    if bufsize:
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            s.setsockopt(socket.SOL_SOCKET, opt, bufsize)
    data = np.ones(N // 4, np.float32)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        if server:
            s.sendall(memoryview(data))
            s.recv(1)
        else:
            mv, n = memoryview(data).cast("B"), 0
            while n < N:
                n += s.recv_into(mv[n:])
            s.sendall(b"k")
        times.append(time.perf_counter() - t)
    if server:
        out.put(N / np.median(times[1:]) / 1e9)


if __name__ == "__main__":
    for bufsize in (0, 4 << 20, 0, 4 << 20):
        label = "autotuned buffers" if bufsize == 0 else "SO_SNDBUF/SO_RCVBUF = 4 MiB"
        print(f"64 MiB one way, {label}: {run_pair(side, bufsize):.2f} GB/s (median of 4)")
