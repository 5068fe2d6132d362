"""Direct exchange: one hop from every rank to every other. Latency-optimal for small messages.

Reductions combine the ranks' contributions in rank order on every rank, so every rank gets the
same bits.
"""

from __future__ import annotations

import numpy as np

from fastcoll.algorithms import Call, pieces
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


# ----- all_to_all and the rooted collectives (one hop; every block in pieces of piece_bytes) -----


def all_to_all(call: Call, src: np.ndarray, out: np.ndarray, send_bounds: list[tuple[int, int]],
               recv_bounds: list[tuple[int, int]]) -> None:
    """src[send_bounds[j]] goes to rank j; out[recv_bounds[i]] receives rank i's block for this
    rank. Every block to every peer is sent first, then every block is received.

    The messages are the ones `pairwise.all_to_all` sends (each block in pieces of
    `piece_bytes`, numbered from 0), so two ranks may choose differently (all_to_all_v's
    buffers differ by rank) and still interoperate."""
    r = call.rank
    step = call.piece_items(src.itemsize)
    a, b = send_bounds[r]
    ra, rb = recv_bounds[r]
    out[ra:rb] = src[a:b]
    for p in _peers(call):
        for k, (pa, pb) in enumerate(pieces(*send_bounds[p], step)):
            call.send(p, k, src[pa:pb])
    for p in _peers(call):
        for k, (pa, pb) in enumerate(pieces(*recv_bounds[p], step)):
            call.recv(p, k, out[pa:pb])
    call.flush()


def gather(call: Call, out: np.ndarray | None, src: np.ndarray, bounds: list[tuple[int, int]], root: int) -> None:
    """Every rank's src lands at bounds[rank] of root's out (out: None on the other ranks).

    One hop at every size: the root's link must carry every block once whatever the algorithm,
    so relaying through other ranks only adds hops."""
    step = call.piece_items(src.itemsize)
    if call.rank != root:
        for k, (a, b) in enumerate(pieces(0, src.size, step)):
            call.send(root, k, src[a:b])
        call.flush()
        return
    a, b = bounds[root]
    out[a:b] = src
    for p in _peers(call):
        for k, (pa, pb) in enumerate(pieces(*bounds[p], step)):
            call.recv(p, k, out[pa:pb])


def scatter(call: Call, src: np.ndarray | None, out: np.ndarray, bounds: list[tuple[int, int]], root: int) -> None:
    """Root's src[bounds[r]] lands in rank r's out (src: None on the other ranks). One hop."""
    step = call.piece_items(out.itemsize)
    if call.rank != root:
        for k, (a, b) in enumerate(pieces(0, out.size, step)):
            call.recv(root, k, out[a:b])
        return
    for p in _peers(call):
        for k, (pa, pb) in enumerate(pieces(*bounds[p], step)):
            call.send(p, k, src[pa:pb])
    a, b = bounds[root]
    out[...] = src[a:b]
    call.flush()


def reduce(call: Call, src: np.ndarray, buf: np.ndarray | None, root: int, reduce: Combine) -> None:
    """Root's buf becomes the reduction of every rank's src, combined in rank order (buf: None
    on the other ranks). For small buffers: each one goes to the root whole."""
    n = call.size
    if call.rank != root:
        call.send(root, 0, src)
        call.flush()
        return
    parts = np.empty((n,) + src.shape, dtype=src.dtype)
    for p in _peers(call):
        call.recv(p, 0, parts[p])
    parts[root] = src
    reduce(parts[0], parts[1], buf)
    for p in range(2, n):
        reduce(buf, parts[p], buf)


# ----- point to point (each buffer in pieces of piece_bytes, numbered from 0) -----


def send(call: Call, src: np.ndarray, peer: int) -> None:
    """src (flat) to `peer`, which receives it with `recv`; returns once it has left this rank."""
    for k, (a, b) in enumerate(pieces(0, src.size, call.piece_items(src.itemsize))):
        call.send(peer, k, src[a:b])
    call.flush()


def recv(call: Call, out: np.ndarray, peer: int) -> None:
    """out (flat) becomes what `peer` sent with `send`."""
    for k, (a, b) in enumerate(pieces(0, out.size, call.piece_items(out.itemsize))):
        call.recv(peer, k, out[a:b])
