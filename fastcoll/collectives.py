"""The public collectives: check the call, pick the algorithm, run it on the service thread.

Every check that can fail on bad input (dtype, op, shape, root) runs in the caller's thread
before any byte is sent, so a bad call raises TypeError/ValueError and leaves the group usable.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from fastcoll import arrays, dtypes
from fastcoll.algorithms import Call, blocks, direct, doubling, ring
from fastcoll.group import MAX_PIECE_BYTES, Group
from fastcoll.service import Work

# Crossover between the direct (one hop) and the ring algorithms, and the ring's piece size,
# measured with `python bench/crossover.py [--world 4]` (2-core Linux box, TCP on localhost,
# median us per all-reduce, direct / ring). Two ranks: 4 KiB 51/93, 256 KiB 219/445,
# 1 MiB 1051/1967, 4 MiB 4542/4836 -- direct wins up to megabytes, since with two ranks both
# move the same bytes and the ring adds a step. Four ranks: 64 KiB 686/1361, 256 KiB
# 1691/1724, 512 KiB 2816/3081, 1 MiB 5494/4263 -- direct sends (n-1)x the data and loses past
# ~512 KiB. Ring pieces, 64 MiB: 256 KiB 56.6 ms, 1 MiB 47.4 ms, 4 MiB 53.6 ms (bench/NOTES.md).
DIRECT_MAX_BYTES = 256 * 1024  # any world size (average_gradients' buckets rely on this bound)
DIRECT_MAX_BYTES_TWO_RANKS = 1 << 20
PIECE_BYTES = 1 << 20


def _direct(nbytes: int, world: int) -> bool:
    """Whether a collective of `nbytes` (the whole buffer) takes the direct algorithm."""
    return nbytes <= (DIRECT_MAX_BYTES_TWO_RANKS if world == 2 else DIRECT_MAX_BYTES)


def _small(world: int):
    """The small-message algorithm family for `world` ranks: recursive doubling where it applies
    (fewer messages), else the direct exchange."""
    return doubling if doubling.applies(world) else direct


_default: Group | None = None


def set_default_group(group: Group | None) -> None:
    """Make `group` the one collectives use when they are given none (init() does this)."""
    global _default
    _default = group


def default_group() -> Group | None:
    """The group init() made, or None before init()."""
    return _default


def _group(group: Group | None) -> Group:
    if group is not None:
        if not isinstance(group, Group):
            raise TypeError(f"group must be a fastcoll Group, not {type(group).__name__}")
        return group
    if _default is None:
        from fastcoll import init

        return init()
    return _default


def _pieces(itemsize: int) -> int:
    return max(1, min(PIECE_BYTES, MAX_PIECE_BYTES) // max(1, itemsize))


def _done(result: Any, async_op: bool) -> Any:
    """What a collective that needs no communication returns."""
    if not async_op:
        return result
    work = Work()
    work._finish(result)
    return work


@functools.lru_cache(maxsize=1024)  # a training loop repeats a handful of signatures
def _sig(kind: str, *parts: Any) -> str:
    """'all_reduce(sum,float32,(4, 8))': what every rank must agree on, sent in each header."""
    return kind + "(" + ",".join(map(str, parts)) + ")"


def _drain_gate(g: Group) -> None:
    # A gated result nobody has evaluated yet would hold the service queue (which sub-groups
    # share with their root): evaluate it first.
    gate = g.root.gate
    if gate is not None and gate.pending():
        gate.drain()


def reduce_flat(call: Call, src: np.ndarray, buf: np.ndarray, name: str, op: str) -> None:
    """buf = the all-reduce of src (two flat host buffers), on the service thread.
    Also the gate's exchange."""
    combine = call.traced(dtypes.reducer(name, op))
    if _direct(src.nbytes, call.t.size):
        _small(call.t.size).all_reduce(call, src, buf, combine)
    else:
        ring.all_reduce(call, src, buf, combine, _pieces(buf.itemsize))
    if op == "mean":
        dtypes.finish_mean(name, buf, call.t.size)


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
    g = _group(group)
    g.check()
    # A world of one has nothing to exchange; the gate would only add its fixed costs.
    if g.gate is not None and g.size() > 1 and arrays.is_mlx(x) and g.gate.accepts(x, op):
        return _gated_all_reduce(g, x, op, async_op, timeout)
    _drain_gate(g)
    h = arrays.to_host(x)
    dtypes.check_reduction(h.name, op)
    if g.size() == 1:
        return _done(x, async_op)
    out, buf = arrays.output(h.name, h.shape, h.mlx)

    def body(call: Call) -> Any:
        reduce_flat(call, h.flat, buf, h.name, op)
        return out

    return g.run(_sig("all_reduce", op, h.name, h.shape), body, timeout, async_op)


