"""MLX's graph runs fastcoll's collectives (graph mode, the default; docs/mlx.md, Graph mode).

On the eager path (FASTCOLL_MLX_GRAPH=0, or where graph mode cannot run) mlx_compat's
collectives run when they are called: each evaluates its input, hands it to fastcoll and hands
back an array. In graph mode they are MLX's own lazy collectives of its MPI backend, over
fastcoll's MPI library (fastcoll/mlx_compat/csrc/): MLX runs each where it stands in the graph,
on its evaluation thread, and fastcoll's engine moves the bytes without Python.
`init()` here splits the job's group into one for the graph alone (the engine numbers its calls
without Python), opens the engine's table of it, attaches the library, points MLX_MPI_LIBNAME at
it and returns MLX's `mx.distributed.init(backend="mpi")`.

Order. MLX runs each stream's work on a thread of its own, so collectives of two streams would
reach the engine in an order of chance, which ranks need not share. So every collective made
through mlx_compat goes on its Python thread's one stream (`stream()`, whatever the program
asked for), which runs them in the program's order; an eager call of fastcoll's own first waits
for them (`before_eager`, which the job calls). Two threads' calls at once the library catches.

Splits. MLX's Group.split asks MPI_Comm_split, which the library answers with fastcoll's own
Group.split (`_split`, called from C on the program's thread); the sub-groups' collectives stay
in MLX's graph (the library runs them over the table's messages). `fastcoll_group(group)` is the
fastcoll group an MLX group of the graph stands for. A failure on the wire ends the process after
one line on stderr, as MPI's default error handler ends the job: MLX's graph cannot raise it.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import re
import threading
import warnings
from typing import Any

import mlx.core as mx
import numpy as np

import fastcoll
from fastcoll.engine import NATIVE_TRANSPORTS, native_available
from fastcoll.group import Group as FastcollGroup

log = logging.getLogger("fastcoll")

# MLX's own functions, taken when this module is first imported (before install() patches them).
MLX = {name: getattr(mx.distributed, name) for name in ("init", "is_available", "all_sum", "all_max", "all_min",
                                                         "all_gather", "send", "recv", "recv_like")}
LIBNAME = "MLX_MPI_LIBNAME"
LEAST_MLX = (0, 29, 4)  # the first MLX whose MPI backend loads the library LIBNAME names

# The open graph: (MLX's group, the fastcoll group it stands for, the table, the library, the split
# callback, which must live as long as the library may call it).
_open: tuple[Any, FastcollGroup, Any, Any, Any] | None = None
_refused = False  # graph mode could not open: later init()s take the eager path at once
_STREAM: Any = None  # every Python thread's stream for its collectives (one stream a thread)
_thread = threading.local()  # .used: this thread made graph collectives; .made, .error: _split's
_by_handle: dict[int, FastcollGroup] = {}  # a communicator of the library -> its fastcoll group
# id(MLX's group) -> (that group, kept so that its id stays its own; its fastcoll group)
_by_object: dict[int, tuple[Any, FastcollGroup]] = {}
_SPLIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_int32), ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                             ctypes.c_void_p, ctypes.c_int)


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


def mlx_too_old(version: str) -> bool:
    """True for an MLX version before LEAST_MLX ("0.29.3"; not "0.29.4" nor "0.30.0.dev20251201"),
    and for one that names no version (it cannot be told to load fastcoll's library)."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return found is None or tuple(int(n) for n in found.groups()) < LEAST_MLX


def problem_here(config: Any) -> str | None:
    """Why graph mode cannot run on this rank, as far as this rank knows before it joins the job
    (None: nothing here stops it; open_graph asks MLX and the other ranks too). The default
    (FASTCOLL_MLX_GRAPH unset) also leaves FASTCOLL_FAST_SYNC=1's fence gate to the eager path,
    which runs it: MLX's own collectives would never reach the gate."""
    if config.fast_sync and not config.mlx_graph_set:
        return "FASTCOLL_FAST_SYNC=1 asks for the fence gate, which the eager path runs"
    if not config.native:
        return "the pure-Python engine runs (FASTCOLL_NATIVE=0)"
    if config.transport not in NATIVE_TRANSPORTS:
        return f"FASTCOLL_TRANSPORT={config.transport} runs the pure-Python engine"
    why = native_available()
    if why is not None:
        return f"the native engine is unavailable: {why}"
    if library() is None:
        return "fastcoll's MPI library for MLX was not built (install with a C compiler)"
    version = getattr(mx, "__version__", "")
    if mlx_too_old(version):
        return (f"this MLX ({version or 'no version'}) is older than {'.'.join(map(str, LEAST_MLX))}, "
                f"whose MPI backend does not read {LIBNAME}")
    return None


def _mpi_backend(path: str) -> str | None:
    """Point MLX's MPI backend at fastcoll's library (LIBNAME); why it cannot load it, if so."""
    os.environ[LIBNAME] = path
    if MLX["is_available"]("mpi"):
        return None
    return (f"MLX's MPI backend did not load {path} (an MLX built without that backend, or one that "
            f"looked for an MPI library before fastcoll.mlx_compat set {LIBNAME})")


def _why_not(group: FastcollGroup, why: str | None, table: Any) -> str | None:
    """Why graph mode cannot run on this rank or another (None: it can, on every rank); `why`:
    this rank's own reason, if it has one."""
    if why is None and table is None:
        why = "the pure-Python engine runs (not every rank can run the native one)"
    # Every rank takes the graph, or none does: a host without the library must not leave its
    # peers waiting inside MLX's graph for calls it makes eagerly.
    every = fastcoll.all_reduce(np.array([why is None], np.int32), op="min", group=group)
    if why is None and not every[0]:
        why = "another rank cannot run it (its log says why)"
    return why


def open_graph(group: FastcollGroup, here: str | None) -> Any | None:
    """MLX's group whose collectives fastcoll runs inside MLX's graph, for the job's `group`; None
    where graph mode cannot run (`here`: problem_here's reason on this rank, or None), and the
    eager collectives then serve. Every rank must call it."""
    global _open, _refused, _STREAM
    if _open is not None or _refused:
        return _open[0] if _open is not None else None
    path, before = library(), os.environ.get(LIBNAME)
    sub = group.split(0)  # a group of the graph's own: the engine numbers its calls without Python
    table = None
    if here is None:  # problem_here found the library: MLX's MPI backend must load it
        here = _mpi_backend(path)
        table = sub.graph_table() if here is None else None
    why = _why_not(group, here, table)
    if why is not None:
        _refuse(why, group.config.mlx_graph_set, before)
        return None
    if sub.members() != list(range(group.size())):  # the library maps splits' ranks onto the table's
        raise RuntimeError(f"graph mode needs the job's group, not a group of ranks {sub.members()}")
    lib = ctypes.CDLL(path)
    lib.fastcoll_mpi_attach.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _SPLIT_FN]
    names = "".join(f"{name}\n" for name in sub.rank_names()).encode()
    callback = _SPLIT_FN(_split)
    if lib.fastcoll_mpi_attach(_capsule_pointer(table), names, callback) != 0:
        raise RuntimeError(f"{path} was built from other sources than this fastcoll (reinstall it)")
    mlx_group = MLX["init"](strict=True, backend="mpi")
    if (mlx_group.rank(), mlx_group.size()) != (sub.rank(), sub.size()):
        raise RuntimeError(
            f"MLX's MPI backend is rank {mlx_group.rank()} of {mlx_group.size()}, not fastcoll's "
            f"{sub.rank()} of {sub.size()}: MLX loaded another MPI library before {LIBNAME} was set, "
            "or this MLX is older than 0.29.4, which does not read it")
    # One stream a thread (MLX 0.31.2 made streams thread-local); before it, one for every thread.
    _STREAM = mx.new_thread_local_stream(mx.cpu) if hasattr(mx, "new_thread_local_stream") else mx.new_stream(mx.cpu)
    _by_handle[ctypes.addressof(ctypes.c_int.in_dll(lib, "ompi_mpi_comm_world"))] = group
    _by_object[id(mlx_group)] = (mlx_group, group)
    _open = (mlx_group, group, table, lib, callback)
    group.set_before_call(before_eager)
    log.info("MLX's graph runs fastcoll's collectives (%s)", path)
    return mlx_group


