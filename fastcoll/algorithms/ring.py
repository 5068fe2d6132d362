"""Ring algorithms, pipelined in pieces: bandwidth-optimal for large messages.

Each rank sends only to its right neighbour and receives only from its left one. Every block is
cut into pieces of `Call.piece_bytes`; a piece is forwarded as soon as it has been received (and
reduced), so that sending (sender thread), receiving (socket) and reducing (numpy, which releases
the GIL) overlap. Each block of a reduction is reduced along the ring exactly once and then copied,
so every rank ends with the same bits.
"""

from __future__ import annotations

import numpy as np

from fastcoll.algorithms import Call, blocks, pieces
from fastcoll.dtypes import Combine


class _Ring:
    """One rank's view of the ring. `src` holds this rank's contribution, `buf` the result;
    they may be the same array. Reading the contribution from `src` directly saves copying it
    into `buf` first (a 64 MiB memcpy per all-reduce)."""

    def __init__(self, call: Call, buf: np.ndarray, bounds: list[tuple[int, int]], src: np.ndarray | None = None):
        self.call = call
        self.buf = buf
        self.src = buf if src is None else src
        self.bounds = bounds
        self.piece = call.piece_items(buf.itemsize)
        self.n, self.r = call.size, call.rank
        self.right, self.left = (self.r + 1) % self.n, (self.r - 1) % self.n

    def pieces(self, block: int) -> list[tuple[int, int]]:
        return pieces(*self.bounds[block % len(self.bounds)], self.piece)

    def send(self, a: int, b: int, own: bool = False, data: np.ndarray | None = None) -> None:
        if data is None:
            data = (self.src if own else self.buf)[a:b]
        self.call.send(self.right, self.call.sent, data)
        self.call.sent += 1

    def recv(self, out: np.ndarray) -> None:
        self.call.recv(self.left, self.call.received, out)
        self.call.received += 1

    def reduce_scatter(self, reduce: Combine, forward_last: bool, place=None) -> None:
        """Afterwards block r of buf holds the full reduction of block r. With `place`, each
        piece reduced at step s goes to place(s, a, b) instead of buf[a:b] (reduce_scatter's
        1/n result and its scratch: its src is only read)."""
        tmp = np.empty(self.piece, dtype=self.src.dtype)
        for a, b in self.pieces(self.r - 1):
            self.send(a, b, own=True)
        for s in range(self.n - 1):
            last = s == self.n - 2
            for a, b in self.pieces(self.r - s - 2):
                t = tmp[: b - a]
                self.recv(t)
                dst = self.buf[a:b] if place is None else place(s, a, b)
                # Each block meets this rank's contribution exactly once, on its way round.
                reduce(t, self.src[a:b], dst)
                if not last or forward_last:
                    self.send(a, b, data=dst)

    def all_gather(self, send_own: bool) -> None:
        """Block r of buf is this rank's; afterwards every block is everyone's."""
        if send_own:
            for a, b in self.pieces(self.r):
                self.send(a, b)
        for s in range(self.n - 1):
            for a, b in self.pieces(self.r - s - 1):
                self.recv(self.buf[a:b])
                if s < self.n - 2:
                    self.send(a, b)


def all_reduce(call: Call, src: np.ndarray, buf: np.ndarray, reduce: Combine) -> None:
    """buf (flat) becomes the reduction over all ranks of their src (flat, left unchanged)."""
    ring = _Ring(call, buf, blocks(buf.size, call.size), src)
    ring.reduce_scatter(reduce, forward_last=True)
    ring.all_gather(send_own=False)
    call.flush()


def reduce_scatter(call: Call, src: np.ndarray, bounds: list[tuple[int, int]], reduce: Combine) -> np.ndarray:
    """Return this rank's block of the reduction of every rank's src (flat, left unchanged).

    It allocates the result (1/n of src), a piece to receive into and room for every partial sum
    it forwards ((n - 2)/n of src): a piece sent on must stay unchanged until it has left, and a
    rank that waited for that inside the ring would wait for its right neighbour to take its
    queued pieces while that neighbour waited the same way: nobody around the ring receiving."""
    r, n = call.rank, call.size
    lo, hi = bounds[r]
    out = np.empty(hi - lo, dtype=src.dtype)
    ring = _Ring(call, src, bounds, src)
    forwarded = [bounds[(r - s - 2) % n] for s in range(n - 2)]  # the blocks of steps 0 .. n - 3
    scratch = np.empty(sum(b - a for a, b in forwarded), dtype=src.dtype)
    used = [0]  # elements of scratch placed so far

    def place(s: int, a: int, b: int) -> np.ndarray:
        if s == n - 2:  # this rank's own block: the result
            return out[a - lo : b - lo]
        i = used[0]
        used[0] += b - a
        return scratch[i : i + b - a]

    ring.reduce_scatter(reduce, forward_last=False, place=place)
    call.flush()
    return out


def all_gather(call: Call, out: np.ndarray, bounds: list[tuple[int, int]]) -> None:
    """out (flat) holds this rank's block at bounds[rank]; fill in everyone else's."""
    ring = _Ring(call, out, bounds)
    ring.all_gather(send_own=True)
    call.flush()


def broadcast(call: Call, buf: np.ndarray, root: int) -> None:
    """Root's buf flows down the chain root, root+1, ...; each rank forwards pieces as they land."""
    n, r = call.size, call.rank
    ring = _Ring(call, buf, [(0, buf.size)])
    is_last = (r - root) % n == n - 1
    for a, b in ring.pieces(0):
        if r != root:
            ring.recv(buf[a:b])
        if not is_last:
            ring.send(a, b)
    call.flush()
