"""The host half of the handshake, run on the service thread once per gate.

    poll ARRIVAL until it holds this gate's seq      (the GPU copied x into the send mailbox)
    gather every rank's send mailbox into the receive mailbox, in rank order (the core's
        all_gather: the host only moves bytes; the GPU reduces them)
    store STATUS, then RELEASE = seq                 (the spinning kernel continues)

The one rule: the GPU is never left waiting. Whatever goes wrong (a peer lost, a timeout, a
mismatch, a bug, the gate closed), RELEASE is still stored, with an error STATUS, for every gate
issued so far; the gate's kernel then writes all-ones bytes (NaN in every float type) instead of
data, and the error is recorded here and raised to the caller at its next fastcoll call or
`check()`. A spin that hits its iteration bound sets SPIN_FAILED on the GPU, which `check()`
turns into CollectiveTimeoutError the same way. Errors are sticky: once one is recorded, every
later release carries an error status, so no gate after it can hand out data.

The native engine stores a failed gate's error release at once, from its service thread without
the GIL, and records the error here only after (fastcoll/engine/native.py's _queued_failed, which
needs the GIL): a caller can see the release first. So `check()`, finding STATUS an error with
none recorded yet, waits for it (RECORD_WAIT_S at most), rather than pass.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from fastcoll import testhooks
from fastcoll.errors import CollectiveTimeoutError, FastcollError, MismatchError
from fastcoll.gate.protocol import layout as L
from fastcoll.gate.protocol.page import ControlPage
from fastcoll.gate.host.poll import Poller, Stopped
from fastcoll.gate.host.profile import GateProfile, GateTiming
from fastcoll.gate.protocol.seq import seq_add, seq_diff

log = logging.getLogger("fastcoll.gate")

# exchange(send, gathered): `send` is this rank's x (bytes, read-only); fill `gathered` with every
# rank's x, rank r's at bytes [r * len(send), (r + 1) * len(send)).
Exchange = Callable[[np.ndarray, np.ndarray], None]

# How long the profiler waits for the spinning kernel's acknowledgement of a release, and for how
# much of that it polls without yielding (a GPU acknowledges in microseconds).
ACK_WAIT_S = 0.01
ACK_TIGHT_S = 100e-6

# How long check() waits for the error of a gate released with an error status to be recorded
# (the native engine's service thread takes the GIL to hand it over: normally well under this).
RECORD_WAIT_S = 5.0


class GateClosedError(FastcollError):
    """The gate was closed (finalize) before this gate was served."""


@dataclass(slots=True)
class Ticket:
    """What the service thread needs to serve one gate."""

    seq: int
    nbytes: int  # of this rank's x


class NativeServer(Protocol):
    """A native engine's gate (its `_native.GateHost`, fastcoll/engine/native.py) that serves this
    host half's gates itself: it owns the stores of STATUS and RELEASE (sticky, never backwards)
    and counts what it has not served yet."""

    def release(self, seq: int, status: int) -> None: ...
    def outstanding(self) -> int: ...
    def stop(self) -> None: ...
    def timings(self) -> list[tuple]: ...


@dataclass(slots=True)
class Serve:
    """One gate's host half as the core queues it: `serve()` runs it on the thread that runs the
    core's calls; `exchange` (None: the core's own, which it passes to serve) gathers the bytes."""

    host: "HostHalf"
    ticket: Ticket
    exchange: Exchange | None = None

    def __call__(self, exchange: Exchange | None = None) -> None:
        self.host.serve(self.ticket, exchange or self.exchange)

    def gathered(self) -> np.ndarray:
        """The receive mailbox's part this gate fills: every rank's x, in rank order."""
        return self.host.page.recv[: self.host.page.layout.ranks * self.ticket.nbytes]


def fresh_error(err: BaseException) -> FastcollError:
    """A new exception to raise for a recorded one (raising one object twice stacks tracebacks)."""
    if isinstance(err, FastcollError):
        try:
            new = type(err)(str(err))
        except Exception:
            new = FastcollError(str(err))
    else:
        new = FastcollError(f"the fence gate failed: {err!r}")
    new.__cause__ = err
    return new


class HostHalf:
    """Serves gates from the service thread and owns every store of RELEASE and STATUS."""

    def __init__(
        self,
        page: ControlPage,
        start_seq: int = 1,
        timeout: float = 60.0,
        profile: GateProfile | None = None,
        poller: Poller | None = None,
    ):
        self.page = page
        self._timeout = timeout
        self._profile = profile
        self._poller = poller or Poller()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: FastcollError | None = None
        self._recorded = threading.Event()  # set once _error is (check() may wait for it)
        self._status = L.OK  # sticky: the first error status stays
        self._ranks = page.layout.ranks
        self._issued = seq_add(start_seq, -1)
        self._released = self._issued
        self._outstanding = 0  # the host mode's gates not served yet
        self._native: NativeServer | None = None  # the engine that serves the gates, if native
        self._watching = False  # the direct mode's watcher is on (see issue())
        self.direct = False  # the direct mode (fastcoll/gate/host/direct_mode.py): the GPUs gather
        page.reset(start_seq)

    # ----- the caller's side -----

    def issue(self) -> tuple[int, bool]:
        """The next gate's sequence number, once its kernels are built (the GPU counts them the
        same way: each arrival publishes its previous gate's number plus one), and, in the direct
        mode, whether the watcher must be woken; raises the recorded error instead if there is one."""
        with self._lock:
            if self._error is not None:
                raise fresh_error(self._error)
            if self._stop.is_set():
                raise GateClosedError("the fence gate is closed")
            self._issued = seq_add(self._issued, 1)
            if not self.direct:
                self._outstanding += 1
                return self._issued, False
            wake, self._watching = not self._watching, True
            return self._issued, wake

    def completed(self) -> int:
        """The last gate whose spin has ended (the GPU's ACK)."""
        return self.page.load(L.ACK)

    def pending(self) -> bool:
        """Whether issued gates have not passed yet (and can still)."""
        if self._error is not None or self._stop.is_set():
            return False
        if not self.direct:
            return (self._native.outstanding() if self._native is not None else self._outstanding) > 0
        with self._lock:
            busy = seq_diff(self._issued, self.completed()) > 0
            self._watching = busy  # a watcher that sees nothing pending stops; issue() wakes it
            return busy

    def check(self) -> None:
        """Raise the recorded error, or a failure the GPU reported (a spin that hit its bound, a
        rank whose gate differs), if any. A gate already released with an error raises its error
        even when that is not recorded yet: this waits for it (see the module's docstring)."""
        if self._error is None and self.page.load(L.STATUS) == L.ERROR:
            self._await_error()
        self._check_now()

    def _await_error(self) -> None:
        """The page says a gate was released with an error: wait for its error to be recorded;
        record one saying so if none comes within RECORD_WAIT_S."""
        if self._recorded.wait(RECORD_WAIT_S):
            return
        self.fail(FastcollError(
            f"the fence gate released gate {self.page.load(L.RELEASE)} with an error status, but no "
            f"error was recorded for it within {RECORD_WAIT_S:g} s; its result is not valid"))

    def _check_now(self) -> None:
        """check() without waiting: what the service thread may call, since it is the thread
        that records the error check() would wait for."""
        failed = self.page.load(L.SPIN_FAILED)
        if self._error is None and failed != 0:
            seq, peer = self.page.load(L.SPIN_FAILED_SEQ), self.page.load(L.SPIN_FAILED_PEER)
            if failed == L.MISMATCH:
                self.fail(MismatchError(
                    f"gated all_reduce {seq}: rank {peer} called another collective (its op, dtype or "
                    "shape differs from this rank's); the result is not valid"))
            else:
                self.fail(CollectiveTimeoutError(
                    f"the GPU's release spin for gate {seq} hit FASTCOLL_FENCE_MAX_ITERS before the "
                    "host released it; its result is not valid"))
        err = self._error
        if err is not None:
            raise fresh_error(err)

    @property
    def error(self) -> FastcollError | None:
        return self._error

    # ----- failure and shutdown (any thread) -----

    def fail(self, error: BaseException) -> None:
        """Record `error` (the first one wins) and release every issued gate with an error."""
        with self._lock:
            if self._error is None:
                self._error = error if isinstance(error, FastcollError) else fresh_error(error)
                self._recorded.set()
                log.error("fence gate failed: %s: %s", type(error).__name__, error)
            self._release_locked(self._issued, L.ERROR)

    def close(self) -> None:
        """Stop waiting for arrivals and release every issued gate, so no GPU spin is left."""
        self._stop.set()
        if self._native is not None:
            self._native.stop()
        with self._lock:
            self._release_locked(self._issued, L.CLOSED)

    # ----- the service thread's side -----

    def serve(self, ticket: Ticket, exchange: Exchange) -> None:
        """Serve one gate (the function the core runs on its service thread, in call order)."""
        seq = ticket.seq
        try:
            if self._error is not None:
                raise fresh_error(self._error)
            self._check_now()  # a spin that already timed out: its peers' data would not be used
            _, arrival_s = self._poller.wait(
                lambda: self.page.load(L.ARRIVAL), seq, self._stop,
                on_slow=lambda waited: log.warning(
                    "gate %d: the GPU has not arrived after %.0f s; is the result of a gated "
                    "all_reduce never evaluated?", seq, waited),
                slow_after=self._timeout,
            )
            t_arrived = time.perf_counter()
            arrived = self.page.load(L.ARRIVAL)
            if arrived != seq:
                self._check_now()  # a spin that hit its bound lets the GPU run ahead: report that
                raise FastcollError(f"gate protocol error: waiting for gate {seq}, the GPU published {arrived}")
            self.page.fence()  # the mailbox is read only after ARRIVAL was seen
            send = self.page.send[: ticket.nbytes]
            send.flags.writeable = False
            t_exchange = time.perf_counter()
            exchange(send, self.page.recv[: self._ranks * ticket.nbytes])
            exchange_s = time.perf_counter() - t_exchange
            t_release, release_us, iters = self._release_and_time(seq)
            if self._profile is not None:
                host_us = (t_release - t_arrived) * 1e6
                self._profile.record(GateTiming(seq, arrival_s * 1e6, exchange_s * 1e6, host_us, release_us, iters, "ok"))
        except Stopped:
            err = GateClosedError(f"the fence gate was closed before gate {seq} arrived")
            with self._lock:
                self._release_locked(self._issued, L.CLOSED)
            raise err from None
        except BaseException as e:
            testhooks.point("gate-failed")
            self.fail(e)  # stores the release before anything else can go wrong
            raise
        finally:
            with self._lock:
                self._outstanding -= 1

    def _release_and_time(self, seq: int) -> tuple[float, float | None, int | None]:
        """Store the ok release; when profiling, wait for the spinning kernel's acknowledgement.

        Returns (when the release was stored, the release latency in us, the spin's iterations)."""
        with self._lock:
            self._release_locked(seq, L.OK)
            t_store = time.perf_counter()
        if self._profile is None:
            return t_store, None, None
        deadline = t_store + ACK_WAIT_S
        tight_until = t_store + ACK_TIGHT_S
        while seq_diff(self.page.load(L.ACK), seq) < 0:
            now = time.perf_counter()
            if now > deadline:
                return t_store, None, None
            if now > tight_until:
                time.sleep(0)  # a late acknowledgement: let other threads have the GIL meanwhile
        release_us = (time.perf_counter() - t_store) * 1e6
        return t_store, release_us, self.page.load(L.SPIN_ITERS)

    def next_seq(self) -> int:
        """The sequence number of the next gate issue() gives."""
        return seq_add(self._issued, 1)

    def profiled(self) -> bool:
        return self._profile is not None

    def is_served_by(self, native: NativeServer) -> bool:
        return self._native is native

    def native_failure(self, what: str, seq: int, arrived: int) -> FastcollError:
        """The error for a gate the native server could not serve: `what` is gate_closed,
        gate_protocol or gate_spin (a spin that hit its bound, which check() names)."""
        if what == "gate_closed":
            return GateClosedError(f"the fence gate was closed before gate {seq} arrived")
        try:
            self._check_now()  # a spin that hit its bound lets the GPU run ahead: report that
        except FastcollError as e:
            return e
        return FastcollError(f"gate protocol error: waiting for gate {seq}, the GPU published {arrived}")

    def served_by(self, native: NativeServer) -> None:
        """From now on `native` serves the gates and stores every release (the native engine)."""
        with self._lock:
            self._native = native

    def record_native_timings(self) -> None:
        """Move the native server's per-gate timings into the profile (FASTCOLL_GATE_PROFILE)."""
        if self._native is None or self._profile is None:
            return
        for seq, arrival, exchange, host, release, iters in self._native.timings():
            acked = release >= 0
            self._profile.record(GateTiming(seq, arrival, exchange, host, release if acked else None,
                                            iters if acked else None, "ok"))

    def _release_locked(self, seq: int, status: int) -> None:
        """Store STATUS then RELEASE (never moving RELEASE backwards). Holds self._lock."""
        if status != L.OK and self._status == L.OK:
            self._status = status
        if seq_diff(seq, self._released) < 0:
            seq = self._released
        if self._native is not None:  # it stores them, under the lock its own serving takes
            self._native.release(seq, self._status)
            self._released = seq
            return
        self.page.fence()  # the receive mailbox is written before STATUS and RELEASE
        self.page.store(L.STATUS, self._status)
        self.page.fence()
        self.page.store(L.RELEASE, seq)
        self._released = seq
