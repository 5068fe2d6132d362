"""Open the fence gate's device side on MLX's CUDA backend, or say why it cannot be."""

from __future__ import annotations

import logging

from fastcoll.cuda import kernels
from fastcoll.cuda.advise import advise_towards_host
from fastcoll.gate.layout import ControlLayout
from fastcoll.gate.mlx_backend import MlxBackend, verified

log = logging.getLogger("fastcoll.gate")


def open_backend(layout: ControlLayout, run_self_test: bool = True) -> MlxBackend | None:
    """A working CUDA backend, or None (logged) where CUDA, the kernels or the page are unavailable."""
    reason = kernels.unavailable()
    if reason is not None:
        log.debug("no CUDA fence gate: %s", reason)
        return None
    import mlx.core as mx

    # MLX runs on CUDA device 0 of those visible (CUDA_VISIBLE_DEVICES picks which GPU that is).
    ordinal = getattr(mx.default_device(), "index", 0) or 0
    backend = MlxBackend(kernels, layout, advise=lambda page: advise_towards_host(page, ordinal))
    return verified(backend, "CUDA", run_self_test)
