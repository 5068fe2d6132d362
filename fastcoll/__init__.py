"""fastcoll: fast, hang-free collectives for MLX across processes and hosts.

    import fastcoll
    g = fastcoll.init()                 # reads FASTCOLL_* (or mpirun/srun/mlx.launch) variables
    y = fastcoll.all_reduce(x)          # x: mx.array or numpy.ndarray
    fastcoll.finalize()

Where things are: `lifecycle` (init, finalize, the default group), `group` (Group, sub-groups,
how a call runs), `collectives` (the calls every rank makes alike), `exchange` (the uneven
ones and point to point), `objects` (Python values), `algorithms/` (the Python engine's
schedules, and `select.py`, the rule that names the native engine's algorithm), `engine/` (the data plane), `transport/` (tcp with shared
memory, rdma's verbs links, zmq; the rendezvous), `service` (the service thread), `gate/` (the fence gate:
its protocol under its host half and its device side, one kernel body over a prelude per GPU),
`gpu/`, `metal/`, `cuda/` (the GPU languages and their preludes, below the gate), `mlx_compat/` (fastcoll under mx.distributed), `launch/` (fastcoll-launch). docs/design.md walks
through them.
"""

from __future__ import annotations

import logging

from fastcoll.wire import VERSION as __version__  # one place: the rendezvous sends it too

from fastcoll.collectives import (  # noqa: E402
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    gather,
    monitored_barrier,
    new_group,
    reduce,
    reduce_scatter,
    scatter,
)
from fastcoll.exchange import all_gather_v, all_to_all_v, irecv, isend, recv, send  # noqa: E402
from fastcoll.objects import all_gather_object, broadcast_object  # noqa: E402
from fastcoll.config import Config  # noqa: E402
from fastcoll.errors import (  # noqa: E402
    AuthenticationError,
    CollectiveTimeoutError,
    FastcollError,
    MismatchError,
    PeerLostError,
)
from fastcoll.gradients import average_gradients  # noqa: E402
from fastcoll.group import Group, NonMember  # noqa: E402
from fastcoll.lifecycle import check, finalize, init, is_initialized  # noqa: E402
from fastcoll.service import Work  # noqa: E402

logging.getLogger("fastcoll").addHandler(logging.NullHandler())

__all__ = [
    "init", "finalize", "check", "is_initialized", "Group", "Work", "Config",
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "send", "recv",
    "all_to_all", "all_to_all_v", "all_gather_v", "gather", "scatter", "reduce",
    "broadcast_object", "all_gather_object", "monitored_barrier", "new_group", "NonMember",
    "isend", "irecv", "average_gradients",
    "FastcollError", "PeerLostError", "CollectiveTimeoutError", "MismatchError", "AuthenticationError",
]
