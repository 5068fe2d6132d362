"""A job on this rank: what every group made from one `init()` shares (the engine, the fence
gate, the lock that orders calls, the tracer) and how an error breaks it.

A failure leaves the shared connections mid-message, so the first error of any group breaks the
job: it is recorded, every gated GPU wait is released, every peer is told, and every later call
of every group raises it again.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any

from fastcoll import diagnosis, testhooks
from fastcoll.config import Config
from fastcoll.errors import CollectiveTimeoutError, FastcollError, PeerLostError

log = logging.getLogger("fastcoll")


class Job:
    """What every group made from one `init()` shares.

    `engine` is the job's Engine (fastcoll/engine/base.py), None for a world of one, and
    `prepared` what it offers beyond Engine (base.Prepared: the native engine), else None; `gate` its
    fence gate, or None; `hosts` each rank's host name, for error messages; `processes` each
    rank's process where it shares this rank's host (diagnosis.this_process), else None;
    `host_ids` each rank's host as the rendezvous table has it (where groups choose algorithms);
    `doubling_across_hosts` whether init() found recursive doubling faster across them than direct
    sends (fastcoll/doubling_probe.py)."""

    def __init__(self, config: Config, engine: Any, gate: Any, hosts: list[str] | None = None,
                 processes: list | None = None, host_ids: list | None = None):
        self.config = config
        self.engine = engine
        self.prepared = None if engine is None else engine.prepared
        self.gate = gate
        self.hosts = hosts or []
        self.processes = processes or []
        self.host_ids = host_ids or []
        self.doubling_across_hosts = False
        self.lock = threading.Lock()  # orders the calls of every group of this rank
        self.error: FastcollError | None = None
        self.before_call = None  # Group.set_before_call's: called before every call, or None
        self.closed = False
        self.tracer = None
        self._pid = os.getpid()
        if engine is not None:
            # Registered after the transport's modules were imported, so it runs before their
            # own exit hooks (atexit runs the last registered first).
            atexit.register(self._end_at_exit)
            _LIVE.add(self)
        if config.trace and engine is not None:
            from fastcoll.trace import Tracer

            self.tracer = Tracer(config.trace, config.rank)
            atexit.register(self.write_trace)

    def forked(self) -> bool:
        """Whether this process is a child forked from the one that joined the job."""
        return os.getpid() != self._pid

    def _disown(self) -> None:
        """In a child forked from this job's process (os.register_at_fork): every call of every
        group raises at once, before it could touch a connection, and the child's finalize()
        and exit leave the links, the gate and the trace alone: they are the parent's."""
        self.error = FastcollError(
            f"this process (pid {os.getpid()}) was forked from rank {self.config.rank}'s process "
            f"(pid {self._pid}) after that joined the job: a forked child cannot use its "
            "parent's job, whose connections are the parent's; call collectives in the parent, "
            "or give the child a job of its own (a process started with the 'spawn' method "
            "that calls fastcoll.init())")

    def fail(self, error: FastcollError, limit: float | None = None, waited: float | None = None) -> FastcollError:
        """Record the job's first error, release every gated GPU wait, and tell the peers; the
        error to raise. A timeout is first explained: the ranks that can still talk compare whom
        they wait for, and the error names who stopped answering (fastcoll/diagnosis.py)."""
        if self.error is not None:
            return self.error
        if isinstance(error, PeerLostError):
            error = diagnosis.on_host(error, self.hosts)
        self.error = error
        if self.gate is not None:
            self.gate.abort(error)  # release every issued gate, so no GPU spins on
        testhooks.point("abort")
        self.engine.abort(error)
        if isinstance(error, CollectiveTimeoutError) and self.config.world_size > 1:
            self.error = self._explained(error, self.config.timeout if limit is None else limit, waited)
        log.error("rank %d: %s: %s", self.config.rank, type(self.error).__name__, self.error)
        return self.error

    def _explained(self, error: CollectiveTimeoutError, limit: float, waited: float | None) -> CollectiveTimeoutError:
        me = self.config.rank
        # Told of a peer's timeout within half its limit of entering the call: this rank did not
        # wait long for anyone, so a chain of waits that ends at it says it came too late.
        late = getattr(error, "from_peer", False) and waited is not None and waited < limit / 2
        reports: dict[int, int | None] = {me: getattr(error, "waiting_for", None)}
        sender = getattr(error, "sender", None)
        if getattr(error, "from_peer", False) and sender is not None:
            reports[sender] = getattr(error, "sender_waits", None)
        lost: set[int] = set()
        # (collected even where nobody stopped: reading them also takes in what the peers were
        # still sending, so that their notices get through before this rank's finalize() closes)
        self.engine.transport.notices(time.monotonic() + diagnosis.window(limit), reports, lost)
        if getattr(error, "moving", False):  # the data still moved: nobody to look for
            explained = CollectiveTimeoutError(
                f"{error}; no rank stopped answering: data still moved between the ranks when the "
                "limit ran out, so this call needs a longer one")
        else:
            _, why = diagnosis.explain(me, self.config.world_size, reports, lost, self.hosts, late, self._process_state)
            explained = CollectiveTimeoutError(f"{error}; whom the ranks that can still talk wait for: {why}")
        explained.from_peer = getattr(error, "from_peer", False)
        explained.moving = getattr(error, "moving", False)
        return explained

    def _process_state(self, rank: int) -> str | None:
        """What rank `rank`'s process is doing, where this host can see it (diagnosis.process_state)."""
        return diagnosis.process_state(self.processes[rank]) if 0 <= rank < len(self.processes) else None

    def failed(self, rank: int, sig: str, limit: float, from_env: bool, e: BaseException, started: float) -> None:
        """Call `sig` of group rank `rank` failed with `e`: break the job (the peers are told) and
        raise what the caller gets; for an interrupt (Ctrl-C), return so that the engine
        re-raises it. `limit` is the call's time limit, `from_env` whether FASTCOLL_TIMEOUT set it."""
        if isinstance(e, FastcollError):
            if isinstance(e, CollectiveTimeoutError) and not getattr(e, "from_peer", False):
                setting = f"FASTCOLL_TIMEOUT={limit:g}" if from_env else f"timeout={limit:g}"
                e = diagnosis.timed_out(
                    f"{e} (it waited {limit:g} s, the call's limit: {setting}; raise it to wait longer)",
                    getattr(e, "waiting_for", None), getattr(e, "moving", False))
            raise self.fail(e, limit, waited=time.monotonic() - started) from None
        if isinstance(e, Exception):
            # Arguments were checked before the call was queued, so this is a bug; the peers may
            # be mid-message, so it must still break the group on every rank, not hang it.
            err = FastcollError(f"internal error in {sig}: {e!r}")
            self.fail(err)
            raise err from e
        self.fail(FastcollError(f"rank {rank} was interrupted during {sig}"))  # tell the peers

    def recorded(self) -> FastcollError | None:
        """A fresh copy of the error that broke the job, if one did (an engine raises it)."""
        err = self.error
        return None if err is None else type(err)(str(err))

    def close(self) -> None:
        """Finish queued work, tell the peers, and release sockets and threads."""
        if self.closed:
            return
        self.closed = True
        if self.forked():
            return  # the parent's connections, gate and trace: the parent ends them
        if self.gate is not None:
            # Evaluate what was gated while the peers still answer, then release the rest, so
            # that the service thread is never left waiting on a GPU nobody will run.
            if self.error is None and self.gate.pending():
                try:
                    self.gate.drain()
                except Exception as e:  # finalize goes on; the error was recorded for check()
                    log.warning("rank %d: gated results failed at finalize: %s", self.config.rank, e)
            self.gate.close()
        if self.engine is not None:
            atexit.unregister(self._end_at_exit)
            self.engine.close(timeout=self.config.timeout)
        self.write_trace()

    def _end_at_exit(self) -> None:
        """At exit, for a job nobody finalized (a program that ends on a fastcoll error does)."""
        if not self.closed and os.getpid() == self._pid:  # not in a forked child: not its job
            self.engine.end_at_exit()

    def write_trace(self) -> None:
        """Write the tracer's file (FASTCOLL_TRACE), if the job traces."""
        if self.tracer is not None and not self.forked():
            path = self.tracer.write()
            log.info("rank %d: wrote the trace %s", self.config.rank, path)


# The jobs with connections that this process holds: a child forked from it disowns them.
_LIVE: "weakref.WeakSet[Job]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for job in list(_LIVE):
        job._disown()


os.register_at_fork(after_in_child=_after_fork_in_child)
