"""What a Python schedule sees of one collective (`Call`: the group's rank and size, and
`send`/`recv`/`flush` addressed by group rank), the block arithmetic every engine shares, the
pure-Python engine's schedules (`reference.py`, one per collective) and the rule that names the
native engine's algorithm for a call (`select.py`).

The tuned algorithms (direct, recursive doubling, the ring, the pairwise exchange, the chain)
are the native engine's alone (fastcoll/engine/csrc/algorithms/); the Python engine is the
reference they are tested against, and runs the simplest schedule that is correct at every size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fastcoll.dtypes import Combine
from fastcoll.errors import CollectiveTimeoutError
from fastcoll.transport.base import Transport, data_header
from fastcoll.wire import MAX_PIECE_BYTES, pair_signature


@dataclass(slots=True)  # (attribute reads and writes of a slot are the cheapest: every message makes a few)
class Call:
    """One collective as the service thread runs it: who, which one, and until when.

    `rank` and `size` are the group's; `ranks[r]` is the transport's rank of group rank r (a
    sub-group's members are a subset of the job's ranks)."""

    t: Transport
    seq: int
    sig: str
    deadline: float
    rank: int
    size: int
    ranks: Sequence[int]
    piece_bytes: int = 1 << 20  # the most a message carries (Config.piece_bytes)
    tracer: Any = None  # a fastcoll.trace.Tracer when FASTCOLL_TRACE is set
    owed: list[bool] | None = None  # per group rank: its agreement message is to be read (agree)
    expected: list[str] | None = None  # per group rank: the signature its agreement message must carry

    def agree(self, sends: Sequence[int] | None = None, receives: Sequence[int] | None = None) -> None:
        """Begin the call by telling every peer what this rank calls: a header-only message of
        the call's signature (with `sends`, the number of elements this rank sends each group
        rank, and each pair's own signature: wire.pair_signature). Every peer's is read, and must
        match (with `receives`, the elements this rank expects from each), before anything else
        from that peer and before the call returns (`agreed`): so a call in which some ranks
        only send (a broadcast's root) still learns of every rank that disagrees with it."""
        n, me, ranks = self.size, self.rank, self.ranks
        expected = [self.sig] * n
        for p in range(n):
            if p == me:
                continue
            if sends is not None:  # a pair's message reads the same from both ends when they agree
                expected[p] = pair_signature(self.sig, ranks[me], ranks[p], sends[p], receives[p])
            self.t.send(ranks[p], data_header(self.seq, expected[p], 0, 0), None, self.deadline)
        self.expected = expected
        self.owed = [p != me for p in range(n)]

    def agreed(self) -> None:
        """Read every peer's agreement message (see `agree`), once."""
        owed, self.owed = self.owed, None
        for p in range(self.size):
            if owed[p]:
                self.t.recv(self.ranks[p], self.seq, self.expected[p], 0, None, self.deadline, self.tracer)

    def send(self, peer: int, chunk: int, payload: np.ndarray | None) -> None:
        """Send `payload` (a contiguous array or None) as message `chunk` of this collective."""
        mv = None if payload is None else memoryview(payload).cast("B")
        header = data_header(self.seq, self.sig, chunk, 0 if mv is None else mv.nbytes)
        if self.tracer is None:
            self.t.send(self.ranks[peer], header, mv, self.deadline)
        else:
            with self.tracer.phase("send", peer=self.ranks[peer], bytes=header.nbytes):  # the job's rank, as wait's
                self.t.send(self.ranks[peer], header, mv, self.deadline)

    def recv(self, peer: int, chunk: int, out: np.ndarray | None) -> None:
        """Receive message `chunk` of this collective from `peer` into `out`."""
        if self.owed is not None:
            # Every peer's, before this rank waits on any (each is sent before anything else of the
            # call): one left unread would be held ahead of what that peer says next, a timeout's
            # notice included, while this rank waits on another.
            self.agreed()
        mv = None if out is None else memoryview(out).cast("B")
        self.t.recv(self.ranks[peer], self.seq, self.sig, chunk, mv, self.deadline, self.tracer)

    def recv_first(self, wanted: Sequence[tuple[int, int, np.ndarray | None]]) -> int:
        """Receive whichever of `wanted`'s messages (peer, chunk, out) comes first, as `recv`
        does; its index in `wanted` (Transport.recv_first says why a rank takes them so)."""
        if self.owed is not None:
            self.agreed()  # (as recv)
        views = [(self.ranks[p], chunk, None if out is None else memoryview(out).cast("B")) for p, chunk, out in wanted]
        return self.t.recv_first(views, self.seq, self.sig, self.deadline, self.tracer)

    def flush(self) -> None:
        """Wait until this rank's sends have left its buffers (every peer's agreement read
        first: two ranks that both think themselves a broadcast's root would otherwise wait
        for each other to take more than a link holds)."""
        if self.owed is not None and not self.t.send_failed():  # (else flush() says why first)
            try:
                self.agreed()
            except CollectiveTimeoutError as e:
                if getattr(e, "from_peer", False):
                    raise
                # A peer that neither said what it calls nor took this rank's data: the stuck
                # send is the news (a broadcast's root with a receiver that stopped).
                self.t.flush(self.deadline)
                raise
        if self.tracer is None:
            self.t.flush(self.deadline)
        else:
            with self.tracer.phase("flush"):
                self.t.flush(self.deadline)

    def piece_items(self, itemsize: int) -> int:
        """How many items of `itemsize` bytes one message carries."""
        return max(1, min(self.piece_bytes, MAX_PIECE_BYTES) // max(1, itemsize))

    def traced(self, combine: Combine) -> Combine:
        """`combine`, recorded as `reduce` phases when tracing."""
        if self.tracer is None:
            return combine
        tracer = self.tracer

        def combine_traced(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            with tracer.phase("reduce", bytes=out.nbytes):
                combine(a, b, out)

        return combine_traced


def blocks(n_items: int, parts: int) -> list[tuple[int, int]]:
    """Split range(n_items) into `parts` contiguous blocks whose sizes differ by at most one."""
    base, extra = divmod(n_items, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def block(n_items: int, parts: int, i: int) -> tuple[int, int]:
    """Block i of `blocks(n_items, parts)`, without making the others."""
    base, extra = divmod(n_items, parts)
    start = i * base + min(i, extra)
    return start, start + base + (1 if i < extra else 0)


def pieces(a: int, b: int, step: int) -> list[tuple[int, int]]:
    """Element range [a, b) cut into pieces of at most `step` items; an empty range is one empty
    piece, so that both sides of a block count its messages alike (as the native engine's
    schedules that cut a block count them)."""
    return [(s, min(s + step, b)) for s in range(a, b, step)] or [(a, a)]
