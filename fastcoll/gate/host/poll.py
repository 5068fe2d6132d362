"""Polling a control word from Python without starving the caller's thread.

The service thread polls the arrival word while the caller's thread may be busy building the next
graph in Python. A bare `while word != seq: pass` would hold the GIL for a whole switch interval
(5 ms) at a time, halving the caller's speed. Instead every poll gives the GIL up with
`time.sleep(0)`: when the caller wants the GIL it gets it at once and keeps it until it blocks
(mx.eval releases the GIL while it waits on the GPU) or until the interpreter's switch interval
hands it back, so the caller keeps nearly all its speed. When the caller is blocked in mx.eval,
as it is while the GPU runs a token, nothing competes and the poll sees the word within a few
microseconds. After `spin_s` without the word, the poll naps between reads to spare a core on
long waits (a gate built but not yet evaluated); naps only grow to `max_nap_s`.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from fastcoll.gate.protocol.seq import seq_diff

DEFAULT_SPIN_S = 0.005
DEFAULT_MAX_NAP_S = 200e-6


class Stopped(Exception):
    """The wait was abandoned because its stop event was set."""


class Poller:
    """Waits until a 32-bit control word reaches a sequence number (wrap-aware)."""

    def __init__(self, spin_s: float = DEFAULT_SPIN_S, max_nap_s: float = DEFAULT_MAX_NAP_S):
        self.spin_s = spin_s
        self.max_nap_s = max_nap_s

    def wait(
        self,
        read: Callable[[], int],
        seq: int,
        stop: threading.Event,
        deadline: float | None = None,
        on_slow: Callable[[float], None] | None = None,
        slow_after: float | None = None,
    ) -> tuple[int, float]:
        """Poll `read()` until it reaches `seq`; return (the word, seconds waited).

        Raises Stopped when `stop` is set first, TimeoutError past `deadline` (monotonic). Calls
        `on_slow(waited)` once if the word has not come after `slow_after` seconds.
        """
        t0 = time.monotonic()
        nap = 1e-6
        warned = slow_after is None
        while True:
            word = read()
            if seq_diff(word, seq) >= 0:
                return word, time.monotonic() - t0
            if stop.is_set():
                raise Stopped()
            now = time.monotonic()
            waited = now - t0
            if deadline is not None and now >= deadline:
                raise TimeoutError(f"waited {waited:.3f}s")
            if not warned and waited >= slow_after:
                warned = True
                if on_slow is not None:
                    on_slow(waited)
            if waited < self.spin_s:
                time.sleep(0)  # gives the GIL up, so the caller's thread runs now
            else:
                nap = min(nap * 2, self.max_nap_s)
                time.sleep(nap)
