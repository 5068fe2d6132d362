"""fastcoll: fast, hang-free collectives for MLX across processes and hosts.

    import fastcoll
    g = fastcoll.init()                 # reads FASTCOLL_* (or mpirun/srun/mlx.launch) variables
    y = fastcoll.all_reduce(x)          # x: mx.array or numpy.ndarray
    fastcoll.finalize()
"""

from __future__ import annotations

import logging

__version__ = "0.1.0"

from fastcoll.collectives import (  # noqa: E402
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    default_group,
    recv,
    reduce_scatter,
    send,
)
from fastcoll.config import Config  # noqa: E402
from fastcoll.errors import (  # noqa: E402
    AuthenticationError,
    CollectiveTimeoutError,
    FastcollError,
    MismatchError,
    PeerLostError,
)
from fastcoll.group import Group  # noqa: E402
from fastcoll.gradients import average_gradients  # noqa: E402
from fastcoll.service import Work  # noqa: E402

logging.getLogger("fastcoll").addHandler(logging.NullHandler())

__all__ = [
    "init", "finalize", "check", "is_initialized", "Group", "Work", "Config",
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "send", "recv",
    "average_gradients",
    "FastcollError", "PeerLostError", "CollectiveTimeoutError", "MismatchError", "AuthenticationError",
]


def init(config: Config | None = None) -> Group:
    """Join the job described by the environment (or `config`) and return the default group.

    With nothing set this is a world of one: no network, and every collective is a no-op.
    Calling it again returns the same group.
    """
    from fastcoll import collectives
    from fastcoll.group import Group as _Group, connect_group

    group = collectives.default_group()
    if group is not None:
        return group
    config = Config.from_env() if config is None else config
    gate = None
    if config.fast_sync:
        from fastcoll.gate import probe

        gate = probe(config)
    if config.world_size == 1:
        group = _Group(config, None, gate)
    else:
        group = connect_group(config, gate)
    collectives.set_default_group(group)
    return group


def is_initialized() -> bool:
    """True between init() and finalize()."""
    return default_group() is not None


def check() -> None:
    """Raise the error that broke the default group, or that a fence gate recorded, if any."""
    group = default_group()
    if group is not None:
        group.check()


def finalize() -> None:
    """Finish queued work, close the connections and forget the default group."""
    from fastcoll import collectives

    group = collectives.default_group()
    if group is not None:
        collectives.set_default_group(None)
        group.finalize()
