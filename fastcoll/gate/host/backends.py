"""The one place that knows the GPU backends: which exist, in which order they are tried, and
how one is opened (its self-test run, and the fall-back to the host path said aloud). Nothing
else in the host half imports a backend.

A backend is a package (fastcoll/metal/, fastcoll/cuda/) whose LANGUAGE (fastcoll/gpu/language.py)
says what differs between the GPU languages; the kernels themselves are the shared body in
fastcoll/gate/device/ over the language's prelude, run through MLX by fastcoll/gate/device/mlx_backend.py.
"""

from __future__ import annotations

import logging
import warnings
from typing import Callable

from fastcoll.gate.protocol.layout import ControlLayout
from fastcoll.gpu.language import Language
from fastcoll.gate.device.mlx_backend import MlxBackend, self_test

log = logging.getLogger("fastcoll.gate")


def _metal() -> Language:
    from fastcoll import metal

    return metal.LANGUAGE


def _cuda() -> Language:
    from fastcoll import cuda

    return cuda.LANGUAGE


# Tried in this order; the first that passes its self-test is used.
BACKENDS: dict[str, Callable[[], Language]] = {"metal": _metal, "cuda": _cuda}


def language(name: str) -> Language:
    """The GPU language of backend `name` ('metal' or 'cuda')."""
    return BACKENDS[name]()


def open_backend(name: str, layout: ControlLayout, run_self_test: bool = True) -> MlxBackend | None:
    """A working device side on backend `name`, or None (logged) where its GPU, kernels or page
    are unavailable or it fails its self-test."""
    lang = language(name)
    reason = lang.unavailable()
    if reason is not None:
        log.debug("no %s fence gate: %s", name, reason)
        return None
    backend = MlxBackend(lang, layout, advise=lang.advise_page)
    return verified(backend, name, run_self_test)


def verified(backend: MlxBackend, name: str, run_self_test: bool = True) -> MlxBackend | None:
    """`backend` if it passes its self-test (or the test is skipped), else None, closed and
    reported, so that the caller falls back to the host path."""
    if run_self_test:
        problem = self_test(backend)
        if problem is not None:
            backend.close()
            fell_back(f"the {name} fence gate failed its self-test, so the host path is used: {problem}")
            return None
    return backend


def fell_back(why: str) -> None:
    """Say that a GPU was there but its gate cannot run: in the log, and as a RuntimeWarning,
    which Python shows even where nobody configured logging (the job asked for the gate with
    FASTCOLL_FAST_SYNC=1, and gets the slower host path)."""
    log.warning("%s", why)
    warnings.warn(f"fastcoll: {why}", RuntimeWarning, stacklevel=2)
