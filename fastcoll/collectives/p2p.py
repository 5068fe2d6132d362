"""One rank's array to others: broadcast (to every rank), send and recv (to one, in order).

Ordering (docs/design.md, Point to point): a rank's sends, receives and collectives run one at
a time in its call order; the n-th send from a to b meets b's n-th receive from a.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastcoll import arrays, dtypes, lifecycle
from fastcoll.collectives.call import begin, check_rank
from fastcoll.engine.ops import Op
from fastcoll.group import NOT_PLANNED, Group
from fastcoll.service import Done
from fastcoll.wire import signature


def broadcast(x: Any, root: int = 0, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Every rank gets root's `x` (x's shape and dtype must agree on every rank)."""
    g = lifecycle.resolve(group)
    repeat = type(x) is np.ndarray and not async_op and timeout is None  # a call a plan may serve
    if repeat:
        plan = g.plans.get(("broadcast", x.dtype, x.shape, root))
        if plan is not None and x.flags.c_contiguous:
            mine = g.rank() == root
            out = x if mine else np.empty(x.shape, x.dtype)
            y = g.run_plan(plan, x if mine else None, None if mine else out, out)
            if y is not NOT_PLANNED:
                return y
    g = begin(g, timeout)
    check_rank(root, g, "root")
    h = arrays.to_host(x)
    if g.size() == 1:
        return Done(x) if async_op else x
    if g.rank() == root:
        out, buf = x, h.flat
    else:
        out, buf = arrays.output(h.name, h.shape, h.mlx)
    step = Op("broadcast", g.choose("broadcast", buf.nbytes), dst=buf, root=root, result=out)
    sig = signature("broadcast", root, h.name, h.shape)
    if repeat and x.flags.c_contiguous and x.dtype.isnative:
        plan = g.prepare(sig, step)
        if plan is not None:
            g.plans[("broadcast", x.dtype, x.shape, root)] = plan
    return g.run(sig, step, timeout, async_op)


def send(x: Any, dst: int, group: Group | None = None, timeout: float | None = None, async_op: bool = False) -> Any:
    """Send `x` to rank `dst`, which must call recv() with the same shape and dtype.

    With async_op (or isend) it returns a Work at once; keep `x` unchanged until its wait().
    A send completes once its bytes have left this rank."""
    g = begin(group, timeout)
    check_rank(dst, g, "dst", self_ok=False)
    h = arrays.to_host(x)
    step = Op("send", g.choose("send", h.flat.nbytes), src=h.flat, root=dst)
    return g.run(signature("send", g.rank(), dst, h.name, h.shape), step, timeout, async_op, p2p=("send", dst))


def recv(shape: Any, dtype: Any, src: int, group: Group | None = None, timeout: float | None = None,
         async_op: bool = False) -> Any:
    """Receive an array of `shape` and `dtype` sent by rank `src` with send().

    An MLX dtype (mx.float32) gives an mx.array; a numpy dtype gives a numpy.ndarray. With
    async_op (or irecv), a Work whose wait() returns it.
    """
    g = begin(group, timeout)
    check_rank(src, g, "src", self_ok=False)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"recv shape {shape} has a negative dimension")
    name, mlx = _dtype_name(dtype)
    out, buf = arrays.output(name, shape, mlx)
    step = Op("recv", g.choose("recv", buf.nbytes), dst=buf, root=src, result=out)
    return g.run(signature("send", src, g.rank(), name, shape), step, timeout, async_op, p2p=("recv", src))


def isend(x: Any, dst: int, group: Group | None = None, timeout: float | None = None) -> Any:
    """send(x, dst, async_op=True): a Work; keep `x` unchanged until its wait() returns."""
    return send(x, dst, group, timeout, async_op=True)


def irecv(shape: Any, dtype: Any, src: int, group: Group | None = None, timeout: float | None = None) -> Any:
    """recv(shape, dtype, src, async_op=True): a Work whose wait() returns the array."""
    return recv(shape, dtype, src, group, timeout, async_op=True)


def _dtype_name(dtype: Any) -> tuple[str, bool]:
    """(dtype's name, whether it is an MLX dtype); TypeError naming recv otherwise."""
    if arrays.mx is not None and isinstance(dtype, arrays.mx.Dtype):
        return arrays.name_of_mlx(dtype), True
    try:
        return arrays.name_of_numpy(np.dtype(dtype)), False
    except TypeError as e:
        raise TypeError(f"recv dtype {dtype!r}: {e}") from None
