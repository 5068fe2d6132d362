"""Pairwise exchange for large all_to_all: n - 1 steps; at step s rank r sends its block for
rank r + s and receives the block of rank r - s (mod n), in pieces of `Call.piece_bytes`.

Every step pairs each rank with one sender and one receiver (a permutation, as each step of the
ring is), so no link carries two blocks at once and a rank holds at most one block's pieces in
flight per step; the direct exchange instead hands every block to the transport at once. The
messages are the same as `direct.all_to_all`'s (each block in pieces, numbered from 0), so ranks
may choose differently and still interoperate: all_to_all_v's buffers differ by rank.
"""

from __future__ import annotations

import numpy as np

from fastcoll.algorithms import Call, pieces


def all_to_all(call: Call, src: np.ndarray, out: np.ndarray, send_bounds: list[tuple[int, int]],
               recv_bounds: list[tuple[int, int]]) -> None:
    """src[send_bounds[j]] goes to rank j; out[recv_bounds[i]] receives rank i's block."""
    n, r = call.size, call.rank
    step = call.piece_items(src.itemsize)
    a, b = send_bounds[r]
    ra, rb = recv_bounds[r]
    out[ra:rb] = src[a:b]
    for s in range(1, n):
        dst, frm = (r + s) % n, (r - s) % n
        outgoing = pieces(*send_bounds[dst], step)
        incoming = pieces(*recv_bounds[frm], step)
        # Interleaved, so that a piece is on its way while the next one is received.
        for k in range(max(len(outgoing), len(incoming))):
            if k < len(outgoing):
                pa, pb = outgoing[k]
                call.send(dst, k, src[pa:pb])
            if k < len(incoming):
                pa, pb = incoming[k]
                call.recv(frm, k, out[pa:pb])
    call.flush()
