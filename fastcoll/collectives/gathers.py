"""The gathers: every rank's block, in rank order, on every rank (all_gather, all_gather_v) or on
the root (gather).

all_gather_v first agrees on the sizes: passing them (`sizes=`) saves that exchange and makes
the whole call asynchronous with `async_op=True`; without them the sizes are exchanged first,
synchronously (one small int64 collective), and only the data moves under the returned Work.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fastcoll import arrays, dtypes, lifecycle
from fastcoll.algorithms import block
from fastcoll.collectives import uneven
from fastcoll.collectives.call import begin, check_rank
from fastcoll.engine.ops import Op
from fastcoll.errors import MismatchError
from fastcoll.group import NOT_PLANNED, Group
from fastcoll.service import Done
from fastcoll.wire import signature


def all_gather(x: Any, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Concatenate every rank's `x` along axis 0, in rank order (scalars become a vector).

    Returns an array of shape (size * x.shape[0], *x.shape[1:]), or (size,) for a scalar.
    """
    g = lifecycle.resolve(group)
    repeat = type(x) is np.ndarray and not async_op and timeout is None  # a call a plan may serve
    if repeat:
        plan = g.plans.get(("all_gather", x.dtype, x.shape))
        if plan is not None and x.flags.c_contiguous:
            n = g.config.world_size
            out = np.empty((n,) if not x.shape else (n * x.shape[0],) + x.shape[1:], x.dtype)
            y = g.run_plan(plan, x, out, out)
            if y is not NOT_PLANNED:
                return y
    g = begin(g, timeout)
    h = arrays.to_host(x)
    n = g.size()
    if n == 1:
        y = x.reshape(1) if len(h.shape) == 0 else x
        return Done(y) if async_op else y
    out, buf = arrays.output(h.name, _stacked(h.shape, n), h.mlx)
    a, b = block(buf.size, n, g.rank())
    buf[a:b] = h.flat
    step = Op("all_gather", g.choose("all_gather", buf.nbytes), dst=buf, result=out)
    sig = signature("all_gather", h.name, h.shape)
    if repeat and x.flags.c_contiguous and x.dtype.isnative:
        plan = g.prepare(sig, step)
        if plan is not None:
            g.plans[("all_gather", x.dtype, x.shape)] = plan
    return g.run(sig, step, timeout, async_op)


def _stacked(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The shape of n arrays of `shape` concatenated along axis 0 (a scalar's: (n,))."""
    return (n,) if len(shape) == 0 else (n * shape[0],) + tuple(shape[1:])


def all_gather_v(
    x: Any,
    sizes: Sequence[int] | None = None,
    group: Group | None = None,
    async_op: bool = False,
    timeout: float | None = None,
) -> Any:
    """all_gather of arrays whose first axis differs across ranks (MPI_Allgatherv).

    Args:
        x: shape (k_r, *rest) on rank r; `rest` and the dtype must be the same on every rank.
        sizes: every rank's k_r, if known (it must match); None: exchanged first (synchronously).
    Returns:
        (y, sizes): y of shape (sum(sizes), *rest), every rank's x in rank order, the same on
        every rank; sizes a list of ints. With async_op, a Work whose wait() returns it.
    """
    g = begin(group, timeout)
    n = g.size()
    h = arrays.to_host(x)
    if len(h.shape) == 0:
        raise ValueError("all_gather_v needs an array with a first axis, not a scalar")
    known = None if sizes is None else uneven.counts(sizes, n, "sizes")
    if known is not None and known[g.rank()] != h.shape[0]:
        raise ValueError(f"sizes[{g.rank()}] = {known[g.rank()]} but x has {h.shape[0]} rows on this rank")
    row = uneven.row_items(h.shape)
    rest = tuple(h.shape[1:])
    if n == 1:
        y = (x, [h.shape[0]])
        return Done(y) if async_op else y
    if known is None:
        known = [int(v) for v in g.gather_ints("all_gather_v.sizes", [h.shape[0]], timeout)[:, 0]]
        if min(known) < 0:
            raise MismatchError(f"all_gather_v: a rank reported a negative size: {known}")
    uneven.check_bound("all_gather_v", sum(known), row, dtypes.host_dtype(h.name).itemsize)
    out, buf = arrays.output(h.name, (sum(known),) + rest, h.mlx)
    bounds = uneven.cut(known, row)
    a, b = bounds[g.rank()]
    buf[a:b] = h.flat
    step = Op("all_gather", g.choose("all_gather", buf.nbytes), dst=buf, bounds=bounds, result=(out, list(known)))
    return g.run(signature("all_gather_v", h.name, rest), step, timeout, async_op)


def gather(x: Any, root: int = 0, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Concatenate every rank's `x` along axis 0 on `root` only (x: the same shape and dtype on
    every rank).

    Returns on root an array of shape (size * x.shape[0], *x.shape[1:]) ((size,) for a scalar),
    rank order; None on the other ranks.
    """
    g = begin(group, timeout)
    check_rank(root, g, "root")
    n = g.size()
    h = arrays.to_host(x)
    if n == 1:
        y = x.reshape(1) if len(h.shape) == 0 else x
        return Done(y) if async_op else y
    out, buf = arrays.output(h.name, _stacked(h.shape, n), h.mlx) if g.rank() == root else (None, None)
    step = Op("gather", g.choose("gather", n * h.flat.nbytes), h.flat, buf, root=root, result=out)
    return g.run(signature("gather", root, h.name, h.shape), step, timeout, async_op)
