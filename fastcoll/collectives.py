"""The public collectives: check the call, pick the algorithm, run it on the service thread.

Every check that can fail on bad input (dtype, op, shape, root) runs in the caller's thread
before any byte is sent, so a bad call raises TypeError/ValueError and leaves the group usable.
The algorithm comes from `fastcoll.algorithms.select`, the group from `fastcoll.lifecycle`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from fastcoll import arrays, dtypes, lifecycle
from fastcoll.algorithms import block, select
from fastcoll.config import check_timeout
from fastcoll.engine.ops import Op
from fastcoll.group import NOT_PLANNED, Group, done


@functools.lru_cache(maxsize=1024)  # a training loop repeats a handful of signatures
def _sig(kind: str, *parts: Any) -> str:
    """'all_reduce(sum,float32,(4, 8))': what every rank must agree on, sent in each header."""
    return kind + "(" + ",".join(map(str, parts)) + ")"


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
    if (kind is np.ndarray or kind is arrays.MX_ARRAY) and not async_op and timeout is None:  # planned
        plan = g._plans.get(("all_reduce", x.dtype, x.shape, op))
        if plan is not None and kind is np.ndarray and x.flags.c_contiguous:
            out = np.empty(x.shape, x.dtype)
            y = g._planned(plan, x, out, out)
            if y is not NOT_PLANNED:
                return y
        elif plan is not None and kind is arrays.MX_ARRAY:  # tensor-parallel layers' all_sum
            src = arrays.mx_flat(x)
            out = np.empty(src.shape, src.dtype)
            if g._planned(plan, src, out, out) is not NOT_PLANNED:
                return arrays.mx_result(out.reshape(x.shape), x.dtype)
    g = _begin(g, timeout, drain=False)  # a gated all_reduce must not drain first
    if g._job.gate is not None:  # (tested first: the common case pays one attribute read)
        gate = g._gate_for(x, op)
        if gate is not None:
            return _gated_all_reduce(g, gate, x, op, async_op, timeout)
        g._drain_gate()
    h = arrays.to_host(x)
    dtypes.check_reduction(h.name, op)
    if g.size() == 1:
        return done(x, async_op)
    out, buf = arrays.output(h.name, h.shape, h.mlx)
    step = Op("all_reduce", select.algorithm("all_reduce", buf.nbytes, g.size(), g.config), h.flat, buf,
              h.name, op, result=out)
    sig = _sig("all_reduce", op, h.name, h.shape)
    if _plannable(x, async_op, timeout, mlx=True):
        g._plan(("all_reduce", x.dtype, x.shape, op), sig, step)
    return g._run(sig, step, timeout, async_op)


def _gated_all_reduce(g: Group, gate: Any, x: Any, op: str, async_op: bool, timeout: float | None) -> Any:
    # (g._gate_for asked gate.accepts already: the gate's launch does not ask again)
    if gate.direct:  # the GPUs gather among themselves: nothing for the host to do per gate
        return done(gate.launch(x, op), async_op)
    # The host only moves bytes (every rank's x into the receive mailbox, in rank order); the
    # GPU reduces them (fastcoll/gate/kernels.py).
    key = (x.shape, x.dtype, op)
    submit = g._gate_submits.get(key) if timeout is None else None
    if submit is None:
        submit = g._gate_submitter(key, _sig("all_reduce", op, arrays.mx_name(x.dtype), tuple(x.shape)), timeout)
    return done(gate.launch(x, op, None, submit), async_op)


def all_gather(x: Any, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Concatenate every rank's `x` along axis 0, in rank order (scalars become a vector).

    Returns an array of shape (size * x.shape[0], *x.shape[1:]), or (size,) for a scalar.
    """
    g = lifecycle.resolve(group)
    if type(x) is np.ndarray and not async_op and timeout is None:  # a repeated call: planned
        plan = g._plans.get(("all_gather", x.dtype, x.shape))
        if plan is not None and x.flags.c_contiguous:
            n = g.config.world_size
            out = np.empty((n,) if not x.shape else (n * x.shape[0],) + x.shape[1:], x.dtype)
            y = g._planned(plan, x, out, out)
            if y is not NOT_PLANNED:
                return y
    g = _begin(g, timeout)
    h = arrays.to_host(x)
    if g.size() == 1:
        return done(x.reshape(1) if len(h.shape) == 0 else x, async_op)
    n = g.size()
    shape = (n,) if len(h.shape) == 0 else (n * h.shape[0],) + tuple(h.shape[1:])
    out, buf = arrays.output(h.name, shape, h.mlx)
    a, b = block(buf.size, n, g.rank())
    buf[a:b] = h.flat
    step = Op("all_gather", select.algorithm("all_gather", buf.nbytes, n, g.config), dst=buf, result=out)
    sig = _sig("all_gather", h.name, h.shape)
    if _plannable(x, async_op, timeout):
        g._plan(("all_gather", x.dtype, x.shape), sig, step)
    return g._run(sig, step, timeout, async_op)


