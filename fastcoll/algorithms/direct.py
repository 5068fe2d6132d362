"""Direct exchange: one hop from every rank to every other. Latency-optimal for small messages.

Reductions combine the ranks' contributions in rank order on every rank, so every rank gets the
same bits.
"""

from __future__ import annotations

import numpy as np

from fastcoll.algorithms import Call
from fastcoll.dtypes import Combine


def _peers(call: Call) -> list[int]:
    return [p for p in range(call.size) if p != call.rank]


def all_reduce(call: Call, src: np.ndarray, buf: np.ndarray, reduce: Combine) -> None:
    """buf (flat) becomes the reduction over all ranks of their src (flat, left unchanged)."""
    n, r = call.size, call.rank
    peers = _peers(call)
    for p in peers:
        call.send(p, 0, src)
    if n == 2:
        # The common case, without the stack of contributions: x0 op x1 on both ranks.
        call.recv(peers[0], 0, buf)
        call.flush()
        reduce(src, buf, buf) if r == 0 else reduce(buf, src, buf)
        return
    parts = np.empty((n,) + src.shape, dtype=src.dtype)
    for p in peers:
        call.recv(p, 0, parts[p])
    call.flush()
    parts[r] = src
    reduce(parts[0], parts[1], buf)
    for p in range(2, n):
        reduce(buf, parts[p], buf)


def all_gather(call: Call, out: np.ndarray, bounds: list[tuple[int, int]]) -> None:
    """out (flat) holds this rank's block at bounds[rank]; fill in everyone else's."""
    a, b = bounds[call.rank]
    for p in _peers(call):
        call.send(p, 0, out[a:b])
    for p in _peers(call):
        pa, pb = bounds[p]
        call.recv(p, 0, out[pa:pb])
    call.flush()


def reduce_scatter(call: Call, buf: np.ndarray, bounds: list[tuple[int, int]], reduce: Combine) -> np.ndarray:
    """Return this rank's block of the reduction of every rank's `buf` (flat)."""
    n, r = call.size, call.rank
    for p in _peers(call):
        pa, pb = bounds[p]
        call.send(p, 0, buf[pa:pb])
    a, b = bounds[r]
    parts = np.empty((n, b - a), dtype=buf.dtype)
    parts[r] = buf[a:b]
    for p in _peers(call):
        call.recv(p, 0, parts[p])
    call.flush()
    out = parts[0].copy()
    for p in range(1, n):
        reduce(out, parts[p], out)
    return out


def broadcast(call: Call, buf: np.ndarray, root: int) -> None:
    """buf (flat) on every rank becomes root's buf."""
    if call.rank == root:
        for p in _peers(call):
            call.send(p, 0, buf)
        call.flush()
    else:
        call.recv(root, 0, buf)


def barrier(call: Call) -> None:
    """Return once every rank has entered the barrier."""
    for p in _peers(call):
        call.send(p, 0, None)
    for p in _peers(call):
        call.recv(p, 0, None)
