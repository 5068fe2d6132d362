"""The public collectives, one family a module: `reductions` (all_reduce, reduce_scatter,
reduce), `gathers` (all_gather, all_gather_v, gather), `scatters` (scatter, all_to_all,
all_to_all_v), `p2p` (broadcast, send, recv, isend, irecv), `sync` (barrier,
monitored_barrier, new_group) and `objects` (broadcast_object, all_gather_object: msgpack
values, never pickle).

Each checks its call in the caller's thread, asks its group for the algorithm once
(`Group.choose`, over fastcoll/algorithms/select.py), describes the call as an Op
(fastcoll/engine/ops.py) and hands it to its group (`Group.run`), which hands it to the engine.
What they share is in `call` (the group, the checks, the signature) and `uneven` (the sizes of
the uneven forms).
"""

from __future__ import annotations

from fastcoll.collectives.gathers import all_gather, all_gather_v, gather
from fastcoll.collectives.objects import all_gather_object, broadcast_object
from fastcoll.collectives.p2p import broadcast, irecv, isend, recv, send
from fastcoll.collectives.reductions import all_reduce, reduce, reduce_scatter
from fastcoll.collectives.scatters import all_to_all, all_to_all_v, scatter
from fastcoll.collectives.sync import barrier, monitored_barrier, new_group

__all__ = [
    "all_reduce", "reduce_scatter", "reduce", "all_gather", "all_gather_v", "gather", "scatter",
    "all_to_all", "all_to_all_v", "broadcast", "send", "recv", "isend", "irecv", "barrier",
    "monitored_barrier", "new_group", "broadcast_object", "all_gather_object",
]
