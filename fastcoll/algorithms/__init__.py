"""Collective algorithms over a Transport, one family per file (as Gloo lays them out).

`direct` moves each rank's whole buffer to every peer in one hop: latency-optimal for small
messages. `doubling` does the same in log2(n) exchanges with one partner each, for a
power-of-two number of ranks above two: fewer messages, which is what small collectives pay for
when ranks outnumber cores. `ring` pipelines pieces around the ring: bandwidth-optimal for
large ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastcoll.dtypes import Combine
from fastcoll.transport.base import Transport, data_header


@dataclass
class Call:
    """One collective as the service thread runs it: who, which one, and until when."""

    t: Transport
    seq: int
    sig: str
    deadline: float
    sent: int = 0  # messages sent to the ring's right neighbour so far
    received: int = 0  # messages received from the left one
    tracer: Any = None  # a fastcoll.trace.Tracer when FASTCOLL_TRACE is set

    def send(self, peer: int, chunk: int, payload: np.ndarray | None) -> None:
        """Send `payload` (a contiguous array or None) as message `chunk` of this collective."""
        mv = None if payload is None else memoryview(payload).cast("B")
        header = data_header(self.seq, self.sig, chunk, 0 if mv is None else mv.nbytes)
        if self.tracer is None:
            self.t.send(peer, header, mv)
        else:
            with self.tracer.phase("send", peer=peer, bytes=header.nbytes):
                self.t.send(peer, header, mv)

    def recv(self, peer: int, chunk: int, out: np.ndarray | None) -> None:
        """Receive message `chunk` of this collective from `peer` into `out`."""
        mv = None if out is None else memoryview(out).cast("B")
        self.t.recv(peer, self.seq, self.sig, chunk, mv, self.deadline, self.tracer)

    def flush(self) -> None:
        """Wait until this rank's sends have left its buffers."""
        if self.tracer is None:
            self.t.flush()
        else:
            with self.tracer.phase("flush"):
                self.t.flush()

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
