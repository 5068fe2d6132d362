"""Run code written against `mx.distributed` on fastcoll, without changing it.

    from fastcoll import mlx_compat

    mlx_compat.install()        # mx.distributed.init, all_sum, ... now go through fastcoll
    group = mx.distributed.init()
    model.shard(group)          # mlx-lm, mlx.nn.shard_linear, nn.average_gradients: unchanged
    mlx_compat.uninstall()      # MLX's own functions are back

    with mlx_compat.patched():  # the same, for a block
        ...

    python -m fastcoll.mlx_compat train.py ARGS          # run a script, or a module (-m), with
    python -m fastcoll.mlx_compat -m mlx_lm server ARGS  # the patch installed first

One job a module: `patch` (install, uninstall, patched: how MLX's functions are replaced),
`api` (the functions and Group, with MLX's signatures and semantics), `autograd` (the
collectives as differentiable graph functions), `runner` (`python -m fastcoll.mlx_compat`),
`graph` (graph mode, the default where it can run: MLX's own lazy collectives over fastcoll's
MPI library, run inside MLX's graph; FASTCOLL_MLX_GRAPH=0 chooses the eager path).

Laziness: MLX's collectives are lazy graph nodes that run when the result is evaluated, and so
are graph mode's. On the eager path these run when they are called: fastcoll's host path
evaluates the input, exchanges it, and returns an evaluated array (with FASTCOLL_FAST_SYNC=1 on
a GPU the fence gate returns a lazy one instead).
Results are the same; the difference shows in timing (a collective waits for its input to be
computed) and in two places where MLX evaluation is not allowed: inside `mx.compile` and
`mx.vmap` these functions raise a RuntimeError that says so. `send` sends at once and returns
its input.
"""

from __future__ import annotations

from fastcoll.mlx_compat.api import (
    BACKENDS,
    Group,
    all_gather,
    all_max,
    all_min,
    all_sum,
    init,
    is_available,
    recv,
    recv_like,
    send,
    sum_scatter,
)
from fastcoll.mlx_compat.patch import PATCHED, install, installed, patched, uninstall
from fastcoll.mlx_compat.runner import run_main

Group.__module__ = __name__  # its public name is fastcoll.mlx_compat.Group

__all__ = [
    "Group", "install", "uninstall", "installed", "patched",
    "init", "is_available", "all_sum", "all_max", "all_min", "all_gather", "sum_scatter",
    "send", "recv", "recv_like", "run_main", "PATCHED", "BACKENDS",
]
