"""MLX's graph runs fastcoll's collectives (FASTCOLL_MLX_GRAPH=1).

By default mlx_compat's collectives run when they are called: each evaluates its input, hands it
to fastcoll and hands back an array, two trips between Python and MLX's evaluation thread a call.
In graph mode they are MLX's own lazy collectives of its MPI backend instead, and the MPI library
underneath is fastcoll's (fastcoll/mlx_compat/csrc/mpi_abi.c): MLX evaluates a collective where
it stands in the graph, on its evaluation thread, and fastcoll's engine moves the bytes there,
without Python.

`init()` here: split the job's group into one for the graph alone (the engine numbers its calls
without Python), open the engine's table of it, attach the library to the table, point
MLX_MPI_LIBNAME at the library, and return MLX's `mx.distributed.init(backend="mpi")`.

What differs from the default (docs/mlx.md, Graph mode):
- a failure on the wire ends the process with status 1 after one line on stderr naming the lost
  peer, as MPI's default error handler ends the job: MLX's graph cannot raise it to Python;
- the group cannot be split (MLX's MPI backend asks MPI_Comm_split, which the library refuses);
- sum_scatter, which MLX's MPI backend lacks, runs eagerly through fastcoll as by default.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import warnings
from typing import Any

import mlx.core as mx
import numpy as np

import fastcoll
from fastcoll.group import Group as FastcollGroup

log = logging.getLogger("fastcoll")

# MLX's own functions, taken when this module is first imported (before install() patches them).
MLX = {name: getattr(mx.distributed, name) for name in ("init", "all_sum", "all_max", "all_min", "all_gather",
                                                         "send", "recv", "recv_like")}
LIBNAME = "MLX_MPI_LIBNAME"

# The open graph: (MLX's group, the fastcoll group it stands for, the table, the library).
_open: tuple[Any, FastcollGroup, Any, Any] | None = None
_refused = False  # graph mode could not open: later init()s take the eager path at once


def library() -> str | None:
    """The path of fastcoll's MPI library for MLX, or None where it was not built."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_mpi_abi*.so")) + glob.glob(os.path.join(here, "_mpi_abi*.dylib")))
    return found[0] if found else None


def _capsule_pointer(capsule: Any) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, b"fastcoll.graph_api")


def open_graph(group: FastcollGroup) -> Any | None:
    """MLX's group whose collectives fastcoll runs inside MLX's graph, for the job's `group`; None
    (after a warning that says why) where graph mode cannot run, and the eager collectives then
    serve. Every rank must call it."""
    global _open, _refused
    if _open is not None or _refused:
        return _open[0] if _open is not None else None
    path = library()
    why = None if path else "fastcoll's MPI library for MLX was not built (install with a C compiler)"
    sub = group.split(0)  # a group of the graph's own: the engine numbers its calls without Python
    table = sub.graph_table()
    if why is None and table is None:
        why = "the pure-Python engine runs (FASTCOLL_NATIVE=0, or no compiler)"
    # Every rank takes the graph, or none does: a host without the library must not leave its
    # peers waiting inside MLX's graph for calls it makes eagerly.
    every = fastcoll.all_reduce(np.array([why is None], np.int32), op="min", group=group)
    if why is None and not every[0]:
        why = "another rank cannot run it (its log says why)"
    if why is not None:  # said even where logging is not configured: the user asked for graph mode
        message = f"FASTCOLL_MLX_GRAPH=1: {why}; collectives run eagerly instead"
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        _refused = True
        return None
    lib = ctypes.CDLL(path)
    lib.fastcoll_mpi_attach.argtypes = [ctypes.c_void_p]
    if lib.fastcoll_mpi_attach(_capsule_pointer(table)) != 0:
        raise RuntimeError(f"{path} was built from other sources than this fastcoll (reinstall it)")
    os.environ[LIBNAME] = path
    mlx_group = MLX["init"](strict=True, backend="mpi")
    if (mlx_group.rank(), mlx_group.size()) != (sub.rank(), sub.size()):
        raise RuntimeError(
            f"MLX's MPI backend is rank {mlx_group.rank()} of {mlx_group.size()}, not fastcoll's "
            f"{sub.rank()} of {sub.size()}: MLX loaded another MPI library before {LIBNAME} was set, "
            "or this MLX is older than 0.29.4, which does not read it")
    _open = (mlx_group, group, table, lib)
    log.info("MLX's graph runs fastcoll's collectives (%s)", path)
    return mlx_group


def carries(group: Any) -> bool:
    """True where MLX's own collective should run for `group` (graph mode is open and `group` is
    None, for the default group, or MLX's group)."""
    return _open is not None and (group is None or isinstance(group, mx.distributed.Group))


def fastcoll_group(group: Any) -> FastcollGroup | None:
    """The fastcoll group an MLX group of the open graph stands for (None for any other)."""
    if _open is not None and isinstance(group, mx.distributed.Group) and group.size() == _open[1].size():
        return _open[1]
    return None
