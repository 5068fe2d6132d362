"""mx.distributed's functions and Group over fastcoll, with MLX's signatures and semantics.

Semantics follow mx.distributed (its docstrings, and its ring backend where they are silent):
the same keyword-only `group=` and `stream=` arguments; a Python or numpy scalar is made an
array as MLX makes it (`all_sum(1)` is an int32 array); on a group of one every collective
returns its input and send/recv raise ValueError; bool arrays reduce as MLX's backends do
(sum and max: or, min: and); complex64 max/min order lexicographically as `mx.maximum` does;
`sum_scatter` works on every group (MLX's ring backend refuses it, NCCL's defines it);
`init(backend=...)` accepts MLX's backend names and "fastcoll", and every one of them means
fastcoll while installed.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import mlx.core as mx

import fastcoll
from fastcoll import config, lifecycle
from fastcoll.collectives import gated_all_reduce
from fastcoll.group import Group as _FastcollGroup
from fastcoll.mlx_compat import graph, tracing
from fastcoll.mlx_compat.autograd import differentiable, eager

BACKENDS = ("any", "fastcoll", "ring", "mpi", "nccl", "jaccl")

_MLX_GROUP = mx.distributed.Group  # MLX's own class, for groups made before install()


class Group:
    """mx.distributed.Group's interface over a fastcoll group: rank(), size(), split()."""

    __slots__ = ("_group", "__weakref__")

    def __init__(self, group: _FastcollGroup):
        if not isinstance(group, _FastcollGroup):
            raise TypeError(f"expected a fastcoll Group, not {type(group).__name__}")
        self._group = group

    @property
    def fastcoll_group(self) -> _FastcollGroup:
        """The fastcoll group underneath (pass it to fastcoll.all_reduce and friends)."""
        return self._group

    def rank(self) -> int:
        """Get the rank of this process"""
        return self._group.rank()

    def size(self) -> int:
        """Get the size of the group"""
        return self._group.size()

    def split(self, color: int, key: int = -1) -> "Group":
        """Split the group to subgroups based on the provided color.

        Processes that use the same color go to the same group. The ``key`` argument defines the
        rank in the new group: the smaller the key the smaller the rank; a negative key uses the
        rank in the current group. Every process of the group must call it. The sub-group
        shares this group's connections (see fastcoll.group). As in MLX, a group of one
        cannot be split.
        """
        if self._group.size() == 1:
            raise RuntimeError("Cannot split the distributed group further.")
        return _wrap(self._group.split(color, key))

    def __repr__(self) -> str:
        return f"<fastcoll.mlx_compat.Group rank={self.rank()} size={self.size()}>"


_wrappers: "weakref.WeakKeyDictionary[_FastcollGroup, Group]" = weakref.WeakKeyDictionary()


def _wrap(group: _FastcollGroup) -> Group:
    # One wrapper per fastcoll group, so caches keyed on the group (mlx.nn's sum_gradients) hit.
    w = _wrappers.get(group)
    if w is None:
        w = _wrappers[group] = Group(group)
    return w


