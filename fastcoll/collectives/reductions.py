"""The reductions: all_reduce, reduce_scatter and reduce (op: sum, prod, min, max, mean).

A repeated synchronous all_reduce of a numpy array runs the plan its first call made
(`Group.prepare`, `Group.run_plan`), which skips the checks already made for its key; on a job
with a fence gate, a call the gate takes never leaves the GPU (`Group.launch_gated`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastcoll import arrays, dtypes, lifecycle
from fastcoll.collectives.call import begin, check_rank
from fastcoll.engine.ops import Op
from fastcoll.group import NOT_GATED, NOT_PLANNED, Group
from fastcoll.service import Done
from fastcoll.wire import signature

# Globals, not module attributes: a repeated call's own work is counted in tens of nanoseconds.
_NDARRAY = np.ndarray
_MX_ARRAY = arrays.MX_ARRAY
_empty = np.empty


def all_reduce(x: Any, op: str = "sum", group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Reduce `x` element-wise over all ranks; every rank gets the same result.

    Args:
        x: an mx.array or numpy.ndarray of any shape; the same shape and dtype on every rank.
        op: "sum", "prod", "min", "max" or "mean".
        async_op: return a Work whose wait() returns the result.
        timeout: seconds to wait on a peer (default FASTCOLL_TIMEOUT).
    Returns:
        An array of x's type, shape and dtype.
    """
    g = lifecycle.resolve(group)
    kind = type(x)
    if g.gate is not None:  # the gate takes x before it is evaluated, or the call goes on
        y = begin(g, timeout, drain=False).launch_gated(x, op, async_op, timeout)
        if y is not NOT_GATED:
            return y
    elif (kind is _NDARRAY or kind is _MX_ARRAY) and not async_op and timeout is None:
        plan = g.plans.get(("all_reduce", x.dtype, x.shape, op))  # a repeated call, planned
        if plan is not None and (kind is _MX_ARRAY or x.flags.c_contiguous):
            if kind is _NDARRAY:
                src = x
            else:  # an mx.array's bytes, evaluated (numpy has no bfloat16: its bits as uint16)
                src = np.array(x.view(arrays.mx.uint16) if x.dtype == arrays.mx.bfloat16 else x, copy=False).reshape(-1)
            out = _empty(src.shape, src.dtype)
            if g.run_plan(plan, src, out, out) is not NOT_PLANNED:
                return out if kind is _NDARRAY else arrays.mx_result(out.reshape(x.shape), x.dtype)
    g = begin(g, timeout)
    h = arrays.to_host(x)
    out, buf = arrays.output(h.name, h.shape, h.mlx) if g.size() > 1 else (x, None)
    dtypes.check_reduction(h.name, op)
    if buf is None:
        return Done(x) if async_op else x
    step = Op("all_reduce", g.choose("all_reduce", buf.nbytes), h.flat, buf, h.name, op, result=out)
    sig = signature("all_reduce", op, h.name, h.shape)
    if not async_op and timeout is None and (kind is arrays.MX_ARRAY and buf.nbytes <= arrays.MX_PLAN_BYTES
                                             or kind is np.ndarray and x.flags.c_contiguous and x.dtype.isnative):
        plan = g.prepare(sig, step)
        if plan is not None:
            g.plans[("all_reduce", x.dtype, x.shape, op)] = plan
    return g.run(sig, step, timeout, async_op)


def reduce_scatter(x: Any, op: str = "sum", group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Reduce `x` over all ranks and give rank r block r of axis 0.

    x.shape[0] must be divisible by the group size; the result has shape
    (x.shape[0] // size, *x.shape[1:]).
    """
    g = begin(group, timeout)
    h = arrays.to_host(x)
    dtypes.check_reduction(h.name, op)
    n = g.size()
    if len(h.shape) == 0 or h.shape[0] % n:
        raise ValueError(f"reduce_scatter needs x.shape[0] divisible by the group size {n}; x has shape {h.shape}")
    if n == 1:
        return Done(x) if async_op else x
    out, buf = arrays.output(h.name, (h.shape[0] // n,) + tuple(h.shape[1:]), h.mlx)
    step = Op("reduce_scatter", g.choose("reduce_scatter", h.flat.nbytes), h.flat, buf, h.name, op, result=out)
    return g.run(signature("reduce_scatter", op, h.name, h.shape), step, timeout, async_op)


def reduce(x: Any, root: int = 0, op: str = "sum", group: Group | None = None, async_op: bool = False,
           timeout: float | None = None) -> Any:
    """Reduce `x` element-wise over all ranks onto `root` (op: sum, prod, min, max, mean).

    Returns on root an array of x's shape and dtype; None on the other ranks.
    """
    g = begin(group, timeout)
    check_rank(root, g, "root")
    h = arrays.to_host(x)
    dtypes.check_reduction(h.name, op)
    if g.size() == 1:
        return Done(x) if async_op else x
    out, buf = arrays.output(h.name, h.shape, h.mlx) if g.rank() == root else (None, None)
    step = Op("reduce", g.choose("reduce", h.flat.nbytes), h.flat, buf, h.name, op, root=root, result=out)
    return g.run(signature("reduce", op, root, h.name, h.shape), step, timeout, async_op)
