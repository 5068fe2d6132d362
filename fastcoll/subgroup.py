"""Sub-groups: `Group.split(color, key)` as MPI_Comm_split does it, over the parent's connections.

A sub-group opens no sockets and starts no thread. It is a view of its root group (the one
`fastcoll.init()` made):

- Its transport maps sub-group ranks to parent ranks and passes every message to the parent's
  transport, so the ring and direct algorithms run unchanged on sub-group ranks.
- It numbers its collectives in a sequence of its own.
- Every signature it sends starts with a prefix of its own (`s<n>c<color>/`: the n-th split of
  its parent, this color; nested splits add to the parent's prefix). A message of one group can
  therefore never be taken for a message of another: it fails the header check
  (`MismatchError`), it is never reduced into the wrong buffer.
- It shares the root's service thread and its ordering lock, so the sockets still have one user
  at a time and collectives of all groups of a rank run in that rank's call order.

The rule that follows (the one NCCL states for communicators that share a stream): two ranks
that share several groups must call the collectives that involve both of them in the same
order. Collectives of groups that share no pair of ranks are independent. A program that breaks
the rule gets a `MismatchError` on the ranks concerned, not a hang and not wrong data.

Because a failure leaves the shared connections mid-message, an error in a sub-group breaks the
root group too (and so every other group of the job), and the root's errors reach every
sub-group. `finalize()` on a sub-group only retires the view; `fastcoll.finalize()` closes the
connections under every group.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fastcoll.errors import FastcollError
from fastcoll.group import Group


class SubTransport:
    """The parent's transport seen through a map: sub-group rank -> parent rank.

    It passes whole calls through (send, recv, flush, abort) rather than implementing the
    Transport internals, so the parent keeps doing the header checks: its errors name the
    parent's ranks and the sub-group's signature prefix."""

    def __init__(self, parent: Any, members: list[int], rank: int):
        self.parent = parent
        self.members = list(members)
        self.rank = rank
        self.size = len(members)

    def send(self, peer: int, *args: Any, **kwargs: Any) -> Any:
        return self.parent.send(self.members[peer], *args, **kwargs)

    def recv(self, peer: int, *args: Any, **kwargs: Any) -> Any:
        return self.parent.recv(self.members[peer], *args, **kwargs)

    def flush(self) -> None:
        self.parent.flush()

    def abort(self, error: FastcollError) -> None:
        # The connections are shared: every rank of the job must learn that they are broken.
        self.parent.abort(error)

    def close(self) -> None:
        """Nothing to release: the root group owns the sockets."""

    def __getattr__(self, name: str) -> Any:
        # Anything else a transport offers (settings, counters) is the parent's.
        return getattr(self.parent, name)


class SubGroup(Group):
    """A group made by `Group.split`: `rank()` and `size()` are within the sub-group."""

    def __init__(self, parent: Group, members: list[int], prefix: str):
        rank = members.index(parent.rank())
        config = dataclasses.replace(parent.config, rank=rank, world_size=len(members))
        # No transport and no gate here, so Group.__init__ starts no service thread.
        super().__init__(config, None, None)
        self.parent = parent
        self.root = parent.root
        self.prefix = prefix
        # parent ranks -> root ranks, for members() and messages
        up = parent.members() if isinstance(parent, SubGroup) else list(range(parent.size()))
        self._root_ranks = [up[m] for m in members]
        if len(members) > 1:
            self._transport = SubTransport(parent._transport, members, rank)
            self._service = self.root._service
            self._lock = self.root._lock
            # FASTCOLL_TRACE: the root's tracer records this group's collectives too (their
            # names carry the prefix); the root writes the file.
            self._tracer = getattr(self.root, "_tracer", None)

    def members(self) -> list[int]:
        """The root-group (global) rank of each rank of this group, in sub-group rank order."""
        return list(self._root_ranks)

    def __repr__(self) -> str:
        return (
            f"<fastcoll.SubGroup rank={self.rank()} size={self.size()} "
            f"global ranks={self._root_ranks} prefix={self.prefix!r}>"
        )

    def check(self) -> None:
        if self._closed:
            raise FastcollError("this group was finalized")
        self.root.check()
        if self._error is not None:
            raise type(self._error)(str(self._error))

    def run(self, sig: str, *args: Any, **kwargs: Any) -> Any:
        """Group.run with this group's signature prefix."""
        return super().run(self.prefix + sig, *args, **kwargs)

    def _fail(self, error: FastcollError) -> None:
        if self._error is None:
            self._error = error
        self.root._fail(error)  # logs once and tells every rank of the job

    def finalize(self) -> None:
        """Retire this view; the connections stay open for the root and its other groups."""
        self._closed = True


def split(group: Group, color: int, key: int = -1, timeout: float | None = None) -> SubGroup:
    """Split `group` into sub-groups by `color`; every rank of `group` must call it.

    Ranks that pass the same color form one sub-group. Within it, ranks are ordered by `key`
    (ties and negative keys: by rank in `group`), as MPI_Comm_split and mx.distributed's
    Group.split document. A group of one splits into a group of one without communicating.
    """
    for name, v in (("color", color), ("key", key)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"split {name} must be an int, not {type(v).__name__}")
    group.check()
    index = getattr(group, "_fastcoll_splits", 0)
    group._fastcoll_splits = index + 1
    parent_prefix = group.prefix if isinstance(group, SubGroup) else ""
    prefix = f"{parent_prefix}s{index}c{int(color)}/"
    if group.size() == 1:
        return SubGroup(group, [0], prefix)
    from fastcoll.collectives import all_gather

    mine = np.array([[int(color), int(key)]], dtype=np.int64)
    table = all_gather(mine, group=group, timeout=timeout)
    same = [r for r in range(group.size()) if table[r, 0] == color]
    members = sorted(same, key=lambda r: (int(table[r, 1]) if table[r, 1] >= 0 else r, r))
    return SubGroup(group, members, prefix)
