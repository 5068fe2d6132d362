"""The pure-Python engine's schedules: one per collective, the simplest that is correct at every
size, so that the Python engine stays the reference the native engine is tested against.

Every exchange is direct (one hop from sender to receiver), every buffer travels in pieces of
`Call.piece_bytes` (a ZeroMQ message is bounded: wire.MAX_PIECE_BYTES; what a large reduction
folds, in pieces of 1/(n - 1) of that, since it holds one of every peer's at once), the messages between
two ranks are numbered from 0 in the order they are sent, and every reduced element is combined
in rank order, ((x0 op x1) op x2) ..., on whichever rank reduces it: the native engine's direct
exchange combines so too, and every rank gets the same bits. A rank sends all it can before it
receives and waits for its sends to leave (`flush`) only at the end, so no two ranks wait on
each other's full links. A rank that needs a message from each of several peers takes them in
the order they arrive (`Call.recv_first`), so that a peer's timeout notice never waits unread
behind that peer's data while the rank waits on another (fastcoll/diagnosis.py); what it folds,
it folds in rank order once all of a span is here, so the order of arrival changes no bit.

The tuned schedules (recursive doubling, the ring, the chain, the pairwise exchange) are the
native engine's alone (fastcoll/engine/csrc/algorithms/); of the algorithm an Op names, the
Python engine reads only whether an all_reduce is small (fastcoll/engine/python.py, `run_op`),
whose one round ZeroMQ jobs, which run here, need (docs/design.md, "What ZeroMQ jobs run").
"""

from __future__ import annotations

import numpy as np

from fastcoll.algorithms import Call, blocks, pieces
from fastcoll.dtypes import Combine

Bounds = list[tuple[int, int]]


