"""Synchronisation: barrier, monitored_barrier (which names the ranks that did not arrive), and
new_group (every rank of the parent agrees on the sub-group)."""

from __future__ import annotations

import time
from typing import Sequence

from fastcoll import lifecycle
from fastcoll.algorithms import Call
from fastcoll.collectives.call import begin
from fastcoll.engine.ops import Op
from fastcoll.errors import CollectiveTimeoutError
from fastcoll.group import Group


def barrier(group: Group | None = None, timeout: float | None = None) -> None:
    """Return once every rank of the group has called barrier()."""
    g = begin(group, timeout)
    if g.size() > 1:
        g.run("barrier()", Op("barrier", g.choose("barrier", 0)), timeout)


# How long a monitored barrier that has timed out on one peer still listens to the others: their
# notices arrived before the deadline, so they are read at once; this only bounds the wait.
_MONITOR_GRACE = 0.1


def monitored_barrier(group: Group | None = None, timeout: float | None = None) -> None:
    """A barrier that, when ranks do not arrive within `timeout` seconds (default
    FASTCOLL_TIMEOUT), raises CollectiveTimeoutError naming them, on every rank that arrived.

    Every rank tells every other that it arrived, then waits for each; one that has not arrived
    by the deadline is listed. The first rank to time out tells the others (ABORT), so each
    raises within about the same time, naming the same ranks. As after any timeout, the group
    is then broken.
    """
    g = begin(group, timeout)
    if g.size() == 1:
        return
    members = g.members()
    sub = members != list(range(len(members)))  # a sub-group's ranks are not the job's

    def body(call: Call) -> None:
        peers = [p for p in range(call.size) if p != call.rank]
        for p in peers:
            call.send(p, 0, None)
        missing = []
        for p in peers:
            try:
                call.recv(p, 0, None)
            except CollectiveTimeoutError as e:
                if getattr(e, "from_peer", False):
                    raise
                missing.append(p)
                call.deadline = min(call.deadline, time.monotonic() + _MONITOR_GRACE)
        call.flush()
        if missing:
            arrived = [p for p in range(call.size) if p not in missing]
            names = f"rank(s) {missing}" + (f" (job ranks {[members[p] for p in missing]})" if sub else "")
            raise CollectiveTimeoutError(
                f"monitored_barrier: {names} did not arrive; ranks {arrived} did")

    g.run("monitored_barrier()", body, timeout)


def new_group(ranks: Sequence[int], group: Group | None = None, timeout: float | None = None) -> Group:
    """A sub-group of the given ranks of `group` (default: the job's), as
    torch.distributed.new_group: every rank of `group` calls it with the same `ranks`.

    Members get the sub-group, ranked in sorted order; the others get a group of which they are
    not a member, every use of which raises ValueError. It shares the parent's connections, as
    `Group.split` does (docs/design.md, Sub-groups).
    """
    return lifecycle.resolve(group).new_group(ranks, timeout=timeout)

