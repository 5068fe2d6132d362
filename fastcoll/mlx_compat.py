"""Run code written against `mx.distributed` on fastcoll, without changing it.

    from fastcoll import mlx_compat

    mlx_compat.install()        # mx.distributed.init, all_sum, ... now go through fastcoll
    group = mx.distributed.init()
    model.shard(group)          # mlx-lm, mlx.nn.shard_linear, nn.average_gradients: unchanged
    mlx_compat.uninstall()      # MLX's own functions are back

    with mlx_compat.patched():  # the same, for a block
        ...

    python -m fastcoll.mlx_compat train.py ARGS         # run a script, or a module (-m), with
    python -m fastcoll.mlx_compat -m mlx_lm.generate ARGS  # the patch installed first

How the patch reaches MLX's code: mlx.nn's sharded layers (`AllToShardedLinear`,
`ShardedToAllLinear`, `shard_linear`), `mlx.nn.average_gradients` and mlx-lm's models look the
functions up as attributes of the `mlx.core.distributed` module each time they call them
(`mx.distributed.all_sum(x, group=...)`), so `install()` replaces those attributes. Code that
copied a function out before `install()` (`from mlx.core.distributed import all_sum`) keeps
MLX's own. `mx.distributed.Group` (the class) is left alone: the groups handed out here are
`mlx_compat.Group`, with the same `rank()`, `size()` and `split(color, key=-1)`.

Semantics follow mx.distributed (its docstrings, and its ring backend where they are silent):
the same keyword-only `group=` and `stream=` arguments; a Python or numpy scalar is made an
array as MLX makes it (`all_sum(1)` is an int32 array); on a group of one every collective
returns its input and send/recv raise ValueError; bool arrays reduce as MLX's backends do
(sum and max: or, min: and); complex64 max/min order lexicographically as `mx.maximum` does;
`sum_scatter` works on every group (MLX's ring backend refuses it, NCCL's defines it);
`init(backend=...)` accepts MLX's backend names and "fastcoll", and every one of them means
fastcoll while installed. Gradients flow as through MLX's primitives: the vjp of
all_sum/all_max/all_min passes the cotangent through, all_gather's slices out this rank's
block, sum_scatter's all-gathers the cotangent.

Laziness: MLX's collectives are lazy graph nodes that run when the result is evaluated. These
run when they are called: fastcoll's host path evaluates the input, exchanges it, and returns an
evaluated array (with FASTCOLL_FAST_SYNC=1 on a GPU the fence gate returns a lazy one instead).
Results are the same; the difference shows in timing (a collective waits for its input to be
computed) and in two places where MLX evaluation is not allowed: inside `mx.compile` and
`mx.vmap` these functions raise a RuntimeError that says so. `send` sends at once and returns
its input.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Iterator

import mlx.core as mx

import fastcoll
from fastcoll.group import Group as _FastcollGroup

__all__ = [
    "Group", "install", "uninstall", "installed", "patched",
    "init", "is_available", "all_sum", "all_max", "all_min", "all_gather", "sum_scatter",
    "send", "recv", "recv_like",
]

# The names install() replaces in mlx.core.distributed.
PATCHED = (
    "init", "is_available", "all_sum", "all_max", "all_min", "all_gather", "sum_scatter",
    "send", "recv", "recv_like",
)
BACKENDS = ("any", "fastcoll", "ring", "mpi", "nccl", "jaccl")

_MLX_GROUP = mx.distributed.Group  # MLX's own class, for groups made before install()
_saved: dict[str, Any] | None = None
_install_lock = threading.Lock()


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
        shares this group's connections (see fastcoll.subgroup). As in MLX, a group of one
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


# --------------------------------------------------------------------------- the functions


def init(strict: bool = False, backend: str = "any", *, all_gather_factory: Any = None) -> Group:
    """Initialize fastcoll (fastcoll.init()) and return the global group.

    Every backend name MLX knows ("any", "ring", "mpi", "nccl", "jaccl") and "fastcoll" mean
    fastcoll here. With nothing in the environment this is a group of one, unless `strict`,
    which then raises RuntimeError as MLX does. `all_gather_factory` (JACCL only) is ignored.
    """
    if backend not in BACKENDS:
        raise ValueError(
            "[distributed] The only valid values for backend are "
            f"{', '.join(repr(b) for b in BACKENDS)} but {backend!r} was provided."
        )
    group = fastcoll.init()
    if strict and group.size() == 1 and group.config.launcher == "none":
        raise RuntimeError(
            "[distributed] Couldn't initialize any backend: fastcoll found no job in the "
            "environment (FASTCOLL_RANK/FASTCOLL_WORLD_SIZE or another launcher's ranks)"
        )
    return _wrap(group)


def is_available(backend: str = "any") -> bool:
    """True for every backend name init() accepts: fastcoll stands behind each of them."""
    return backend in BACKENDS


def _resolve(group: Any) -> _FastcollGroup | None:
    """The fastcoll group to use, or None for one of MLX's own groups of one."""
    if group is None:
        return fastcoll.init()
    if isinstance(group, Group):
        return group._group
    if isinstance(group, _FastcollGroup):
        return group
    if isinstance(group, _MLX_GROUP):
        if group.size() == 1:
            return None
        raise TypeError(
            "this group was made by MLX's own mx.distributed.init() before "
            "fastcoll.mlx_compat.install(); make it again after install()"
        )
    raise TypeError(f"group must be a Group or None, not {type(group).__name__}")


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


