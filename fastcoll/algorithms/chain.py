"""A pipelined chain for large rooted reductions: root+1 -> root+2 -> ... -> root.

The buffer is cut into pieces of `Call.piece_bytes`; rank root+1 sends each piece to the next
rank, which combines it with its own and forwards it as soon as it is reduced, so sending,
receiving and reducing overlap as in the ring. Every link carries the buffer once (the direct
path makes the root receive it n - 1 times). Contributions are combined in chain order, starting
at root+1 and ending with the root's own; the root alone gets the result.
"""

from __future__ import annotations

import numpy as np

from fastcoll.algorithms import Call, pieces
from fastcoll.dtypes import Combine


def reduce(call: Call, src: np.ndarray, buf: np.ndarray | None, root: int, reduce: Combine) -> None:
    """Root's buf becomes the reduction of every rank's src (buf: None on the other ranks)."""
    n, r = call.size, call.rank
    pos = (r - root - 1) % n  # place in the chain: 0 starts it, n - 1 is the root
    prev, nxt = (r - 1) % n, (r + 1) % n
    step = call.piece_items(src.itemsize)
    if pos == 0:
        for k, (a, b) in enumerate(pieces(0, src.size, step)):
            call.send(nxt, k, src[a:b])
        call.flush()
        return
    # A piece sent on must stay unchanged until flush(): partial sums get a buffer of their own.
    acc = buf if r == root else np.empty_like(src)
    tmp = np.empty(min(step, max(src.size, 1)), dtype=src.dtype)
    for k, (a, b) in enumerate(pieces(0, src.size, step)):
        t = tmp[: b - a]
        call.recv(prev, k, t)
        reduce(t, src[a:b], acc[a:b])
        if r != root:
            call.send(nxt, k, acc[a:b])
    call.flush()