def init(strict: bool = False, backend: str = "any", *, all_gather_factory: Any = None) -> Group:
    """Initialize fastcoll (fastcoll.init()) and return the global group.

    Every backend name MLX knows ("any", "ring", "mpi", "nccl", "jaccl") and "fastcoll" mean
    fastcoll here. With nothing in the environment this is a group of one, unless `strict`,
    which then raises RuntimeError as MLX does. `all_gather_factory` is checked as MLX checks it
    (TypeError unless callable, ValueError with a backend other than "jaccl"); fastcoll needs no
    side channel, so it is never called.
    """
    if all_gather_factory is not None and not callable(all_gather_factory):
        raise TypeError(
            "init(): all_gather_factory must be a callable (rank, size) -> f(src: bytes, "
            f"n_bytes: int) -> bytes, or None, not {type(all_gather_factory).__name__}")
    if backend not in BACKENDS:
        raise ValueError(
            "[distributed] The only valid values for backend are "
            f"{', '.join(repr(b) for b in BACKENDS)} but {backend!r} was provided."
        )
    if all_gather_factory is not None and backend != "jaccl":
        raise ValueError("all_gather_factory is only supported with backend='jaccl'.")
    wanted = config.Config.from_env()
    # What stops graph mode on this rank is known before it joins: its waits are then the eager
    # path's (for_mlx), though every rank still asks the others in open_graph.
    here = graph.problem_here(wanted) if wanted.mlx_graph else None
    group = fastcoll.init(config.for_mlx(dataclasses.replace(wanted, mlx_graph=wanted.mlx_graph and here is None)))
    if wanted.mlx_graph and group.size() > 1:  # MLX's graph runs the collectives (graph.py)
        mlx_group = graph.open_graph(group, here)
        if mlx_group is not None:
            return mlx_group
    if strict and group.size() == 1 and group.config.launcher == "none":
        raise RuntimeError(
            "[distributed] Couldn't initialize any backend: fastcoll found no job in the "
            "environment (FASTCOLL_RANK/FASTCOLL_WORLD_SIZE or another launcher's ranks)"
        )
    return _wrap(group)


def is_available(backend: str = "any") -> bool:
    """True for every backend name init() accepts: fastcoll stands behind each of them."""
    return backend in BACKENDS


def fastcoll_group(group: Any) -> _FastcollGroup:
    """The fastcoll group under an mx.distributed group that fastcoll made (an mlx_compat.Group,
    or in graph mode MLX's group and its splits), for fastcoll's own calls: what the groups'
    `fastcoll_group` property returns (install() gives MLX's Group class the property too)."""
    if type(group) is Group:
        return group.fastcoll_group
    mine = graph.fastcoll_group(group)
    if mine is None:
        raise AttributeError(
            f"{group!r} is not a group fastcoll made (make it with mx.distributed.init() after "
            "fastcoll.mlx_compat.install(), or split one), so it has no fastcoll_group")
    return mine


def _resolve(group: Any) -> _FastcollGroup | None:
    """The fastcoll group to use, or None for one of MLX's own groups of one."""
    if type(group) is Group:  # mlx.nn's sharded layers pass ours: a decode step asks dozens a token
        return group._group
    if isinstance(group, _MLX_GROUP):
        if group.size() == 1:
            return None
        mine = graph.fastcoll_group(group)
        if mine is not None:
            return mine
        raise TypeError(
            "this group was made by MLX's own mx.distributed.init() before "
            "fastcoll.mlx_compat.install(); make it again after install()"
        )
    return lifecycle.resolve(group)


def _as_array(x: Any, fn: str) -> mx.array:
    """Make x an array as MLX's bindings do: scalars and numpy arrays yes, lists no."""
    if isinstance(x, mx.array):
        return x
    if x is None:
        raise TypeError(f"{fn}(): incompatible function arguments: x must be an array, not None")
    if isinstance(x, (list, tuple, str, bytes, dict)):
        raise ValueError(f"Invalid type {type(x).__name__} received in array initialization.")
    return mx.array(x)


def _single(g: _FastcollGroup | None) -> bool:
    return g is None or g.size() == 1


def all_sum(x: Any, *, group: Any = None, stream: Any = None) -> mx.array:
    """All reduce sum: the sum of the ``x`` arrays from all processes in the group.

    Args:
      x (array): Input array (a scalar is made an array as MLX does).
      group (Group): The group of processes; ``None`` for the global group.
      stream (Stream, optional): Accepted for compatibility; the exchange runs on the host (in
        graph mode, on the calling thread's stream for collectives: fastcoll.mlx_compat.graph).

    Returns:
      array: The sum of all ``x`` arrays. In graph mode (the default) MLX's own lazy all_sum; on
      the eager path (FASTCOLL_MLX_GRAPH=0) it is computed now, not when the result is evaluated.
    """
    return _reduce("sum", x, group, "all_sum", stream)


