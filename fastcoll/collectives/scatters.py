"""The scatters: a different block of axis 0 for each rank, from the root (scatter) or from
every rank (all_to_all, and all_to_all_v, its uneven form for mixture-of-experts routing).

all_to_all_v first agrees on the sizes: passing them (`recv_counts=`) saves that exchange and
makes the whole call asynchronous with `async_op=True`; without them the counts are exchanged
first, synchronously, and only the data moves under the returned Work. Sizes that ranks
disagree on show as a MismatchError (each message's byte count is checked against what the
receiver expects), never as wrong data.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fastcoll import arrays, dtypes
from fastcoll.algorithms import blocks
from fastcoll.collectives import uneven
from fastcoll.collectives.call import begin, check_rank
from fastcoll.engine.ops import Op
from fastcoll.errors import MismatchError
from fastcoll.group import Group
from fastcoll.service import Done
from fastcoll.wire import signature


def scatter(x: Any, root: int = 0, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Root's `x` split along axis 0 into size blocks; rank r gets block r.

    x.shape[0] must be divisible by the group size. On the other ranks `x` gives only the shape
    and dtype, which must be root's (its values are not read), as for broadcast. Returns an array
    of shape (x.shape[0] // size, *x.shape[1:]) on every rank.
    """
    g = begin(group, timeout)
    check_rank(root, g, "root")
    n = g.size()
    mine = g.rank() == root
    h = arrays.to_host(x) if mine else arrays.Host(arrays.name_of(x), tuple(x.shape), None, arrays.is_mlx(x))
    if len(h.shape) == 0 or h.shape[0] % n:
        raise ValueError(f"scatter needs x.shape[0] divisible by the group size {n}; x has shape {h.shape}")
    if n == 1:
        return Done(x) if async_op else x
    out, buf = arrays.output(h.name, (h.shape[0] // n,) + tuple(h.shape[1:]), h.mlx)
    step = Op("scatter", g.choose("scatter", buf.nbytes * n), h.flat, buf, root=root, result=out)
    return g.run(signature("scatter", root, h.name, h.shape), step, timeout, async_op)


def all_to_all(x: Any, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Block j of `x` (axis 0 cut into size equal blocks) goes to rank j; rank r gets block r of
    every rank, concatenated in rank order.

    x.shape[0] must be divisible by the group size; the result has x's shape and dtype, the same
    on every rank. Every dtype moves (bool too).
    """
    g = begin(group, timeout)
    n = g.size()
    h = arrays.to_host(x)
    if len(h.shape) == 0 or h.shape[0] % n:
        raise ValueError(f"all_to_all needs x.shape[0] divisible by the group size {n}; x has shape {h.shape}")
    if n == 1:
        return Done(x) if async_op else x
    out, buf = arrays.output(h.name, h.shape, h.mlx)
    step = Op("all_to_all", g.choose("all_to_all", h.flat.nbytes), h.flat, buf, result=out)
    return g.run(signature("all_to_all", h.name, h.shape), step, timeout, async_op)


def all_to_all_v(
    x: Any,
    counts: Sequence[int],
    recv_counts: Sequence[int] | None = None,
    group: Group | None = None,
    async_op: bool = False,
    timeout: float | None = None,
) -> Any:
    """The uneven all_to_all (MPI_Alltoallv; torch's all_to_all_single with split sizes), as
    mixture-of-experts token routing needs it.

    Args:
        x: shape (sum(counts), *rest); rows counts[0] go to rank 0, the next counts[1] to rank 1...
            `rest` and the dtype must be the same on every rank.
        counts: rows for each destination rank (len == group size).
        recv_counts: rows this rank receives from each rank, if known (it must equal what each
            sender's `counts` says); None: the call exchanges the counts first (synchronously).
    Returns:
        (y, recv_counts): y of shape (sum(recv_counts), *rest), the blocks from rank 0, 1, ...
        in rank order; recv_counts a list of ints. With async_op, a Work whose wait() returns it.
    """
    g = begin(group, timeout)
    n = g.size()
    h = arrays.to_host(x)
    if len(h.shape) == 0:
        raise ValueError("all_to_all_v needs an array with a first axis, not a scalar")
    send = uneven.counts(counts, n, "counts")
    if sum(send) != h.shape[0]:
        raise ValueError(f"counts {send} add up to {sum(send)} rows; x has {h.shape[0]}")
    known = None if recv_counts is None else uneven.counts(recv_counts, n, "recv_counts")
    row = uneven.row_items(h.shape)
    rest = tuple(h.shape[1:])
    if n == 1:
        return Done((x, send)) if async_op else (x, send)
    if known is None:
        known = _exchange_counts(g, send, timeout)
    uneven.check_bound("all_to_all_v", sum(known), row, dtypes.host_dtype(h.name).itemsize)
    out, buf = arrays.output(h.name, (sum(known),) + rest, h.mlx)
    step = Op("all_to_all", g.choose("all_to_all", h.flat.nbytes), h.flat, buf, bounds=uneven.cut(send, row),
              recv_bounds=uneven.cut(known, row), result=(out, list(known)))
    return g.run(signature("all_to_all_v", h.name, rest), step, timeout, async_op)


def _exchange_counts(g: Group, send: list[int], timeout: float | None) -> list[int]:
    """counts[j] to rank j; what every rank sends this one (a small int64 all_to_all)."""
    n = g.size()
    src = np.array(send, dtype=np.int64)
    got = np.empty(n, dtype=np.int64)
    bounds = blocks(n, n)

    def check() -> None:
        if (got < 0).any():
            raise MismatchError(f"all_to_all_v: a rank reported a negative count: {got.tolist()}")

    step = Op("all_to_all", g.choose("all_to_all", src.nbytes), src, got, bounds=bounds, recv_bounds=bounds,
              after=check)
    g.run("all_to_all_v.counts(int64)", step, timeout)
    return [int(c) for c in got]