class _Pairs:
    """This rank's messages of one call, numbered per peer in the order they go: a schedule
    of several exchanges (all_reduce's two) needs no numbering of its own."""

    def __init__(self, call: Call, itemsize: int):
        self.call = call
        self.step = call.piece_items(itemsize)
        # What a large fold sends in: it holds a piece of every peer's at once (`_fold`), in
        # all as much memory as one piece.
        self.fold_step = max(1, self.step // max(1, call.size - 1))
        self.sent = [0] * call.size
        self.got = [0] * call.size

    def peers(self) -> list[int]:
        return [p for p in range(self.call.size) if p != self.call.rank]

    def send(self, peer: int, data: np.ndarray, step: int = 0) -> None:
        """`data` (flat) to `peer`, in pieces (of `step` items, default the call's)."""
        for a, b in pieces(0, data.size, step or self.step):
            self.call.send(peer, self.sent[peer], data[a:b])
            self.sent[peer] += 1

    def recv(self, peer: int, out: np.ndarray) -> None:
        """`out` (flat) from `peer`, in the pieces `send` cut it into."""
        for a, b in pieces(0, out.size, self.step):
            self.call.recv(peer, self.got[peer], out[a:b])
            self.got[peer] += 1

    def recv_all(self, parts: dict[int, np.ndarray], step: int = 0) -> None:
        """`parts[peer]` (flat) from each peer, in the pieces `send` cut it into, taking the
        messages in the order they arrive: waiting on one peer, this rank leaves no other's
        message unread ahead of what that peer says next (a timeout's notice, which must stop
        this wait: fastcoll/diagnosis.py). Where each piece lands is fixed, so the order they
        come in changes no result."""
        left = {p: pieces(0, out.size, step or self.step) for p, out in parts.items()}
        while left:
            wanted = [(p, self.got[p], parts[p][ab[0][0]:ab[0][1]]) for p, ab in left.items()]
            p = wanted[self.call.recv_first(wanted)][0]
            self.got[p] += 1
            left[p] = left[p][1:]
            if not left[p]:
                del left[p]


def _fold(pairs: _Pairs, mine: np.ndarray, out: np.ndarray, combine: Combine, span: int) -> None:
    """out = every rank's contribution of len(out) elements combined in rank order, ((x0 op x1)
    op x2) ... (`mine` is this rank's; each peer sends its own in pieces), `span` elements at a
    time: every peer's part of a span is received as it comes (`_Pairs.recv_all`), then folded
    in rank order, so memory for a span of each peer's."""
    r, n = pairs.call.rank, pairs.call.size
    span = max(1, min(span, out.size))
    tmp = {p: np.empty(span, dtype=out.dtype) for p in range(n) if p != r}
    for a, b in pieces(0, out.size, span):
        parts = {p: t[: b - a] for p, t in tmp.items()}
        pairs.recv_all(parts, min(span, pairs.step))
        parts[r] = mine[a:b]
        acc = out[a:b]
        acc[...] = parts[0]
        for p in range(1, n):
            combine(acc, parts[p], acc)


def _reduce_scatter(pairs: _Pairs, src: np.ndarray, out: np.ndarray, bounds: Bounds, combine: Combine) -> None:
    for p in pairs.peers():
        pa, pb = bounds[p]
        pairs.send(p, src[pa:pb], pairs.fold_step)
    a, b = bounds[pairs.call.rank]
    _fold(pairs, src[a:b], out, combine, pairs.fold_step)


def _all_gather(pairs: _Pairs, out: np.ndarray, bounds: Bounds) -> None:
    a, b = bounds[pairs.call.rank]
    for p in pairs.peers():
        pairs.send(p, out[a:b])
    pairs.recv_all({p: out[bounds[p][0]:bounds[p][1]] for p in pairs.peers()})


def reduce_scatter(call: Call, src: np.ndarray, out: np.ndarray, bounds: Bounds, combine: Combine) -> None:
    """out becomes this rank's block (bounds[rank]) of the reduction of every rank's src (flat,
    left unchanged): every block goes straight to the rank that reduces it."""
    _reduce_scatter(_Pairs(call, src.itemsize), src, out, bounds, combine)
    call.flush()


def all_gather(call: Call, out: np.ndarray, bounds: Bounds) -> None:
    """out (flat) holds this rank's block at bounds[rank]; every peer's lands at its own."""
    _all_gather(_Pairs(call, out.itemsize), out, bounds)
    call.flush()


def all_reduce(call: Call, src: np.ndarray, buf: np.ndarray, combine: Combine, small: bool) -> None:
    """buf (flat) becomes the reduction over all ranks of their src (flat, left unchanged).

    A small call (`small`: select.py's rule calls it so) is one round: every rank sends its src
    to every peer and folds all of them in rank order, the fewest messages one after another
    (ZeroMQ jobs' small calls, which run here, cost a message each). A large one is a
    reduce_scatter into this rank's block of buf, then an all_gather of the blocks: each rank
    sends and receives 2(n - 1)/n of the buffer, as a ring does, not n - 1 times it."""
    if np.shares_memory(src, buf):  # buf is reduced into while src is still read and on its way
        src = src.copy()
    pairs = _Pairs(call, buf.itemsize)
    if small:
        for p in pairs.peers():
            pairs.send(p, src)
        _fold(pairs, src, buf, combine, buf.size)  # (a small call: every peer's whole src at once)
    else:
        bounds = blocks(buf.size, call.size)
        a, b = bounds[call.rank]
        _reduce_scatter(pairs, src, buf[a:b], bounds, combine)
        _all_gather(pairs, buf, bounds)
    call.flush()


def broadcast(call: Call, buf: np.ndarray, root: int) -> None:
    """buf (flat) on every rank becomes root's buf: the root sends it to every peer, a piece to
    each before the next piece to any, and waits for each round to leave before the next: so
    the root never runs ahead to one receiver while another has stopped taking data (ZeroMQ
    queues sends without bound), and every receiver of a stalled broadcast is still waiting on
    the root when its limit runs out, to hear its notice and answer (fastcoll/diagnosis.py)."""
    pairs = _Pairs(call, buf.itemsize)
    if call.rank == root:
        for a, b in pieces(0, buf.size, pairs.step):
            for p in pairs.peers():
                pairs.send(p, buf[a:b])
            call.flush()
    else:
        pairs.recv(root, buf)
    call.flush()


def reduce(call: Call, src: np.ndarray, buf: np.ndarray | None, root: int, combine: Combine) -> None:
    """Root's buf becomes the reduction of every rank's src, combined in rank order (buf: None
    on the other ranks): every rank sends its src to the root."""
    pairs = _Pairs(call, src.itemsize)
    if call.rank != root:
        pairs.send(root, src, pairs.fold_step)
    else:
        _fold(pairs, src, buf, combine, pairs.fold_step)
    call.flush()


def barrier(call: Call) -> None:
    """Return once every rank has entered the barrier: a header-only message to every peer."""
    peers = [p for p in range(call.size) if p != call.rank]
    for p in peers:
        call.send(p, 0, None)
    while peers:  # taken as they come, as _Pairs.recv_all takes data
        del peers[call.recv_first([(p, 0, None) for p in peers])]


def all_to_all(call: Call, src: np.ndarray, out: np.ndarray, send_bounds: Bounds, recv_bounds: Bounds) -> None:
    """src[send_bounds[j]] goes to rank j; out[recv_bounds[i]] receives rank i's block."""
    pairs = _Pairs(call, src.itemsize)
    a, b = send_bounds[call.rank]
    ra, rb = recv_bounds[call.rank]
    out[ra:rb] = src[a:b]
    for p in pairs.peers():
        pa, pb = send_bounds[p]
        pairs.send(p, src[pa:pb])
    pairs.recv_all({p: out[recv_bounds[p][0]:recv_bounds[p][1]] for p in pairs.peers()})
    call.flush()


def gather(call: Call, out: np.ndarray | None, src: np.ndarray, bounds: Bounds, root: int) -> None:
    """Every rank's src lands at bounds[rank] of root's out (out: None on the other ranks)."""
    pairs = _Pairs(call, src.itemsize)
    if call.rank != root:
        pairs.send(root, src)
    else:
        a, b = bounds[root]
        out[a:b] = src
        pairs.recv_all({p: out[bounds[p][0]:bounds[p][1]] for p in pairs.peers()})
    call.flush()


def scatter(call: Call, src: np.ndarray | None, out: np.ndarray, bounds: Bounds, root: int) -> None:
    """Root's src[bounds[r]] lands in rank r's out (src: None on the other ranks)."""
    pairs = _Pairs(call, out.itemsize)
    if call.rank != root:
        pairs.recv(root, out)
    else:
        for p in pairs.peers():
            pa, pb = bounds[p]
            pairs.send(p, src[pa:pb])
        a, b = bounds[root]
        out[...] = src[a:b]
    call.flush()


def send(call: Call, src: np.ndarray, peer: int) -> None:
    """src (flat) to `peer`, which receives it with `recv`; returns once it has left this rank."""
    _Pairs(call, src.itemsize).send(peer, src)
    call.flush()


def recv(call: Call, out: np.ndarray, peer: int) -> None:
    """out (flat) becomes what `peer` sent with `send`."""
    _Pairs(call, out.itemsize).recv(peer, out)
