"""Between the caller's arrays (mx.array or numpy.ndarray) and flat host buffers.

An evaluated mx.array has a writable zero-copy numpy view, so results are written straight into
a fresh mx.array's memory; the only copy on the host path is the one that makes the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fastcoll import dtypes

try:
    import mlx.core as mx
except ImportError:  # fastcoll still moves numpy arrays without MLX
    mx = None


MX_ARRAY: Any = mx.array if mx is not None else None  # for `type(x) is MX_ARRAY`
# The largest mx.array a repeated call plans: its result is copied into a fresh mx.array, which
# costs more than the plan saves from here on (output() writes a large one in place).
MX_PLAN_BYTES = 256 * 1024
# What fastcoll calls the caller's dtypes, by dtype object: a lookup is cheaper than dtype.name.
_BY_NUMPY = {dtypes.host_dtype(name): name for name in dtypes.names() if name != "bfloat16"}
MLX_NAMES = {} if mx is None else {
    getattr(mx, "bool_" if name == "bool" else name): name for name in dtypes.names()
    if hasattr(mx, "bool_" if name == "bool" else name)}


def is_mlx(x: Any) -> bool:
    """True for an mx.array."""
    return mx is not None and isinstance(x, mx.array)


def mx_result(out: np.ndarray, dtype: Any) -> Any:
    """A fresh mx.array of `dtype` holding `out` (a copy; bfloat16 from its uint16 bits)."""
    if dtype == mx.bfloat16:
        return mx.array(out, dtype=mx.uint16).view(mx.bfloat16)
    return mx.array(out, dtype=dtype)


@dataclass
class Host:
    """A caller's array as the host sees it: dtype name, shape and a flat contiguous view."""

    name: str
    shape: tuple[int, ...]
    flat: np.ndarray
    mlx: bool


def name_of_numpy(dtype: np.dtype) -> str:
    """The fastcoll name of a numpy dtype; TypeError for one fastcoll cannot move."""
    name = _BY_NUMPY.get(dtype)
    if name is None:
        dtype = np.dtype(dtype)
        name = _BY_NUMPY.get(dtype.newbyteorder("="))
        if name is None:
            raise TypeError(f"fastcoll does not support numpy dtype {dtype}")
    return name


def name_of_mlx(dtype: Any) -> str:
    """'float32' for mx.float32; TypeError for an MLX dtype fastcoll does not move."""
    name = MLX_NAMES.get(dtype)
    if name is None:
        raise TypeError(f"fastcoll does not support MLX dtype {str(dtype).rsplit('.', 1)[-1]}")
    return name


def name_of(x: Any) -> str:
    """x's dtype name, without evaluating or copying x; TypeError for anything but an array."""
    if isinstance(x, np.ndarray):
        return name_of_numpy(x.dtype)
    if is_mlx(x):
        return name_of_mlx(x.dtype)
    raise TypeError(f"expected an mx.array or a numpy.ndarray, got {type(x).__name__}")


def to_host(x: Any) -> Host:
    """Evaluate `x` if it is lazy and view it as a flat host buffer (copying only if strided)."""
    if isinstance(x, np.ndarray):
        name = name_of_numpy(x.dtype)
        if x.flags.c_contiguous and x.dtype.isnative:  # the usual case, without a copy's checks
            return Host(name, x.shape, x.reshape(-1), False)
        native = x.dtype.newbyteorder("=")
        flat = np.ascontiguousarray(x, dtype=native).reshape(-1)
        return Host(name, x.shape, flat, False)
    if is_mlx(x):
        name = name_of_mlx(x.dtype)
        if name == "bfloat16":
            x = x.view(mx.uint16)
        mx.eval(x)
        view = np.array(x, copy=False)
        return Host(name, tuple(x.shape), np.ascontiguousarray(view).reshape(-1), True)
    raise TypeError(f"expected an mx.array or a numpy.ndarray, got {type(x).__name__}")


# A small result is copied from an uninitialised numpy buffer, because evaluating mx.zeros costs
# more in MLX's scheduling than the copy; a large one is mx.zeros, which writes and never copies.
_MX_ZEROS_BYTES = 256 * 1024


def output(name: str, shape: tuple[int, ...], mlx: bool,
           empty: Callable[[tuple[int, ...], np.dtype], np.ndarray] = np.empty) -> tuple[Any, np.ndarray]:
    """A fresh result array of the caller's kind and a writable flat host view of its memory;
    `empty(shape, dtype)` makes a numpy one (Group.empty: large ones over the engine's memory)."""
    host = dtypes.host_dtype(name)
    if not mlx:
        out = empty(shape, host)
        return out, out.reshape(-1)
    mx_dtype = getattr(mx, "bool_" if name == "bool" else host.name)
    if math.prod(shape) * host.itemsize <= _MX_ZEROS_BYTES:
        # dtype= matters: mx.array() of a float64 numpy array is float32 otherwise.
        arr = mx.array(np.empty(shape, dtype=host), dtype=mx_dtype)
    else:
        arr = mx.zeros(shape, dtype=mx_dtype)
        mx.eval(arr)
    flat = np.array(arr, copy=False).reshape(-1)
    if name == "bfloat16":
        arr = arr.view(mx.bfloat16)
    return arr, flat