def _refuse(why: str, asked: bool, libname: str | None) -> None:
    """Graph mode will not run: said as a warning where FASTCOLL_MLX_GRAPH=1 asked for it (even
    where logging is not configured), as a log line where it was the default; LIBNAME as it was."""
    global _refused
    _refused = True
    if libname is None:
        os.environ.pop(LIBNAME, None)
    else:
        os.environ[LIBNAME] = libname
    if asked:
        message = f"FASTCOLL_MLX_GRAPH=1: {why}; collectives run eagerly instead"
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)
    else:
        log.info("collectives run eagerly, not in MLX's graph (graph mode, the default): %s", why)


def stream() -> Any:
    """The stream for a collective that the calling thread makes in MLX's graph (its own)."""
    _thread.used = True
    return _STREAM


def before_eager() -> None:
    """Wait until this thread's graph collectives have run (the job calls it before an eager
    call): the eager call then comes after them on every rank, as the program made them."""
    if getattr(_thread, "used", False):
        mx.synchronize(_STREAM)


def _split(parent: int, color: int, key: int, child: int, ranks: Any, most: int, rank: Any, name: int,
           name_max: int) -> int:
    """MPI_Comm_split's answer (mpi_sub.c): fastcoll's Group.split of the parent's group."""
    try:
        sub = _by_handle[parent].split(color, key)
        members, prefix = sub.members(), sub.prefix().encode()
        if len(members) > most or len(prefix) >= name_max:
            raise RuntimeError(f"a split of {len(members)} ranks named {prefix!r} does not fit the library's")
        for i, m in enumerate(members):
            ranks[i] = m
        rank[0] = sub.rank()
        ctypes.memmove(name, prefix + b"\0", len(prefix) + 1)
        _by_handle[child] = sub
        _thread.made = sub
        return len(members)
    except BaseException as e:  # raised again by split_group, on this thread: C cannot carry it
        _thread.error = e
        return -1


def split_group(split: Any, group: Any, color: int, key: int = -1) -> Any:
    """MLX's Group.split (`split`) of `group`, raising fastcoll's own error where its split failed,
    and noting the fastcoll group of the result."""
    _thread.made = _thread.error = None
    try:
        child = split(group, color, key)
    except RuntimeError:
        error, _thread.error = _thread.error, None
        if error is not None:
            raise error from None
        raise
    made, _thread.made = _thread.made, None
    if made is not None:
        _by_object[id(child)] = (child, made)
    return child


def carries(group: Any) -> bool:
    """True where MLX's own collective should run for `group` (graph mode is open and `group` is
    None, for the default group, or MLX's group)."""
    return _open is not None and (group is None or isinstance(group, mx.distributed.Group))


def fastcoll_group(group: Any) -> FastcollGroup | None:
    """The fastcoll group an MLX group of the open graph stands for (None for any other)."""
    if _open is None or not isinstance(group, mx.distributed.Group):
        return None
    known = _by_object.get(id(group))
    if known is not None and known[0] is group:
        return known[1]
    # the job's group as MLX hands it out again (mx.distributed.init() of MLX's own, say)
    return _open[1] if group.size() == _open[1].size() and group.rank() == _open[1].rank() else None