def _gated_all_reduce(g: Group, x: Any, op: str, async_op: bool, timeout: float | None) -> Any:
    name = arrays._mx_name(x.dtype)
    dtypes.check_reduction(name, op)
    sig = _sig("all_reduce", op, name, tuple(x.shape))
    current: dict[str, Call] = {}

    def exchange(send: np.ndarray) -> np.ndarray:
        call = current["call"]
        # The GPU arrives when the caller evaluates, which may be long after the job started:
        # the timeout is for waiting on peers, so it starts now.
        call.deadline = time.monotonic() + (g.config.timeout if timeout is None else float(timeout))
        flat = send.reshape(-1)
        buf = np.empty_like(flat)
        reduce_flat(call, flat, buf, name, op)
        return buf

    def submit(fn):
        def body(call: Call) -> Any:
            current["call"] = call
            return fn()

        return g.run(sig, body, timeout, async_op=True)

    y = g.gate.all_reduce(x, op, exchange, submit)
    return _done(y, async_op)


def all_gather(x: Any, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Concatenate every rank's `x` along axis 0, in rank order (scalars become a vector).

    Returns an array of shape (size * x.shape[0], *x.shape[1:]), or (size,) for a scalar.
    """
    g = _group(group)
    g.check()
    _drain_gate(g)
    h = arrays.to_host(x)
    if g.size() == 1:
        return _done(x.reshape(1) if len(h.shape) == 0 else x, async_op)
    n = g.size()
    shape = (n,) if len(h.shape) == 0 else (n * h.shape[0],) + tuple(h.shape[1:])
    out, buf = arrays.output(h.name, shape, h.mlx)
    bounds = blocks(buf.size, n)
    a, b = bounds[g.rank()]
    buf[a:b] = h.flat

    def body(call: Call) -> Any:
        if _direct(buf.nbytes, call.t.size):
            _small(call.t.size).all_gather(call, buf, bounds)
        else:
            ring.all_gather(call, buf, bounds, _pieces(buf.itemsize))
        return out

    return g.run(_sig("all_gather", h.name, h.shape), body, timeout, async_op)


def reduce_scatter(x: Any, op: str = "sum", group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Reduce `x` over all ranks and give rank r block r of axis 0.

    x.shape[0] must be divisible by the group size; the result has shape
    (x.shape[0] // size, *x.shape[1:]).
    """
    g = _group(group)
    g.check()
    _drain_gate(g)
    h = arrays.to_host(x)
    dtypes.check_reduction(h.name, op)
    n = g.size()
    if len(h.shape) == 0 or h.shape[0] % n:
        raise ValueError(f"reduce_scatter needs x.shape[0] divisible by the group size {n}; x has shape {h.shape}")
    if n == 1:
        return _done(x, async_op)
    shape = (h.shape[0] // n,) + tuple(h.shape[1:])
    bounds = blocks(h.flat.size, n)
    out, obuf = arrays.output(h.name, shape, h.mlx)

    def body(call: Call) -> Any:
        combine = call.traced(dtypes.reducer(h.name, op))
        if _direct(h.flat.nbytes, call.t.size):
            mine = _small(call.t.size).reduce_scatter(call, h.flat, bounds, combine)
        else:
            mine = ring.reduce_scatter(call, h.flat, bounds, combine, _pieces(h.flat.itemsize))
        obuf[...] = mine
        if op == "mean":
            dtypes.finish_mean(h.name, obuf, n)
        return out

    return g.run(_sig("reduce_scatter", op, h.name, h.shape), body, timeout, async_op)


def broadcast(x: Any, root: int = 0, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Every rank gets root's `x` (x's shape and dtype must agree on every rank)."""
    g = _group(group)
    g.check()
    _check_rank(root, g, "root")
    _drain_gate(g)
    h = arrays.to_host(x)
    if g.size() == 1:
        return _done(x, async_op)
    if g.rank() == root:
        out, buf = x, h.flat
    else:
        out, buf = arrays.output(h.name, h.shape, h.mlx)

    def body(call: Call) -> Any:
        if _direct(buf.nbytes, call.t.size):
            direct.broadcast(call, buf, root)
        else:
            ring.broadcast(call, buf, root, _pieces(buf.itemsize))
        return out

    return g.run(_sig("broadcast", root, h.name, h.shape), body, timeout, async_op)


def barrier(group: Group | None = None, timeout: float | None = None) -> None:
    """Return once every rank of the group has called barrier()."""
    g = _group(group)
    g.check()
    _drain_gate(g)
    if g.size() > 1:
        g.run("barrier()", direct.barrier, timeout)


def send(x: Any, dst: int, group: Group | None = None, timeout: float | None = None) -> None:
    """Send `x` to rank `dst`, which must call recv() with the same shape and dtype."""
    g = _group(group)
    g.check()
    _check_rank(dst, g, "dst", self_ok=False)
    _drain_gate(g)
    h = arrays.to_host(x)
    sig = _sig("send", g.rank(), dst, h.name, h.shape)

    def body(call: Call) -> None:
        for i, (a, b) in enumerate(_p2p_pieces(h.flat)):
            call.send(dst, i, h.flat[a:b])
        call.flush()

    g.run(sig, body, timeout, p2p=("send", dst))


def recv(shape: Any, dtype: Any, src: int, group: Group | None = None, timeout: float | None = None) -> Any:
    """Receive an array of `shape` and `dtype` sent by rank `src` with send().

    An MLX dtype (mx.float32) gives an mx.array; a numpy dtype gives a numpy.ndarray.
    """
    g = _group(group)
    g.check()
    _check_rank(src, g, "src", self_ok=False)
    _drain_gate(g)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"recv shape {shape} has a negative dimension")
    name, mlx = _dtype_name(dtype)
    out, buf = arrays.output(name, shape, mlx)
    sig = _sig("send", src, g.rank(), name, shape)

    def body(call: Call) -> Any:
        for i, (a, b) in enumerate(_p2p_pieces(buf)):
            call.recv(src, i, buf[a:b])
        return out

    return g.run(sig, body, timeout, p2p=("recv", src))


def _p2p_pieces(flat: np.ndarray) -> list[tuple[int, int]]:
    step = _pieces(flat.itemsize)
    return [(a, min(a + step, flat.size)) for a in range(0, flat.size, step)] or [(0, 0)]


def _dtype_name(dtype: Any) -> tuple[str, bool]:
    if arrays.mx is not None and isinstance(dtype, arrays.mx.Dtype):
        return arrays._mx_name(dtype), True
    try:
        return dtypes.name_of_numpy(np.dtype(dtype)), False
    except TypeError as e:
        raise TypeError(f"recv dtype {dtype!r}: {e}") from None


def _check_rank(r: Any, g: Group, what: str, self_ok: bool = True) -> None:
    if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or not 0 <= r < g.size():
        raise ValueError(f"{what}={r!r} is not a rank of this group (0..{g.size() - 1})")
    if not self_ok and r == g.rank():
        raise ValueError(f"{what}={r} is this rank itself")