def all_max(x: Any, *, group: Any = None, stream: Any = None) -> mx.array:
    """All reduce max: the element-wise maximum of ``x`` over the group (lazy or eager: see all_sum)."""
    return _reduce("max", x, group, "all_max", stream)


def all_min(x: Any, *, group: Any = None, stream: Any = None) -> mx.array:
    """All reduce min: the element-wise minimum of ``x`` over the group (lazy or eager: see all_sum)."""
    return _reduce("min", x, group, "all_min", stream)


def _reduce(op: str, x: Any, group: Any, name: str, stream: Any) -> mx.array:
    if graph.carries(group):
        return graph.MLX[name](x, group=group, stream=graph.stream())
    x = _as_array(x, name)
    g = _resolve(group)
    if _single(g):
        return x
    # Nothing differentiates it: the gate's kernel needs no custom function (the gate takes only
    # float dtypes, so host_reduce's bool and complex cases never come here).
    if tracing.untraced():
        y = gated_all_reduce(x, op, g)
        if y is not None:
            return y
    return differentiable(op, g)(x)


def all_gather(x: Any, *, group: Any = None, stream: Any = None) -> mx.array:
    """Gather ``x`` from all processes and concatenate along the first axis (lazy or eager: see all_sum).

    A scalar becomes a vector of one element per process; on a group of one ``x`` comes back
    unchanged, as in MLX.
    """
    if graph.carries(group):
        return graph.MLX["all_gather"](x, group=group, stream=graph.stream())
    x = _as_array(x, "all_gather")
    g = _resolve(group)
    if _single(g):
        return x
    return differentiable("gather", g)(x)


def sum_scatter(x: Any, *, group: Any = None, stream: Any = None) -> mx.array:
    """Sum ``x`` over the group and give rank r block r of the first axis (computed eagerly).

    ``x.shape[0]`` must be divisible by the group size; the result has shape
    ``[x.shape[0] // group.size(), *x.shape[1:]]``.
    """
    x = _as_array(x, "sum_scatter")
    g = _resolve(group)
    if _single(g):
        return x
    return differentiable("scatter", g)(x)


def send(x: Any, dst: int, *, group: Any = None, stream: Any = None) -> mx.array:
    """Send ``x`` to rank ``dst`` of the group now, and return ``x``.

    MLX's send is lazy (it happens when the returned array is evaluated); this one has happened
    when it returns (the bytes have left this process), so keep the order of sends and receives
    the same on both sides, as MLX's blocking backends need anyway.
    """
    if graph.carries(group):
        return graph.MLX["send"](x, dst, group=group, stream=graph.stream())
    x = _as_array(x, "send")
    g = _resolve(group)
    if _single(g):
        raise ValueError("Cannot send to a singleton group")
    eager(fastcoll.send, x, dst, group=g)
    return x


def recv(shape: Any, dtype: Any, src: int, *, group: Any = None, stream: Any = None) -> mx.array:
    """Receive an array of ``shape`` and ``dtype`` from rank ``src`` (lazy or eager: see all_sum)."""
    if graph.carries(group):
        return graph.MLX["recv"](shape, dtype, src, group=group, stream=graph.stream())
    g = _resolve(group)
    if _single(g):
        raise ValueError("Cannot recv from a singleton group")
    if not isinstance(dtype, mx.Dtype):
        raise TypeError(f"recv dtype must be an mlx.core.Dtype, not {type(dtype).__name__}")
    return eager(fastcoll.recv, tuple(shape), dtype, src, group=g)


def recv_like(x: Any, src: int, *, group: Any = None, stream: Any = None) -> mx.array:
    """Receive an array shaped and typed like ``x`` from rank ``src`` (lazy or eager: see all_sum)."""
    if graph.carries(group):
        return graph.MLX["recv_like"](x, src, group=group, stream=graph.stream())
    x = _as_array(x, "recv_like")
    g = _resolve(group)
    if _single(g):
        raise ValueError("Cannot recv from a singleton group")
    return eager(fastcoll.recv, tuple(x.shape), x.dtype, src, group=g)
