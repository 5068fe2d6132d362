"""The one place that knows the GPU backends: which exist, in which order they are tried, and
how one is opened. Nothing else in the host half imports a backend.

A backend is a package (fastcoll/metal/, fastcoll/cuda/) with LANGUAGE, THREAD_INDEX, X_SPACES,
TYPES (each gated dtype's name in the language), prelude(), x_space(size), make_kernel(...),
unavailable(), advise_page(page) and share_host_memory(ptr, nbytes); the kernels themselves are
the shared body in fastcoll/gate/kernels.py over the backend's prelude.
"""

from __future__ import annotations

import importlib
import logging

from fastcoll.gate.layout import ControlLayout
from fastcoll.gate.mlx_backend import MlxBackend, verified

log = logging.getLogger("fastcoll.gate")

# Tried in this order; the first that passes its self-test is used.
BACKENDS = {"metal": "fastcoll.metal", "cuda": "fastcoll.cuda"}


def language(name: str):
    """The backend package for `name` ('metal' or 'cuda')."""
    return importlib.import_module(BACKENDS[name])


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
