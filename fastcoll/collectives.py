"""The collectives every rank calls alike, each defined here once: the reductions (all_reduce,
reduce_scatter, reduce), the gathers and scatters of equal blocks (all_gather, gather, scatter,
all_to_all), broadcast, and synchronisation (barrier, monitored_barrier, new_group).

Each checks its call in the caller's thread (`begin`, `check_rank`: every check that can fail on
bad input runs before any byte is sent, so a bad call raises TypeError/ValueError and leaves the
group usable), asks its group for the algorithm once (`Group.choose`, over
fastcoll/algorithms/select.py), describes the call as an Op (fastcoll/engine/ops.py) and hands it
to its group (`Group.run`), which hands it to the engine. A repeated synchronous all_reduce of a
numpy array runs the plan its first call made (`Group.prepare`, `Group.run_plan`); on a job with
a fence gate, a call the gate takes never leaves the GPU (`Group.launch_gated`). The uneven forms
and point to point are in fastcoll/exchange.py, Python values in fastcoll/objects.py.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from fastcoll import arrays, dtypes, lifecycle
from fastcoll.algorithms import Call, block
from fastcoll.config import check_timeout
from fastcoll.engine.ops import Op
from fastcoll.errors import CollectiveTimeoutError
from fastcoll.group import ENGINE_RESULT_BYTES, NOT_GATED, NOT_PLANNED, Group
from fastcoll.service import Done
from fastcoll.wire import signature


def begin(group: Any, timeout: Any, drain: bool = True) -> Group:
    """The group a call runs on, ready: not broken or finalized, `timeout` valid, and (with
    `drain`) no gated result left to hold the service queue ahead of this call."""
    g = lifecycle.resolve(group)
    g.check()
    if timeout is not None:
        check_timeout(timeout, "timeout")
    if drain and g.gate is not None:
        g.drain_gate()
    return g


def check_rank(r: Any, g: Group, what: str, self_ok: bool = True) -> None:
    """ValueError unless `r` is a rank of g (and, without `self_ok`, not this one)."""
    if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or not 0 <= r < g.size():
        raise ValueError(f"{what}={r!r} is not a rank of this group (0..{g.size() - 1})")
    if not self_ok and r == g.rank():
        raise ValueError(f"{what}={r} is this rank itself")


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
            out = _empty(src.shape, src.dtype) if src.nbytes < ENGINE_RESULT_BYTES else g.empty(src.shape, src.dtype)
            if g.run_plan(plan, src, out, out) is not NOT_PLANNED:
                return out if kind is _NDARRAY else arrays.mx_result(out.reshape(x.shape), x.dtype)
    g = begin(g, timeout)
    h = arrays.to_host(x)
    out, buf = arrays.output(h.name, h.shape, h.mlx, g.empty) if g.size() > 1 else (x, None)
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


def gated_all_reduce(x: Any, op: str = "sum", group: Group | None = None) -> Any:
    """all_reduce(x, op) through the job's fence gate: its lazy result (an mx.array whose graph
    holds the gate's kernel), or None where the gate does not take the call (no gate, a
    sub-group, x's size, dtype or op), which then has not started: the caller makes it the
    usual way. Every rank decides alike (fastcoll/gate/protocol/accept.py)."""
    g = lifecycle.resolve(group)
    if g.gate is None:
        return None
    y = begin(g, None, drain=False).launch_gated(x, op, False, None)
    return None if y is NOT_GATED else y


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
    out, buf = arrays.output(h.name, (h.shape[0] // n,) + tuple(h.shape[1:]), h.mlx, g.empty)
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
    out, buf = arrays.output(h.name, h.shape, h.mlx, g.empty) if g.rank() == root else (None, None)
    step = Op("reduce", g.choose("reduce", h.flat.nbytes), h.flat, buf, h.name, op, root=root, result=out)
    return g.run(signature("reduce", op, root, h.name, h.shape), step, timeout, async_op)


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
            shape = (n,) if not x.shape else (n * x.shape[0],) + x.shape[1:]
            out = _empty(shape, x.dtype) if x.nbytes * n < ENGINE_RESULT_BYTES else g.empty(shape, x.dtype)
            y = g.run_plan(plan, x, out, out)
            if y is not NOT_PLANNED:
                return y
    g = begin(g, timeout)
    h = arrays.to_host(x)
    n = g.size()
    if n == 1:
        y = x.reshape(1) if len(h.shape) == 0 else x
        return Done(y) if async_op else y
    out, buf = arrays.output(h.name, _stacked(h.shape, n), h.mlx, g.empty)
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
    out, buf = arrays.output(h.name, _stacked(h.shape, n), h.mlx, g.empty) if g.rank() == root else (None, None)
    step = Op("gather", g.choose("gather", n * h.flat.nbytes), h.flat, buf, root=root, result=out)
    return g.run(signature("gather", root, h.name, h.shape), step, timeout, async_op)


def broadcast(x: Any, root: int = 0, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Every rank gets root's `x` (x's shape and dtype must agree on every rank)."""
    g = lifecycle.resolve(group)
    repeat = type(x) is np.ndarray and not async_op and timeout is None  # a call a plan may serve
    if repeat:
        plan = g.plans.get(("broadcast", x.dtype, x.shape, root))
        if plan is not None and x.flags.c_contiguous:
            mine = g.rank() == root
            if mine:
                out = x
            else:
                out = _empty(x.shape, x.dtype) if x.nbytes < ENGINE_RESULT_BYTES else g.empty(x.shape, x.dtype)
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
        out, buf = arrays.output(h.name, h.shape, h.mlx, g.empty)
    step = Op("broadcast", g.choose("broadcast", buf.nbytes), dst=buf, root=root, result=out)
    sig = signature("broadcast", root, h.name, h.shape)
    if repeat and x.flags.c_contiguous and x.dtype.isnative:
        plan = g.prepare(sig, step)
        if plan is not None:
            g.plans[("broadcast", x.dtype, x.shape, root)] = plan
    return g.run(sig, step, timeout, async_op)


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
    out, buf = arrays.output(h.name, (h.shape[0] // n,) + tuple(h.shape[1:]), h.mlx, g.empty)
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
    out, buf = arrays.output(h.name, h.shape, h.mlx, g.empty)
    step = Op("all_to_all", g.choose("all_to_all", h.flat.nbytes), h.flat, buf, result=out)
    return g.run(signature("all_to_all", h.name, h.shape), step, timeout, async_op)


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
