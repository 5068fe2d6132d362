"""Run a job to its end: watch the ranks, stop them all on the first failure, a signal or the
timeout, and say why the job ended.

Stopping is two-step, as mpirun and torchrun do it: a signal (SIGTERM, or the one the launcher
got) to every rank's process group, then SIGKILL for whatever is still alive after the grace
period. A second Ctrl-C skips the grace period. When a rank fails, the others are signalled
only after a short settle period: a rank that lost a peer ends by itself a moment later with an
error naming it, and a SIGTERM in the middle of writing that error would cut it short.
"""

from __future__ import annotations

import logging
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from fastcoll.launch.output import OutputMux
from fastcoll.launch.procs import HEARTBEAT, SSH_FAILED, RankProcess, StartError

log = logging.getLogger("fastcoll.launch")

TIMEOUT_EXIT = 124  # as timeout(1)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class _Stop:
    """Why the job is being stopped, and the exit code that follows from it."""

    code: int
    signal: int
    started_at: float  # when the ranks are (or were) sent `signal`; the grace period counts from it
    signalled: bool = False


class Supervisor:
    """Starts the ranks, then polls them until every one has ended."""

    def __init__(
        self,
        mux: OutputMux,
        *,
        grace: float = 5.0,
        settle: float = 1.0,
        timeout: float | None = None,
        poll_interval: float = 0.05,
    ) -> None:
        self._mux = mux
        self._grace = grace
        self._settle = settle
        self._timeout = timeout
        self._poll = poll_interval
        self._signals: list[int] = []
        self.interrupted = False  # a signal to the launcher stopped (or cut short) the job

    def on_signal(self, signum: int, frame: object = None) -> None:
        """Signal handler: only records the signal; the polling loop acts on it."""
        self._signals.append(signum)
        self.interrupted = True

    @contextmanager
    def forwarding_signals(self) -> Iterator[None]:
        """Route SIGINT, SIGTERM and SIGHUP to the ranks while the job runs (main thread only)."""
        previous = {s: signal.signal(s, self.on_signal) for s in FORWARDED}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def run(self, starters: Sequence[Callable[[], RankProcess]]) -> int:
        """Start every rank, wait for the job to end, and return the launcher's exit code."""
        procs: list[RankProcess] = []
        codes: dict[int, int] = {}
        began = time.monotonic()
        stop = self._start(starters, procs, codes)
        killed = forced = False
        while True:
            stop = self._on_signals(procs, codes, stop, killed)
            stop = self._on_ended(procs, codes, stop)
            if len(codes) == len(procs):
                break
            now = time.monotonic()
            if stop is None and self._timeout is not None and now - began > self._timeout:
                self._mux.message(f"the job ran past --timeout {self._timeout:g} s; stopping all ranks")
                stop = self._begin_stop(procs, codes, TIMEOUT_EXIT, signal.SIGTERM)
            if stop is not None:
                self._signal_when_due(procs, codes, stop, now)
                killed, forced, given_up = self._escalate(procs, codes, now - stop.started_at, killed, forced)
                if given_up:
                    break
            time.sleep(self._poll)
        for p in procs:
            p.cleanup()
        return self._summary(procs, codes, stop)

    def _start(self, starters: Sequence[Callable[[], RankProcess]], procs: list[RankProcess],
               codes: dict[int, int]) -> _Stop | None:
        """Start the ranks into `procs`; the stop that a rank that cannot start begins."""
        for start in starters:
            if self._signals:
                return None  # Ctrl-C while starting: start no more, stop those started
            try:
                procs.append(start())
            except StartError as e:
                self._mux.message(f"{e}; stopping the job")
                return self._begin_stop(procs, codes, e.code, signal.SIGTERM)
        return None

    def _on_signals(self, procs: list[RankProcess], codes: dict[int, int], stop: _Stop | None,
                    killed: bool) -> _Stop | None:
        """Act on the signals received since the last look: the first stops the job, a second
        skips the grace period."""
        while self._signals:
            sig = self._signals.pop(0)
            name = signal.Signals(sig).name
            if stop is None:
                self._mux.message(f"received {name}; stopping all ranks")
                stop = self._begin_stop(procs, codes, 128 + sig, sig)
            elif not stop.signalled:  # a rank failed and the others are settling: stop them now
                self._mux.message(f"received {name}; stopping all ranks now")
                stop.started_at = time.monotonic()
            elif not killed:
                self._mux.message(f"received {name} again; killing all ranks now")
                stop.started_at = time.monotonic() - self._grace
        return stop

    def _on_ended(self, procs: list[RankProcess], codes: dict[int, int], stop: _Stop | None) -> _Stop | None:
        """Record the ranks that ended; the first failure (or lost host) stops the others."""
        for p, code in self._ended(procs, codes):
            if p.rank in codes:
                continue  # given up with its host by _lost_host just now
            codes[p.rank] = code
            log.debug("rank %d ended: %d", p.rank, code)
            if p.lost() is not None:  # its host is gone: say so, whether or not stopping
                what = self._lost_host(p, procs, codes)
                others = len(procs) - len(codes)
                if stop is None:
                    what += f"; stopping the other {others} rank(s)" if others else ""
                    stop = self._begin_stop(procs, codes, code, signal.SIGTERM, self._settle)
                self._mux.message(what)
            elif code != 0 and stop is None:
                others = len(procs) - len(codes)
                self._mux.message(
                    f"rank {p.rank} (host {p.host}) {p.describe(code)}"
                    + (f"; stopping the other {others} rank(s)" if others else "")
                )
                stop = self._begin_stop(procs, codes, code, signal.SIGTERM, self._settle)
        return stop

    def _escalate(self, procs: list[RankProcess], codes: dict[int, int], stopping: float, killed: bool,
                  forced: bool) -> tuple[bool, bool, bool]:
        """SIGKILL once the grace period is over, force (a remote rank's ssh too) 5 s later, and
        give up 15 s later; (killed, forced, given up)."""
        left = [p for p in procs if p.rank not in codes]
        if not killed and stopping >= self._grace:
            log.debug("grace period over; SIGKILL to ranks %s", [p.rank for p in left])
            for p in left:
                p.kill()
            killed = True
        if killed and not forced and stopping >= self._grace + 5.0:
            for p in left:
                p.force()
            forced = True
        if forced and stopping >= self._grace + 15.0:
            # Only a process stuck in the kernel survives SIGKILL this long; stop waiting.
            self._mux.message(f"rank(s) {[p.rank for p in left]} did not end after SIGKILL; giving up on them")
            return killed, forced, True
        return killed, forced, False

    @staticmethod
    def _ended(procs: Sequence[RankProcess], codes: dict[int, int]) -> list[tuple[RankProcess, int]]:
        """The ranks that ended since the last look, with their codes, in the order they ended.

        Once one is found, every other rank is looked at again: one that ended just before it
        but was looked at first is found too, so the first rank to fail is the one reported,
        not the first one noticed (a rank that loses a peer often exits a moment after it)."""
        found: dict[int, tuple[RankProcess, int]] = {}
        for _ in range(2):
            for p in procs:
                if p.rank not in codes and p.rank not in found:
                    code = p.poll()
                    if code is not None:
                        found[p.rank] = (p, code)
            if not found:
                break
        return sorted(found.values(), key=lambda pc: _when(pc[0]))

    @staticmethod
    def _lost_host(p: RankProcess, procs: list[RankProcess], codes: dict[int, int]) -> str:
        """'lost contact with host H (ranks ...): why', giving up with `p` every other rank of
        its host that has missed a beat too (each rank has its own ssh session)."""
        ranks = [p.rank]
        for q in procs:
            if q.rank not in codes and q.host == p.host and q.silence() > 1.5 * HEARTBEAT:
                q.cut_off(p.lost() or "")
                code = q.poll()
                codes[q.rank] = SSH_FAILED if code is None else code
                ranks.append(q.rank)
        ranks.sort()
        which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        return f"lost contact with host {p.host} ({which}): {p.lost()}"

    def _begin_stop(
        self, procs: list[RankProcess], codes: dict[int, int], code: int, sig: int, settle: float = 0.0
    ) -> _Stop:
        """Stop the ranks still running: `sig` now, or after `settle` seconds."""
        stop = _Stop(code, sig, time.monotonic() + settle)
        self._signal_when_due(procs, codes, stop, time.monotonic())
        return stop

    @staticmethod
    def _signal_when_due(procs: list[RankProcess], codes: dict[int, int], stop: _Stop, now: float) -> None:
        if not stop.signalled and now >= stop.started_at:
            for p in procs:
                if p.rank not in codes:
                    p.signal(stop.signal)
            stop.signalled = True

    @staticmethod
    def _summary(procs: list[RankProcess], codes: dict[int, int], stop: _Stop | None) -> int:
        if stop is None:
            return 0
        log.debug("exit codes by rank: %s", dict(sorted(codes.items())))
        return stop.code


def _when(p: RankProcess) -> float:
    """When `p` ended, for ordering; after every known time if unknown."""
    at = p.ended_at()
    return float("inf") if at is None else at
