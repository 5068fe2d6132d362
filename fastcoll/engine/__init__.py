"""Engines: what moves a job's bytes once the Python layer has checked and described a call.

`connect(config, caps, deadline)` sets the job's data plane up: the transport's rendezvous and
connections (fastcoll/transport/), then the engine that owns them. The native engine
(fastcoll/engine/native.py over the compiled `fastcoll.engine._native`) runs where every rank has
it and asks for it (FASTCOLL_NATIVE, on by default) over TCP and shared memory; everywhere else
the pure-Python engine (fastcoll/engine/python.py) does, which is also the reference. RDMA
(FASTCOLL_TRANSPORT=rdma, fastcoll/transport/rdma.py) runs on the native engine only: where a
rank cannot run it, every rank says so at init() and none starts.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from fastcoll import transport
from fastcoll.engine import door
from fastcoll.engine.base import Engine, Prepared, Task
from fastcoll.engine.ops import Op
from fastcoll.engine.python import PythonEngine
from fastcoll.transport.shm import host_id  # the job's "host" capability: which ranks may share memory

log = logging.getLogger("fastcoll")

# FASTCOLL_TRANSPORT values whose connections the native engine can own.
NATIVE_TRANSPORTS = ("tcp", "rdma")

__all__ = ["Engine", "Op", "Prepared", "Task", "connect", "host_id", "link_kinds", "native_available"]


def native_available() -> str | None:
    """None where the native engine can run here, else why not."""
    try:
        from fastcoll.engine import native
    except door.SurfaceError as e:  # built from other sources than this fastcoll
        return str(e)
    except ImportError as e:  # the extension was not built (no compiler at install time)
        return f"its extension, fastcoll.engine._native, was not built at install time (no C compiler then?): {e}"
    return native.unavailable()


def link_kinds() -> tuple[str, ...]:
    """The kinds of link the native engine was compiled with ("tcp", "shm", and "verbs" where
    its build found <infiniband/verbs.h>); () where it is unavailable."""
    if native_available() is not None:
        return ()
    from fastcoll.engine import _native

    kinds = getattr(_native, "link_kinds", None)
    return ("tcp", "shm") if kinds is None else tuple(kinds())


def verbs_problem() -> str | None:
    """None where the native engine here can open verbs links, else why not."""
    why = native_available()
    if why is not None:
        return f"FASTCOLL_TRANSPORT=rdma needs the native engine, which is unavailable: {why}"
    kinds = link_kinds()
    if "verbs" not in kinds:
        return (f"this fastcoll's native engine was built without the verbs link (it has {', '.join(kinds)}): "
                "<infiniband/verbs.h> was missing where it was compiled (Debian: libibverbs-dev; macOS: the "
                "26.2 SDK or later); reinstall fastcoll where it is found")
    return None


def connect(config: Any, caps: dict[str, Any], deadline: float) -> tuple[Engine, Any]:
    """Rendezvous with every rank and connect; the job's engine and the rendezvous table. Every
    rank runs the native engine, or none does (each says in its `caps` whether it can)."""
    if config.transport == "rdma":
        return _connect_rdma(config, caps, deadline)
    wanted = config.native and config.transport in NATIVE_TRANSPORTS
    why_not = native_available() if wanted else None
    if why_not is not None:
        _fall_back(why_not)
    caps = {**caps, "native": wanted and why_not is None}
    if config.transport not in NATIVE_TRANSPORTS:
        t, table = transport.connect(config, caps, deadline)
        return PythonEngine(t), table
    from fastcoll.transport import tcp

    links, table = tcp.establish(config, caps, deadline)
    if caps["native"] and all(c.get("native") for c in table.caps):
        from fastcoll.engine.native import NativeEngine

        return NativeEngine.over(config, links, len(table.same_host(config.rank))), table
    if caps["native"]:
        log.info("rank %d: the pure-Python engine runs: not every rank can run the native one", config.rank)
    return PythonEngine(tcp.over(config, links)), table


def _connect_rdma(config: Any, caps: dict[str, Any], deadline: float) -> tuple[Engine, Any]:
    """An rdma job: the native engine over its links, the verbs ones among them (tcp.establish
    refuses the job on every rank where any rank cannot run them)."""
    from fastcoll.transport import tcp

    links, table = tcp.establish(config, {**caps, "native": True}, deadline, verbs_problem())
    from fastcoll.engine.native import NativeEngine

    return NativeEngine.over(config, links, len(table.same_host(config.rank)), deadline), table


def _fall_back(why: str) -> None:
    """Say, once per job and even where logging is not configured, that the Python engine runs."""
    message = (f"fastcoll runs its pure-Python engine, slower on small messages: the native engine is "
               f"unavailable, {why}; reinstall fastcoll where a C compiler exists, or set FASTCOLL_NATIVE=0 "
               "to choose the Python engine quietly")
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
