"""The floor under a small collective in fastcoll's design: two Python processes swap a 24-byte
message (about a header's size) over one loopback TCP socket, with blocking reads and with up
to 10 non-blocking reads first, as fastcoll's TCP transport does; and through shared memory,
each spinning on a counter the other bumps after writing its message (what two ranks of one
host pay with FASTCOLL_SHM on, before any of fastcoll's own work).

    python bench/micro/floor.py
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time

import numpy as np
from pair import connect_pair, run_pair

N = 10000
SIZE = 24


def side(server: bool, port, spins: int, out) -> None:
    s = connect_pair(server, port)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg, view = b"x" * SIZE, memoryview(bytearray(SIZE))
    times = []
    for _ in range(N):
        t = time.perf_counter()
        s.sendall(msg)
        got, left = 0, spins
        while got < SIZE:
            if left:
                left -= 1
                try:
                    got += s.recv_into(view[got:], 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    pass
            else:
                got += s.recv_into(view[got:])
        times.append(time.perf_counter() - t)
    if server:
        out.put(np.median(times[N // 10 :]) * 1e6)


def shm_side(server: bool, port, shared, out) -> None:
    """Counters at words 0 and 16 (separate cache lines), messages at bytes 256 and 512."""
    del port
    view = memoryview(shared).cast("B")
    words = view.cast("q")
    me, peer = (0, 16) if server else (16, 0)
    mine, theirs = (256, 512) if server else (512, 256)
    msg, got = b"x" * SIZE, bytearray(SIZE)
    times = []
    for i in range(1, N + 1):
        t = time.perf_counter()
        view[mine : mine + SIZE] = msg
        words[me] = i  # x86 keeps stores in order; transport/shm.py fences where needed
        while words[peer] < i:
            pass
        got[:] = view[theirs : theirs + SIZE]
        times.append(time.perf_counter() - t)
    if server:
        out.put(np.median(times[N // 10 :]) * 1e6)


if __name__ == "__main__":
    for spins in (0, 10):
        median = run_pair(side, spins)
        how = "blocking reads" if spins == 0 else f"up to {spins} non-blocking reads first"
        print(f"{SIZE} B exchange on loopback, median of {N}: {median:.1f} us ({how})")
    median = run_pair(shm_side, mp.RawArray("b", 1024))
    print(f"{SIZE} B exchange through shared memory, median of {N}: {median:.1f} us (spinning on a counter)")