def reduce_scatter(x: Any, op: str = "sum", group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Reduce `x` over all ranks and give rank r block r of axis 0.

    x.shape[0] must be divisible by the group size; the result has shape
    (x.shape[0] // size, *x.shape[1:]).
    """
    g = _begin(group, timeout)
    h = arrays.to_host(x)
    dtypes.check_reduction(h.name, op)
    n = g.size()
    if len(h.shape) == 0 or h.shape[0] % n:
        raise ValueError(f"reduce_scatter needs x.shape[0] divisible by the group size {n}; x has shape {h.shape}")
    if n == 1:
        return done(x, async_op)
    shape = (h.shape[0] // n,) + tuple(h.shape[1:])
    out, obuf = arrays.output(h.name, shape, h.mlx)
    step = Op("reduce_scatter", select.algorithm("reduce_scatter", h.flat.nbytes, n, g.config), h.flat, obuf,
              h.name, op, result=out)
    return g._run(_sig("reduce_scatter", op, h.name, h.shape), step, timeout, async_op)


def broadcast(x: Any, root: int = 0, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Every rank gets root's `x` (x's shape and dtype must agree on every rank)."""
    g = lifecycle.resolve(group)
    if type(x) is np.ndarray and not async_op and timeout is None:  # a repeated call: planned
        plan = g._plans.get(("broadcast", x.dtype, x.shape, root))
        if plan is not None and x.flags.c_contiguous:
            mine = g.rank() == root
            out = x if mine else np.empty(x.shape, x.dtype)
            y = g._planned(plan, x if mine else None, None if mine else out, out)
            if y is not NOT_PLANNED:
                return y
    g = _begin(g, timeout)
    _check_rank(root, g, "root")
    h = arrays.to_host(x)
    n = g.size()
    if n == 1:
        return done(x, async_op)
    if g.rank() == root:
        out, buf = x, h.flat
    else:
        out, buf = arrays.output(h.name, h.shape, h.mlx)
    step = Op("broadcast", select.algorithm("broadcast", buf.nbytes, n, g.config), dst=buf, root=root,
              result=out)
    sig = _sig("broadcast", root, h.name, h.shape)
    if _plannable(x, async_op, timeout):
        g._plan(("broadcast", x.dtype, x.shape, root), sig, step)
    return g._run(sig, step, timeout, async_op)


def barrier(group: Group | None = None, timeout: float | None = None) -> None:
    """Return once every rank of the group has called barrier()."""
    g = _begin(group, timeout)
    if g.size() > 1:
        g._run("barrier()", Op("barrier"), timeout)


def send(x: Any, dst: int, group: Group | None = None, timeout: float | None = None, async_op: bool = False) -> Any:
    """Send `x` to rank `dst`, which must call recv() with the same shape and dtype.

    With async_op (or isend) it returns a Work at once; keep `x` unchanged until its wait().
    Ordering (docs/design.md, Point to point): a rank's sends, receives and collectives run one
    at a time in its call order, and a send completes once its bytes have left this rank."""
    g = _begin(group, timeout)
    _check_rank(dst, g, "dst", self_ok=False)
    h = arrays.to_host(x)
    sig = _sig("send", g.rank(), dst, h.name, h.shape)
    return g._run(sig, Op("send", src=h.flat, root=dst), timeout, async_op, p2p=("send", dst))


def recv(shape: Any, dtype: Any, src: int, group: Group | None = None, timeout: float | None = None,
         async_op: bool = False) -> Any:
    """Receive an array of `shape` and `dtype` sent by rank `src` with send().

    An MLX dtype (mx.float32) gives an mx.array; a numpy dtype gives a numpy.ndarray. With
    async_op (or irecv), a Work whose wait() returns it.
    """
    g = _begin(group, timeout)
    _check_rank(src, g, "src", self_ok=False)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"recv shape {shape} has a negative dimension")
    name, mlx = _dtype_name(dtype)
    out, buf = arrays.output(name, shape, mlx)
    sig = _sig("send", src, g.rank(), name, shape)
    return g._run(sig, Op("recv", dst=buf, root=src, result=out), timeout, async_op, p2p=("recv", src))


def isend(x: Any, dst: int, group: Group | None = None, timeout: float | None = None) -> Any:
    """send(x, dst, async_op=True): a Work; keep `x` unchanged until its wait() returns."""
    return send(x, dst, group, timeout, async_op=True)


def irecv(shape: Any, dtype: Any, src: int, group: Group | None = None, timeout: float | None = None) -> Any:
    """recv(shape, dtype, src, async_op=True): a Work whose wait() returns the array."""
    return recv(shape, dtype, src, group, timeout, async_op=True)


def _dtype_name(dtype: Any) -> tuple[str, bool]:
    if arrays.mx is not None and isinstance(dtype, arrays.mx.Dtype):
        return arrays.mx_name(dtype), True
    try:
        return dtypes.name_of_numpy(np.dtype(dtype)), False
    except TypeError as e:
        raise TypeError(f"recv dtype {dtype!r}: {e}") from None


def _plannable(x: Any, async_op: bool, timeout: Any, mlx: bool = False) -> bool:
    """Whether a call with x may be planned (Group._plan): a synchronous call of a contiguous
    numpy array of native byte order (or, with `mlx`, of an mx.array), with the default time limit."""
    if async_op or timeout is not None:
        return False
    return (mlx and type(x) is arrays.MX_ARRAY) or (type(x) is np.ndarray and x.flags.c_contiguous and x.dtype.isnative)


def _begin(group: Any, timeout: Any, drain: bool = True) -> Group:
    """The group a call runs on, ready: not broken or finalized, `timeout` valid, and (with
    `drain`) no gated result left to hold the service queue ahead of this call. One call, not
    four: every small collective passes here."""
    g = lifecycle.resolve(group)
    g.check()
    if timeout is not None:
        check_timeout(timeout, "timeout")
    if drain and g._job.gate is not None:
        g._drain_gate()
    return g


def _check_rank(r: Any, g: Group, what: str, self_ok: bool = True) -> None:
    if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or not 0 <= r < g.size():
        raise ValueError(f"{what}={r!r} is not a rank of this group (0..{g.size() - 1})")
    if not self_ok and r == g.rank():
        raise ValueError(f"{what}={r} is this rank itself")
