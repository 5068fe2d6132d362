"""Between the caller's arrays (mx.array or numpy.ndarray) and flat host buffers.

An evaluated mx.array has a writable zero-copy numpy view, so results are written straight into
a fresh mx.array's memory; the only copy on the host path is the one that makes the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastcoll import dtypes

try:
    import mlx.core as mx
except ImportError:  # fastcoll still moves numpy arrays without MLX
    mx = None


def is_mlx(x: Any) -> bool:
    """True for an mx.array."""
    return mx is not None and isinstance(x, mx.array)


@dataclass
class Host:
    """A caller's array as the host sees it: dtype name, shape and a flat contiguous view."""

    name: str
    shape: tuple[int, ...]
    flat: np.ndarray
    mlx: bool


def _mx_name(dtype) -> str:
    name = str(dtype).rsplit(".", 1)[-1]
    if name not in dtypes.names():
        raise TypeError(f"fastcoll does not support MLX dtype {name}")
    return name


def to_host(x: Any) -> Host:
    """Evaluate `x` if it is lazy and view it as a flat host buffer (copying only if strided)."""
    if isinstance(x, np.ndarray):
        name = dtypes.name_of_numpy(x.dtype)
        native = x.dtype.newbyteorder("=")
        flat = np.ascontiguousarray(x, dtype=native).reshape(-1)
        return Host(name, x.shape, flat, False)
    if is_mlx(x):
        name = _mx_name(x.dtype)
        if name == "bfloat16":
            x = x.view(mx.uint16)
        mx.eval(x)
        view = np.array(x, copy=False)
        return Host(name, tuple(x.shape), np.ascontiguousarray(view).reshape(-1), True)
    raise TypeError(f"expected an mx.array or a numpy.ndarray, got {type(x).__name__}")


def dtype_of(name: str, mlx: bool) -> Any:
    """The dtype object the caller uses for `name`."""
    if mlx:
        return getattr(mx, "bool_" if name == "bool" else name)
    if name == "bfloat16":
        raise TypeError("numpy has no bfloat16; pass an mx.array")
    return dtypes.host_dtype(name)


def output(name: str, shape: tuple[int, ...], mlx: bool, init: np.ndarray | None = None) -> tuple[Any, np.ndarray]:
    """A fresh result array and a writable flat host view of it, filled from `init` if given."""
    host = dtypes.host_dtype(name)
    if not mlx:
        out = np.empty(shape, dtype=host)
        flat = out.reshape(-1)
        if init is not None:
            flat[...] = init
        return out, flat
    if init is not None:
        arr = mx.array(np.asarray(init, dtype=host).reshape(shape))
    else:
        arr = mx.zeros(shape, dtype=getattr(mx, "bool_" if name == "bool" else host.name))
    mx.eval(arr)
    flat = np.array(arr, copy=False).reshape(-1)
    if name == "bfloat16":
        arr = arr.view(mx.bfloat16)
    return arr, flat


def from_host(flat: np.ndarray, name: str, shape: tuple[int, ...], mlx: bool) -> Any:
    """Wrap a finished host buffer as the caller's array type (a copy for MLX)."""
    if not mlx:
        return flat.reshape(shape)
    arr = mx.array(flat.reshape(shape))
    return arr.view(mx.bfloat16) if name == "bfloat16" else arr
