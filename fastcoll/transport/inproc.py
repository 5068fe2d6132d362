"""An in-process transport: `size` ranks that are threads of one process, for the algorithms'
unit tests (tests/test_algorithms.py) and measurements that must leave the network out.

Messages go through one queue per ordered pair of ranks, so each rank's messages to a peer stay
in order as on a connection. It is not in the transport registry: a job's ranks are processes.
"""

from __future__ import annotations

import collections
import queue
import time

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
        """The next message from `peer`; meanwhile the others' are looked at every few
        milliseconds, as a socket transport watches every peer: a peer's timeout notice ends
        the wait (fastcoll/diagnosis.py), the rest wait for their turn."""
        while True:
            if self._early[peer]:
                h, payload = self._early[peer].popleft()
                break
            try:
                h, payload = self._boxes[(peer, self.rank)].get(timeout=min(0.005, max(0.0, deadline - time.monotonic())))
                break
            except queue.Empty:
                pass
            for other in range(self.size):
                if other in (peer, self.rank):
                    continue
                try:
                    item = self._boxes[(other, self.rank)].get_nowait()
                except queue.Empty:
                    continue
                if timeout_notice(item[0]) and not self._early[other]:
                    raise abort_error(item[0], other, peer)  # unless that peer's earlier messages come first
                self._early[other].append(item)
            if time.monotonic() >= deadline:
                raise diagnosis.timed_out(
                    f"rank {self.rank} timed out waiting for rank {peer}, which did not answer", peer)
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