_TRACING = "function transformations"


def _eager(fn, *args, **kwargs):
    """Run a fastcoll collective; explain the error MLX gives for evaluation while tracing."""
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, ValueError) as e:
        if _TRACING in str(e):
            raise RuntimeError(
                "fastcoll.mlx_compat: collectives run eagerly (they evaluate their input), which "
                "MLX forbids inside mx.compile and mx.vmap; call them outside the compiled or "
                f"vmapped function ({e})"
            ) from e
        raise


def _host_reduce(x: mx.array, op: str, g: _FastcollGroup) -> mx.array:
    if x.dtype == mx.bool_:
        # MLX's backends reduce bools as logical or (sum, max) and and (min).
        y = _eager(fastcoll.all_reduce, x.astype(mx.uint8), op="min" if op == "min" else "max", group=g)
        return y.astype(mx.bool_)
    if x.dtype == mx.complex64 and op in ("max", "min"):
        # fastcoll has no order on complex numbers; MLX's mx.maximum orders lexicographically.
        parts = _eager(fastcoll.all_gather, mx.expand_dims(x, 0), group=g)
        pick = mx.maximum if op == "max" else mx.minimum
        acc = parts[0]
        for i in range(1, g.size()):
            acc = pick(acc, parts[i])
        return acc
    return _eager(fastcoll.all_reduce, x, op=op, group=g)


_functions: dict[tuple, Any] = {}


def _differentiable(kind: str, g: _FastcollGroup) -> Any:
    """A cached mx.custom_function running collective `kind` on g, with MLX's vjp for it."""
    fn = _functions.get((kind, g))
    if fn is not None:
        return fn
    if kind in ("sum", "max", "min"):

        @mx.custom_function
        def fn(x):
            return _host_reduce(x, kind, g)

        @fn.vjp
        def fn(primals, cotangent, output):
            return cotangent  # as MLX's AllReduce::vjp

        if kind == "sum":

            @fn.jvp
            def fn(primals, tangent):
                return _differentiable("sum", g)(tangent)

    elif kind == "gather":

        @mx.custom_function
        def fn(x):
            return _eager(fastcoll.all_gather, x, group=g)

        @fn.vjp
        def fn(primals, cotangent, output):
            r = g.rank()
            if primals.ndim == 0:
                return cotangent[r]
            n = primals.shape[0]
            return cotangent[r * n : (r + 1) * n]

        @fn.jvp
        def fn(primals, tangent):
            return _differentiable("gather", g)(tangent)

    elif kind == "scatter":

        @mx.custom_function
        def fn(x):
            if x.dtype == mx.bool_:
                y = _eager(fastcoll.reduce_scatter, x.astype(mx.uint8), op="max", group=g)
                return y.astype(mx.bool_)
            return _eager(fastcoll.reduce_scatter, x, op="sum", group=g)

        @fn.vjp
        def fn(primals, cotangent, output):
            return _differentiable("gather", g)(cotangent)

        @fn.jvp
        def fn(primals, tangent):
            return _differentiable("scatter", g)(tangent)

    else:
        raise ValueError(kind)
    _functions[(kind, g)] = fn
    return fn


def all_sum(x: Any, *, group: Any = None, stream: Any = None) -> mx.array:
    """All reduce sum: the sum of the ``x`` arrays from all processes in the group.

    Args:
      x (array): Input array (a scalar is made an array as MLX does).
      group (Group): The group of processes; ``None`` for the global group.
      stream (Stream, optional): Accepted for compatibility; the exchange runs on the host.

    Returns:
      array: The sum of all ``x`` arrays. Unlike MLX's, it is computed now (eagerly), not when
      the result is evaluated.
    """
    return _reduce("sum", x, group, "all_sum")


