"""install(): route mx.distributed's functions to fastcoll; uninstall() puts MLX's back.

mlx.nn's sharded layers (`AllToShardedLinear`, `ShardedToAllLinear`, `shard_linear`),
`mlx.nn.average_gradients` and mlx-lm's models look the functions up as attributes of the
`mlx.core.distributed` module each time they call them (`mx.distributed.all_sum(x, group=...)`),
so replacing those attributes reaches them. Code that copied a function out before `install()`
(`from mlx.core.distributed import all_sum`) keeps MLX's own. `mx.distributed.Group` (the
class) stays MLX's: the groups handed out are `mlx_compat.Group`, or in graph mode MLX's own, whose
class gets a `fastcoll_group` property and a `split` that notes which fastcoll group each split
stands for (fastcoll/mlx_compat/graph.py); uninstall() takes both off. MLX's grad, value_and_grad,
vmap, vjp and jvp are wrapped too, so that a collective knows whether it is being differentiated
(fastcoll/mlx_compat/tracing.py).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import mlx.core as mx

from fastcoll.mlx_compat import api, graph, tracing

# The names install() replaces in mlx.core.distributed.
PATCHED = (
    "init", "is_available", "all_sum", "all_max", "all_min", "all_gather", "sum_scatter",
    "send", "recv", "recv_like",
)

_saved: dict[str, Any] | None = None  # MLX's own functions while installed
_GROUP_SPLIT = mx.distributed.Group.split  # MLX's own, which install() wraps
_install_lock = threading.Lock()


def install() -> None:
    """Route mx.distributed's functions to fastcoll (idempotent)."""
    global _saved
    with _install_lock:
        if _saved is not None:
            return
        module = mx.distributed
        _saved = {name: getattr(module, name) for name in PATCHED}
        for name in PATCHED:
            setattr(module, name, getattr(api, name))
        module.Group.fastcoll_group = property(api.fastcoll_group, doc=api.fastcoll_group.__doc__)
        module.Group.split = _split
        tracing.install()


def uninstall() -> None:
    """Put MLX's own functions back (a no-op when not installed)."""
    global _saved
    with _install_lock:
        if _saved is None:
            return
        for name, fn in _saved.items():
            setattr(mx.distributed, name, fn)
        mx.distributed.Group.split = _GROUP_SPLIT
        del mx.distributed.Group.fastcoll_group
        tracing.uninstall()
        _saved = None


def _split(self: Any, color: int, key: int = -1) -> Any:
    """Split the group to subgroups based on the provided color (MLX's Group.split, whose
    MPI_Comm_split is fastcoll's Group.split in graph mode: its errors are fastcoll's)."""
    return graph.split_group(_GROUP_SPLIT, self, color, key)


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
