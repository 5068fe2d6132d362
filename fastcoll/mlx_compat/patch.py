"""install(): route mx.distributed's functions to fastcoll; uninstall() puts MLX's back.

mlx.nn's sharded layers (`AllToShardedLinear`, `ShardedToAllLinear`, `shard_linear`),
`mlx.nn.average_gradients` and mlx-lm's models look the functions up as attributes of the
`mlx.core.distributed` module each time they call them (`mx.distributed.all_sum(x, group=...)`),
so replacing those attributes reaches them. Code that copied a function out before `install()`
(`from mlx.core.distributed import all_sum`) keeps MLX's own. `mx.distributed.Group` (the
class) is left alone: the groups handed out are `mlx_compat.Group`. MLX's grad, value_and_grad,
vmap, vjp and jvp are wrapped too, so that a collective knows whether it is being differentiated
(fastcoll/mlx_compat/tracing.py).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import mlx.core as mx

from fastcoll.mlx_compat import api, tracing

# The names install() replaces in mlx.core.distributed.
PATCHED = (
    "init", "is_available", "all_sum", "all_max", "all_min", "all_gather", "sum_scatter",
    "send", "recv", "recv_like",
)

_saved: dict[str, Any] | None = None  # MLX's own functions while installed
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
        tracing.install()


def uninstall() -> None:
    """Put MLX's own functions back (a no-op when not installed)."""
    global _saved
    with _install_lock:
        if _saved is None:
            return
        for name, fn in _saved.items():
            setattr(mx.distributed, name, fn)
        tracing.uninstall()
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
