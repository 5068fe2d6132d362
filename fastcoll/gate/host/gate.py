"""The Gate: what the core calls to run a small all-reduce without stopping the GPU."""

from __future__ import annotations

import atexit
import logging
import os
from typing import Any, Callable

from fastcoll.config import Config
from fastcoll.gate.protocol import layout as L
from fastcoll.gate.host.device_backend import DeviceBackend
from fastcoll.gate.host.serve import Exchange, HostHalf, Serve, Ticket
from fastcoll.gate.protocol.page import ControlPage
from fastcoll.gate.host.poll import Poller
from fastcoll.gate.host.profile import GateProfile
from fastcoll.gate.protocol.accept import dtype_name, gate_accepts
from fastcoll.gate.protocol.seq import seq_add

log = logging.getLogger("fastcoll.gate")

Submit = Callable[[Serve], Any]  # queue one gate's host half (call it to serve it)
ACCEPTED_MAX = 1024  # kinds of all-reduce whose accepts() answer a Gate remembers


class Gate:
    """A fence gate over one device backend; made by `fastcoll.gate.host.probe.probe(config)`.

    Thread use: `accepts`, `all_reduce`, `pending`, `drain` from the caller's thread; the function
    that `all_reduce` submits runs on the service thread; `check`, `abort` and `close` from any.
    """

    def __init__(
        self,
        backend: DeviceBackend,
        config: Config,
        start_seq: int = 1,
        poller: Poller | None = None,
    ):
        if config.gate_max_bytes > backend.layout.max_bytes:
            raise ValueError("the backend's mailboxes are smaller than gate_max_bytes")
        if backend.layout.ranks != config.world_size:
            raise ValueError(f"the backend's receive mailbox has {backend.layout.ranks} slots for "
                             f"{config.world_size} ranks")
        self._backend = backend
        self._max_bytes = config.gate_max_bytes
        self._min_bytes = config.gate_host_min_bytes  # in the host mode; the direct mode takes any size
        self._max_iters = max(1, min(config.fence_max_iters, L.MAX_ITERS_LIMIT))
        self._profile = GateProfile() if config.gate_profile else None
        self._host = HostHalf(
            ControlPage(backend.page, backend.layout), start_seq=start_seq,
            timeout=config.timeout, profile=self._profile, poller=poller,
        )
        self._token = backend.initial_token(seq_add(start_seq, -1))
        self._timeout = config.timeout
        self._direct_allowed = config.gate_direct
        self._watch_s = max(config.gate_watch_ms, 1) / 1000
        self._accepted: dict[tuple, bool] = {}  # (shape, dtype, op) -> accepts()
        self._gather = None  # the direct mode's segment (fastcoll/gate/host/direct_mode.py), once set up
        self._watcher = None
        self._closed = False
        self._pid = os.getpid()  # a child forked from this process leaves the gate to it
        self._log_handler: logging.Handler | None = None
        if self._profile is not None:
            self._show_profile_logs()
            atexit.register(self._at_exit)

    def connect(self, gather_ints: Any, rank: int, size: int, same_host: bool,
                share: Any = None, alive: Any = None) -> None:
        """Once the job has formed: switch to the direct mode where every rank can (all ranks on
        one host, a backend that shares host memory with its GPU; fastcoll/gate/host/direct_mode.py),
        else stay in the host mode. Every rank of the job calls it; `gather_ints` all-gathers over
        the job's transport."""
        share = share or getattr(self._backend, "share_host_memory", None)
        if not (self._direct_allowed and size > 1 and same_host and share is not None):
            return
        from fastcoll.gate.host import direct_mode

        gather = direct_mode.setup(gather_ints, rank, size, self._max_bytes, share)
        if gather is not None:
            self.use_direct(gather, alive)

    def use_direct(self, gather: Any, alive: Any = None) -> None:
        """Run the direct mode over `gather` (a direct_mode.Gather this rank set up with its peers)."""
        from fastcoll.gate.host import direct_mode

        self._backend.use_gather(gather.address, gather.layout, gather.rank)
        self._gather = gather
        self._min_bytes = 0
        self._accepted.clear()
        self._host.direct = True
        self._watcher = direct_mode.Watcher(self._host, gather, self._timeout, alive, nap_s=self._watch_s)

    @property
    def direct(self) -> bool:
        """Whether the GPUs gather among themselves (the direct mode)."""
        return self._gather is not None

    @property
    def backend_name(self) -> str:
        """'cuda', 'metal' or 'sim'."""
        return self._backend.name

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    def accepts(self, x: Any, op: str) -> bool:
        """Whether all_reduce(x, op) takes the gate: x an mx.array of a supported dtype whose
        nbytes <= gate_max_bytes (and, in the host mode, >= gate_host_min_bytes), op one of
        sum/prod/min/max/mean (fastcoll/gate/protocol/accept.py).
        Depends only on x's shape and dtype, op and init-fixed config, so every rank decides alike."""
        if not isinstance(x, _MxArray):
            return False
        key = (x.shape, x.dtype, op)  # asked once per gated call: the rule runs once per kind
        ok = self._accepted.get(key)
        if ok is None:
            ok = gate_accepts(key[0], dtype_name(key[1]), op, self._max_bytes, self._min_bytes)
            if len(self._accepted) < ACCEPTED_MAX:  # a model repeats a handful of shapes
                self._accepted[key] = ok
        return ok

    def all_reduce(self, x: Any, op: str, exchange: Exchange | None = None, submit: Submit | None = None) -> Any:
        """A lazy result of x's shape and dtype whose graph holds the gate's kernels.

        Submits the host half to the service thread (in call order) and evaluates nothing.
        `exchange(send, gathered)` fills `gathered` with every rank's bytes of x, in rank order
        (fastcoll/gate/host/serve.py); the GPU reduces them.
        """
        if not self.accepts(x, op):
            raise ValueError(f"the fence gate does not take all_reduce({op!r}) of {x.dtype} {tuple(x.shape)}")
        self.check()
        return self.launch(x, op, exchange, submit)

    def launch(self, x: Any, op: str, exchange: Exchange | None = None, submit: Submit | None = None) -> Any:
        """all_reduce for a caller that has asked accepts(x, op) already (the core, once per call:
        a decode step makes dozens of these calls a token). A recorded error still raises, from
        issue(). In the direct mode `exchange` and `submit` are not used: there is no host half."""
        result, token = self._backend.launch(x, op, self._max_iters, self._token)
        # Issued once its kernels exist, as the GPU counts it; if the gate has failed meanwhile
        # this raises, and the kernels just built are dropped with the result nobody gets.
        seq, wake = self._host.issue()
        self._token = token
        if self._watcher is not None:  # the direct mode: no host half per gate
            if wake:
                self._watcher.wake()
            return result
        if self._profile is not None:
            self._host.record_native_timings()
        try:
            submit(Serve(self._host, Ticket(seq, int(x.nbytes)), exchange))
        except BaseException as e:
            self._host.fail(e)  # the kernels exist: release them with an error now
            raise
        return result

    def check(self) -> None:
        """Raise the error a gate recorded (a failed exchange, a spin that hit its bound), if any."""
        self._host.check()

    def host_half(self) -> HostHalf | None:
        """The host mode's half, for an engine that serves it natively; None in the direct mode."""
        return None if self.direct else self._host

    def pending(self) -> bool:
        """Whether gated results are still outstanding on the service thread."""
        return self._host.pending()

    def drain(self) -> None:
        """Evaluate every gate issued so far (the caller's thread; never the service thread)."""
        if self._host.pending():
            self._backend.wait(self._token)

    def abort(self, error: BaseException) -> None:
        """The group failed elsewhere: record `error` and release every issued gate with it."""
        self._host.fail(error)

    def stop_serving(self) -> None:
        """At interpreter exit: stop the host half's waits for arrivals and release every issued
        gate, without waiting for the GPU (close() does that)."""
        self._host.close()

    def close(self) -> None:
        """Release every issued gate (with a 'closed' status), log the profile, free the page."""
        if self._closed:
            return
        self._closed = True
        self._host.close()
        self._host.record_native_timings()
        if self._watcher is not None:
            self._watcher.stop()
        if self._gather is not None:
            try:
                self._backend.wait(self._token)  # every kernel that reaches the segment has ended
            except Exception as e:
                log.debug("gated results at close: %s", e)
            self._gather.close()
        if self._profile is not None:
            atexit.unregister(self._at_exit)
            self._profile.log_summary()
            if self._log_handler is not None:
                log.removeHandler(self._log_handler)
        self._backend.close()

    def profile(self) -> GateProfile | None:
        """The profile (FASTCOLL_GATE_PROFILE=1), or None."""
        return self._profile

    def _at_exit(self) -> None:
        if not self._closed and self._profile is not None and os.getpid() == self._pid:
            self._host.record_native_timings()
            self._profile.log_summary()

    def _show_profile_logs(self) -> None:
        # FASTCOLL_GATE_PROFILE=1 asks for the timings to be shown: if nobody configured logging,
        # send this logger's records to stderr rather than let Python drop them.
        if log.getEffectiveLevel() > logging.INFO:
            log.setLevel(logging.INFO)
        if not _shown(log):
            self._log_handler = logging.StreamHandler()
            self._log_handler.setFormatter(logging.Formatter("fastcoll.gate: %(message)s"))
            log.addHandler(self._log_handler)


try:
    from mlx.core import array as _MxArray
except ImportError:  # numpy-only installs: nothing is an mx.array, so nothing is ever gated

    class _MxArray:  # type: ignore[no-redef]
        pass


def _shown(logger: logging.Logger) -> bool:
    """Whether a record of `logger` reaches a handler that shows it (the library's own
    NullHandler on the `fastcoll` logger shows nothing)."""
    while logger is not None:
        if any(not isinstance(h, logging.NullHandler) for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False
