"""fastcoll: fast, hang-free collectives for MLX across processes and hosts.

    import fastcoll
    g = fastcoll.init()                 # reads FASTCOLL_* (or mpirun/srun/mlx.launch) variables
    y = fastcoll.all_reduce(x)          # x: mx.array or numpy.ndarray
    fastcoll.finalize()

Where things are: `lifecycle` (init, finalize, the default group), `group` (Group, sub-groups,
how a call runs), `collectives` (the calls below), `algorithms/` (direct, doubling, ring, and
`select.py`, the rule that picks one), `transport/` (tcp with shared memory, zmq; the
rendezvous), `service` (the service thread), `gate/` (the fence gate's host half; its GPU
kernels in `metal/` and `cuda/`), `mlx_compat/` (fastcoll under mx.distributed), `launch/`
(fastcoll-launch). docs/design.md walks through them.
"""

from __future__ import annotations

import logging

__version__ = "0.1.0"

from fastcoll.collectives import (  # noqa: E402
    all_gather,
    all_reduce,
    barrier,
    broadcast,
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
from fastcoll.gradients import average_gradients  # noqa: E402
from fastcoll.group import Group  # noqa: E402
from fastcoll.lifecycle import check, finalize, init, is_initialized  # noqa: E402
from fastcoll.service import Work  # noqa: E402

logging.getLogger("fastcoll").addHandler(logging.NullHandler())

__all__ = [
    "init", "finalize", "check", "is_initialized", "Group", "Work", "Config",
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "send", "recv",
    "average_gradients",
    "FastcollError", "PeerLostError", "CollectiveTimeoutError", "MismatchError", "AuthenticationError",
]