def all_max(x: Any, *, group: Any = None, stream: Any = None) -> mx.array:
    """All reduce max: the element-wise maximum of ``x`` over the group (computed eagerly)."""
    return _reduce("max", x, group, "all_max")


def all_min(x: Any, *, group: Any = None, stream: Any = None) -> mx.array:
    """All reduce min: the element-wise minimum of ``x`` over the group (computed eagerly)."""
    return _reduce("min", x, group, "all_min")


def _reduce(op: str, x: Any, group: Any, name: str) -> mx.array:
    x = _as_array(x, name)
    g = _resolve(group)
    if _single(g):
        return x
    return _differentiable(op, g)(x)


def all_gather(x: Any, *, group: Any = None, stream: Any = None) -> mx.array:
    """Gather ``x`` from all processes and concatenate along the first axis (computed eagerly).

    A scalar becomes a vector of one element per process; on a group of one ``x`` comes back
    unchanged, as in MLX.
    """
    x = _as_array(x, "all_gather")
    g = _resolve(group)
    if _single(g):
        return x
    return _differentiable("gather", g)(x)


def sum_scatter(x: Any, *, group: Any = None, stream: Any = None) -> mx.array:
    """Sum ``x`` over the group and give rank r block r of the first axis (computed eagerly).

    ``x.shape[0]`` must be divisible by the group size; the result has shape
    ``[x.shape[0] // group.size(), *x.shape[1:]]``.
    """
    x = _as_array(x, "sum_scatter")
    g = _resolve(group)
    if _single(g):
        return x
    return _differentiable("scatter", g)(x)


def send(x: Any, dst: int, *, group: Any = None, stream: Any = None) -> mx.array:
    """Send ``x`` to rank ``dst`` of the group now, and return ``x``.

    MLX's send is lazy (it happens when the returned array is evaluated); this one has happened
    when it returns (the bytes have left this process), so keep the order of sends and receives
    the same on both sides, as MLX's blocking backends need anyway.
    """
    x = _as_array(x, "send")
    g = _resolve(group)
    if _single(g):
        raise ValueError("Cannot send to a singleton group")
    _eager(fastcoll.send, x, dst, group=g)
    return x


def recv(shape: Any, dtype: Any, src: int, *, group: Any = None, stream: Any = None) -> mx.array:
    """Receive an array of ``shape`` and ``dtype`` from rank ``src`` (computed eagerly)."""
    g = _resolve(group)
    if _single(g):
        raise ValueError("Cannot recv from a singleton group")
    if not isinstance(dtype, mx.Dtype):
        raise TypeError(f"recv dtype must be an mlx.core.Dtype, not {type(dtype).__name__}")
    return _eager(fastcoll.recv, tuple(shape), dtype, src, group=g)


def recv_like(x: Any, src: int, *, group: Any = None, stream: Any = None) -> mx.array:
    """Receive an array shaped and typed like ``x`` from rank ``src`` (computed eagerly)."""
    x = _as_array(x, "recv_like")
    g = _resolve(group)
    if _single(g):
        raise ValueError("Cannot recv from a singleton group")
    return _eager(fastcoll.recv, tuple(x.shape), x.dtype, src, group=g)


# --------------------------------------------------------------------------- install


def install() -> None:
    """Route mx.distributed's functions to fastcoll (idempotent)."""
    global _saved
    with _install_lock:
        if _saved is not None:
            return
        module = mx.distributed
        _saved = {name: getattr(module, name) for name in PATCHED}
        here = globals()
        for name in PATCHED:
            setattr(module, name, here[name])


def uninstall() -> None:
    """Put MLX's own functions back (a no-op when not installed)."""
    global _saved
    with _install_lock:
        if _saved is None:
            return
        for name, fn in _saved.items():
            setattr(mx.distributed, name, fn)
        _saved = None


def installed() -> bool:
    """True while mx.distributed's functions are fastcoll's."""
    return _saved is not None


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """install() for the duration of a with-block; restores the previous state after it."""
    was = installed()
    install()
    try:
        yield
    finally:
        if not was:
            uninstall()


def run_main(argv: list[str]) -> None:
    """`python -m fastcoll.mlx_compat [-m MODULE | SCRIPT] ARGS`: install(), then run it."""
    import runpy
    import sys

    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print("usage: python -m fastcoll.mlx_compat (-m MODULE | SCRIPT) [ARGS...]\n"
              "Runs the program with mx.distributed routed to fastcoll.", file=sys.stderr)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    import sys as _sys

    from fastcoll import mlx_compat as _installed  # the module everyone else imports

    _installed.run_main(_sys.argv[1:])
