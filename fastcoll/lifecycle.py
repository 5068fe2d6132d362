"""A job's life on this rank: `init()`, the default group, `finalize()`, and which group a call
with `group=None` means.

The default group is the only state fastcoll keeps between calls. A call with `group=None`
before any `init()` initializes from the environment, as mx.distributed does; once `finalize()`
has run, only an explicit `init()` starts a new job (a collective would otherwise join a new
rendezvous by accident).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from fastcoll import diagnosis, doubling_probe, engine
from fastcoll.config import Config
from fastcoll.errors import CollectiveTimeoutError, FastcollError
from fastcoll.group import Group

log = logging.getLogger("fastcoll")

MAX_HOST_NAME = 255  # a peer's host name, as this rank's messages quote it

_default: Group | None = None
_finalized = False  # finalize() ran and no init() since
_lock = threading.Lock()  # one init() or finalize() at a time
_handler: logging.Handler | None = None


def init(config: Config | None = None) -> Group:
    """Join the job described by the environment (or `config`) and return the default group.

    With nothing set this is a world of one: no network, and every collective is a no-op.
    Calling it again returns the same group.
    """
    global _default, _finalized
    with _lock:
        if _default is not None:
            return _default
        config = Config.from_env() if config is None else config
        if config.trace:  # at once, not at finalize() after the whole job ran
            # Imported here, so that `python -m fastcoll.trace` finds it not yet imported.
            from fastcoll.trace import check_path

            check_path(config.trace, config.rank)
        _apply_log_level(config.log)
        gate = None
        if config.fast_sync:
            from fastcoll.gate.host.probe import probe

            gate = probe(config)
        group = Group(config, None, gate) if config.world_size == 1 else _connect(config, gate)
        _default, _finalized = group, False
        return group


def _connect(config: Config, gate: Any) -> Group:
    """Rendezvous with every rank and connect the transport the job asked for."""
    deadline = time.monotonic() + config.timeout
    # "name": the host as error messages name it, the launcher's name where it gave one;
    # "process": for a peer on this host to tell what this rank's process does (diagnosis.py).
    caps = {"transport": config.transport, "gate": gate is not None, "host": engine.host_id(),
            "name": config.host or socket.gethostname(), "process": diagnosis.this_process()}
    try:
        eng, table = engine.connect(config, caps, deadline)
    except CollectiveTimeoutError as e:
        if gate is not None:
            gate.close()
        raise CollectiveTimeoutError(
            f"{e} (init() waited {config.timeout:g} s for the job to form: FASTCOLL_TIMEOUT="
            f"{config.timeout:g}; raise it if ranks start further apart)") from None
    except BaseException:
        if gate is not None:
            gate.close()
        raise
    if gate is not None and not all(c.get("gate") for c in table.caps):
        log.info("the fence gate is off: not every rank can run it")
        gate.close()
        gate = None
    hosts = [str(c.get("name") or str(c.get("host", "")).partition("/")[0])[:MAX_HOST_NAME] for c in table.caps]
    mine = table.caps[config.rank].get("host")
    processes = [c.get("process") if c.get("host") == mine else None for c in table.caps]
    log.info("rank %d of %d joined: %s", config.rank, config.world_size, eng.describe())
    host_ids = [c.get("host") for c in table.caps]
    group = Group(config, eng, gate, hosts, processes, host_ids)
    try:
        if gate is not None:
            gate.connect(lambda what, values: group.gather_ints(what, values, None), config.rank,
                         config.world_size, same_host=len(table.same_host(config.rank)) == config.world_size)
            eng.attach_gate(gate)
        if doubling_probe.needed(config, host_ids, eng.prepared is not None) and doubling_probe.doubling_wins(group):
            group.keep_doubling_across_hosts()
    except BaseException:
        group.finalize()
        raise
    return group


def is_initialized() -> bool:
    """True between init() and finalize()."""
    return _default is not None


def check() -> None:
    """Raise the error that broke the default group, or that a fence gate recorded, if any."""
    group = _default
    if group is not None:
        group.check()


def finalize() -> None:
    """Finish queued work, close the connections and forget the default group."""
    global _default, _finalized
    with _lock:
        group, _default = _default, None
        if group is not None:
            _finalized = True
            group.finalize()


def resolve(group: Any) -> Group:
    """The group a call means: `group` itself (a fastcoll Group, or a wrapper that holds one in
    `fastcoll_group`, such as mlx_compat's), or for None the default group."""
    if group is None:
        found = _default
        if found is not None:
            return found
        if _finalized:
            raise FastcollError(
                "fastcoll.finalize() has ended this rank's job: call fastcoll.init() to start a "
                "new one before calling collectives again")
        return init()
    if isinstance(group, Group):
        return group
    inner = getattr(group, "fastcoll_group", None)
    if isinstance(inner, Group):
        return inner
    raise TypeError(f"group must be a fastcoll Group, an mlx_compat Group or None, not {type(group).__name__}")


def _apply_log_level(level: str | None) -> None:
    """FASTCOLL_LOG=info|debug|warning: the `fastcoll` logger's level, shown on stderr if the
    program has not configured logging itself."""
    global _handler
    if level is None:
        return
    logger = logging.getLogger("fastcoll")
    logger.setLevel(level.upper())
    if _handler is None and not logging.getLogger().hasHandlers():
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        logger.addHandler(_handler)
