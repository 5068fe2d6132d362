"""Dtypes and reduction ops: what may be reduced, and how, on host buffers.

Buffers on the wire are raw little-endian bytes of the array's own dtype. bfloat16, which numpy
lacks, travels and is stored as uint16 bits; to reduce it the bits are widened to float32, reduced,
and rounded back to nearest-even.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

# name -> the numpy dtype that holds it on the host. The order is the dtype's code in the native
# engine (fastcoll/engine/csrc/reduce/fc_tables.h, generated from this table).
_HOST = {
    "bool": np.dtype(np.bool_),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "complex64": np.dtype(np.complex64),
}
_FLOATS = ("float16", "bfloat16", "float32", "float64")
_NUMBERS = frozenset(_HOST) - {"bool"}


@dataclass(frozen=True)
class Reduction:
    """One reduction op, as every engine and the gate read it."""

    ufunc: np.ufunc  # out = ufunc(a, b) on the host: the Python engine's reducer, numpy's rounding
    dtypes: frozenset  # the dtype names it reduces
    refusal: str  # why it refuses another dtype (but bool, which nothing reduces): {op}, {name}
    gate: bool  # the GPU gate implements it (fastcoll/gate/device/gate.h); else the gate refuses it


# The ops, one entry each: the one table that fastcoll/engine/csrc/reduce/fc_tables.h (the
# native engine's codes and names, by `python -m fastcoll.engine.tables`) and the gate's op codes
# (fastcoll/gate/protocol/layout.py) are made from. The order is the op's code. docs/design.md,
# "Adding a reduction op", says what else a new one needs.
REDUCTIONS = {
    "sum": Reduction(np.add, _NUMBERS, "", gate=True),
    "prod": Reduction(np.multiply, _NUMBERS, "", gate=True),
    "min": Reduction(np.minimum, _NUMBERS - {"complex64"},
                     "{name} has no order, so op={op!r} is undefined; use sum or mean", gate=True),
    "max": Reduction(np.maximum, _NUMBERS - {"complex64"},
                     "{name} has no order, so op={op!r} is undefined; use sum or mean", gate=True),
    # A sum, divided by the world size once at the end (finish_mean).
    "mean": Reduction(np.add, frozenset(_FLOATS) | {"complex64"},
                      "op={op!r} needs a floating or complex dtype, not {name}; use sum", gate=True),
}
OPS = tuple(REDUCTIONS)


def names() -> tuple[str, ...]:
    """Every dtype name fastcoll moves."""
    return tuple(_HOST)


def host_dtype(name: str) -> np.dtype:
    """The numpy dtype that holds dtype `name` on the host (uint16 bits for bfloat16)."""
    return _HOST[name]


def check_reduction(name: str, op: str) -> None:
    """Raise before any byte moves when `op` is not a reduction of dtype `name`."""
    if op not in REDUCTIONS:
        raise ValueError(f"unknown reduction op {op!r}; expected one of {', '.join(OPS)}")
    if name == "bool":
        raise TypeError("bool arrays cannot be reduced; all_gather and broadcast accept them")
    if name not in REDUCTIONS[op].dtypes:
        raise TypeError(REDUCTIONS[op].refusal.format(op=op, name=name) or f"op={op!r} does not reduce {name}")


Combine = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def reducer(name: str, op: str) -> Combine:
    """combine(a, b, out): out = a op b, element-wise, all of dtype `name` (out may be a)."""
    ufunc = REDUCTIONS[op].ufunc
    if name != "bfloat16":
        return lambda a, b, out: ufunc(a, b, out=out)

    def combine_bf16(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        out[...] = float32_to_bf16(ufunc(bf16_to_float32(a), bf16_to_float32(b)))

    return combine_bf16


def finish_mean(name: str, out: np.ndarray, world_size: int) -> None:
    """Divide a sum by the world size in place, rounding as the dtype does."""
    if name == "bfloat16":
        out[...] = float32_to_bf16(bf16_to_float32(out) / np.float32(world_size))
    else:
        np.divide(out, out.dtype.type(world_size), out=out)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bits -> float32 values (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values -> uint16 bfloat16 bits, rounded to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)
