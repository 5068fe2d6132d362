"""An in-process transport: `size` ranks that are threads of one process, for the algorithms'
unit tests (tests/test_algorithms.py) and measurements that must leave the network out.

Messages go through one queue per ordered pair of ranks, so each rank's messages to a peer stay
in order as on a connection. It is not in the transport registry: a job's ranks are processes.
"""

from __future__ import annotations

import collections
import queue
import time
from typing import Sequence

from fastcoll import diagnosis
from fastcoll.transport.base import Transport, abort_error, timeout_notice
from fastcoll.wire import ABORT, Header


class InProcTransport(Transport):
    """Rank `rank` of a mesh made by `mesh(size)`."""

    def __init__(self, rank: int, size: int, boxes: dict[tuple[int, int], queue.SimpleQueue]):
        super().__init__(rank, size)
        self._boxes = boxes  # (from, to) -> the messages in flight
        self._current: dict[int, bytes | None] = {}
        self._early: dict[int, collections.deque] = {p: collections.deque() for p in range(size)}

    def send(self, peer: int, header: Header, payload: memoryview | None, deadline: float | None = None) -> None:
        self._boxes[(self.rank, peer)].put((header, None if payload is None else bytes(payload)))

    def flush(self, deadline: float | None = None) -> None:
        pass  # send() copied the payload

    def _next_header(self, peer: int, chunk: int, deadline: float, nbytes: int = 0) -> Header:
        return self._first_header([(peer, chunk)], deadline, nbytes)[1]

    def _first_header(self, wanted: Sequence[tuple[int, int]], deadline: float, nbytes: int = 0) -> tuple[int, Header]:
        """The next message from whichever of `wanted`'s peers sends first; meanwhile the others'
        are looked at every few milliseconds, as a socket transport watches every peer: a peer's
        timeout notice ends the wait (fastcoll/diagnosis.py), the rest wait for their turn."""
        peers = [peer for peer, _ in wanted]
        while True:
            for i, peer in enumerate(peers):
                if not self._early[peer]:
                    try:
                        self._early[peer].append(self._boxes[(peer, self.rank)].get_nowait())
                    except queue.Empty:
                        continue
                return i, self._take(peer, *self._early[peer].popleft())
            for other in range(self.size):
                if other != self.rank and other not in peers:
                    self._look(other, peers[0])
            left = deadline - time.monotonic()
            if left <= 0:
                raise diagnosis.timed_out(
                    f"rank {self.rank} timed out waiting for rank {peers[0]}, which did not answer", peers[0])
            try:  # asleep on the first peer's queue; briefly where another may come first
                slice_s = 0.005 if len(peers) == 1 else 0.0005
                self._early[peers[0]].append(self._boxes[(peers[0], self.rank)].get(timeout=min(slice_s, left)))
            except queue.Empty:
                pass

    def _look(self, other: int, waiting_for: int) -> None:
        """Keep what `other` (not waited on) has sent; raise at its timeout notice, unless that
        peer's earlier messages come first."""
        early = self._early[other]
        while True:
            try:
                early.append(self._boxes[(other, self.rank)].get_nowait())
            except queue.Empty:
                break
        if early and timeout_notice(early[0][0]):
            raise abort_error(early.popleft()[0], other, waiting_for)

    def _take(self, peer: int, h: Header, payload: bytes | None) -> Header:
        if h.kind == ABORT:
            raise abort_error(h, peer, peer)
        self._current[peer] = payload
        return h

    def _read_payload(self, peer: int, chunk: int, out: memoryview, deadline: float = 0.0) -> None:
        out.cast("B")[:] = self._current.pop(peer)

    def _send_abort(self, header: Header) -> None:
        for p in range(self.size):
            if p != self.rank:
                self._boxes[(self.rank, p)].put((header, None))

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return "in-process"


def mesh(size: int) -> list[InProcTransport]:
    """The transports of `size` ranks joined to each other, rank r's at index r."""
    boxes = {(a, b): queue.SimpleQueue() for a in range(size) for b in range(size) if a != b}
    return [InProcTransport(r, size, boxes) for r in range(size)]
