"""Host access to the control page: 32-bit loads and stores, mailbox views, and store ordering.

Loads and stores go through a memoryview cast to 32-bit words, so each is one aligned 4-byte
access (CPython packs a single `unsigned int`), never a torn one, and costs ~50 ns.

Ordering. The host writes the receive mailbox, then STATUS, then RELEASE; the GPU must not see
RELEASE before the rest. On x86 (TSO) stores are seen in program order, so nothing is needed. On
a weakly ordered host (Apple's arm64) the host issues a full fence between them: releasing and
re-acquiring a lock is a store-release followed by a load-acquire, which ARMv8 keeps in order
(RCsc), so every access before the pair is ordered before every access after it. The same fence
sits between seeing ARRIVAL and reading the send mailbox.
"""

from __future__ import annotations

import platform
import threading
from typing import Callable

import numpy as np

from fastcoll.gate.protocol import layout as L
from fastcoll.gate.protocol.seq import MASK, seq_add

_TSO_MACHINES = {"x86_64", "amd64", "i386", "i686", "x86"}


def make_fence() -> Callable[[], None]:
    """A full memory fence for this host (a no-op where the CPU keeps program order)."""
    if platform.machine().lower() in _TSO_MACHINES:
        return lambda: None
    lock = threading.Lock()
    lock.acquire()

    def fence() -> None:
        # A release then an acquire: ordered on ARMv8 (RCsc), so it orders everything around it.
        lock.release()
        lock.acquire()

    return fence


class ControlPage:
    """The host's view of one control page (a uint8 numpy view of the shared memory)."""

    def __init__(self, page: np.ndarray, layout: L.ControlLayout):
        if page.dtype != np.uint8 or page.ndim != 1 or page.nbytes < layout.total_bytes:
            raise ValueError("the control page must be a flat uint8 view of layout.total_bytes")
        if not page.flags.c_contiguous or not page.flags.writeable:
            raise ValueError("the control page must be contiguous and writable")
        self.layout = layout
        self._page = page
        self.raw = page  # the whole page, for a native server
        self._words = memoryview(page).cast("I")
        self.send = page[layout.send_offset : layout.send_offset + layout.mailbox_bytes]
        self.recv = page[layout.recv_offset : layout.recv_offset + layout.recv_bytes]
        self.fence = make_fence()

    def load(self, word: int) -> int:
        """One 32-bit load of a control word."""
        return self._words[word]

    def store(self, word: int, value: int) -> None:
        """One 32-bit store to a control word."""
        self._words[word] = value & MASK

    def reset(self, start_seq: int) -> None:
        """Put every word in its idle state, as if gate start_seq - 1 had just completed."""
        before = seq_add(start_seq, -1)
        for word in (L.ARRIVAL, L.RELEASE, L.ACK, L.MARK):
            self.store(word, before)
        for word in (L.STATUS, L.SPIN_ITERS, L.SPIN_FAILED, L.SPIN_FAILED_SEQ, L.SPIN_FAILED_PEER):
            self.store(word, 0)
        self.fence()
