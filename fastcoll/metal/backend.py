"""Open the fence gate's device side on MLX's Metal backend, or say why it cannot be.

Where Metal is present but `coherent(system)` (behind `#pragma METAL internals`) is not, the
kernels fail to compile; the self-test then fails and the host path is used, as the seed does.
"""

from __future__ import annotations

import logging

from fastcoll.gate.layout import ControlLayout
from fastcoll.gate.mlx_backend import MlxBackend, verified
from fastcoll.metal import kernels

log = logging.getLogger("fastcoll.gate")


def open_backend(layout: ControlLayout, run_self_test: bool = True) -> MlxBackend | None:
    """A working Metal backend, or None (logged) where Metal, the pragma or the page are unavailable."""
    reason = kernels.unavailable()
    if reason is not None:
        log.debug("no Metal fence gate: %s", reason)
        return None
    # Apple GPUs share memory with the CPU: the page needs no advice.
    backend = MlxBackend(kernels, layout)
    return verified(backend, "Metal", run_self_test)
