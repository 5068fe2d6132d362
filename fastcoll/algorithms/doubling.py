"""Recursive doubling (and halving) for a power-of-two number of ranks: log2(n) exchanges with
one partner each, where the direct exchange sends every buffer to all n - 1 peers.

With four ranks on two cores a small direct all-reduce cost ~590 us against ~470 us this way
(12 messages against 8; bench/NOTES.md, entry 12): every message costs a send system call and
a wake-up, and when ranks outnumber cores those, not the bytes, are the price.

Ranks are grouped in aligned blocks of size d = 1, 2, 4, ...; at each step a rank pairs with
rank ^ d, whose block is the other half of the next larger one. Contributions are always
combined lower block first, so every rank computes the same expression and gets the same bits.
"""

from __future__ import annotations

import numpy as np

from fastcoll.algorithms import Call
from fastcoll.dtypes import Combine


def applies(size: int) -> bool:
    """Whether these algorithms serve a group of `size` ranks (a power of two, more than 2)."""
    return size > 2 and size & (size - 1) == 0


def all_reduce(call: Call, src: np.ndarray, buf: np.ndarray, reduce: Combine) -> None:
    """buf (flat) becomes the reduction over all ranks of their src (flat, left unchanged)."""
    n, r = call.size, call.rank
    buf[...] = src
    theirs = np.empty_like(buf)
    d, step = 1, 0
    while d < n:
        p = r ^ d
        call.send(p, step, buf)
        call.recv(p, step, theirs)
        call.flush()  # buf is about to change: its send must have left
        reduce(buf, theirs, buf) if r < p else reduce(theirs, buf, buf)
        d, step = d << 1, step + 1


def _span(bounds: list[tuple[int, int]], first: int, count: int) -> tuple[int, int]:
    """The element range of blocks first .. first + count - 1 (contiguous, in rank order)."""
    return bounds[first][0], bounds[first + count - 1][1]


def all_gather(call: Call, out: np.ndarray, bounds: list[tuple[int, int]]) -> None:
    """out (flat) holds this rank's block at bounds[rank]; fill in everyone else's."""
    n, r = call.size, call.rank
    d, step = 1, 0
    while d < n:
        p = r ^ d
        a, b = _span(bounds, r & ~(d - 1), d)  # what this rank's block of d ranks has so far
        pa, pb = _span(bounds, p & ~(d - 1), d)
        call.send(p, step, out[a:b])
        call.recv(p, step, out[pa:pb])  # never overlaps what is being sent
        d, step = d << 1, step + 1
    call.flush()


def reduce_scatter(call: Call, buf: np.ndarray, bounds: list[tuple[int, int]], reduce: Combine) -> np.ndarray:
    """Return this rank's block of the reduction of every rank's `buf` (flat, left unchanged).

    Recursive halving: at each step a rank keeps the half of its range that holds its own
    block, sends the other half to its partner and adds the partner's copy of the kept half."""
    n, r = call.size, call.rank
    first = 0  # the first of the blocks this rank is still responsible for
    work, base = buf, 0  # work[i - base] holds the partial sums of element i
    d, step = n >> 1, 0
    while d:
        p = r ^ d
        keep = first if (r & d) == 0 else first + d
        give = first + d if keep == first else first
        ka, kb = _span(bounds, keep, d)
        ga, gb = _span(bounds, give, d)
        call.send(p, step, work[ga - base : gb - base])
        theirs = np.empty(kb - ka, dtype=buf.dtype)
        call.recv(p, step, theirs)
        call.flush()
        mine = work[ka - base : kb - base]
        kept = np.empty_like(theirs)
        reduce(mine, theirs, kept) if r < p else reduce(theirs, mine, kept)
        work, base, first = kept, ka, keep
        d, step = d >> 1, step + 1
    return work
