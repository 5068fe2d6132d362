"""The sizes of the uneven collectives (all_to_all_v, all_gather_v, the object collectives):
checked as the caller gives them, bounded as peers report them, cut into element bounds.

A size a peer reports is checked against MAX_UNEVEN_BYTES before anything is allocated, so a
peer can never make this rank allocate what it cannot hold.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from fastcoll.errors import MismatchError

# The most an uneven collective may receive on one rank, in bytes.
MAX_UNEVEN_BYTES = 1 << 36  # 64 GiB


def row_items(shape: tuple[int, ...]) -> int:
    """The items of one row of an array of `shape` (its first axis cut off)."""
    return math.prod(shape[1:])


def cut(counts: Sequence[int], row: int) -> list[tuple[int, int]]:
    """Element bounds of consecutive blocks of counts[i] rows of `row` items each."""
    out, start = [], 0
    for c in counts:
        out.append((start, start + c * row))
        start += c * row
    return out


def counts(values: Any, n: int, what: str) -> list[int]:
    """`values` (a sequence of ints, or a 1-d integer array) as n non-negative ints; TypeError
    or ValueError naming `what` otherwise."""
    if hasattr(values, "dtype") and hasattr(values, "shape"):  # an mx.array or numpy array
        a = np.asarray(values)
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{what} must be a 1-d integer array or a sequence of ints, not {a.dtype} {a.shape}")
        values = a.tolist()
    try:
        out = [int(c) for c in values]
        ok = all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in values)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a sequence of {n} ints, not {type(values).__name__}") from None
    if not ok:
        raise TypeError(f"{what} must hold ints, got {list(values)!r}")
    if len(out) != n:
        raise ValueError(f"{what} has {len(out)} entries; the group has {n} ranks")
    if any(c < 0 for c in out):
        raise ValueError(f"{what} {out} has a negative entry")
    return out


def check_bound(name: str, rows: int, row: int, itemsize: int) -> None:
    """MismatchError if receiving `rows` rows would pass MAX_UNEVEN_BYTES on this rank."""
    if rows * row * itemsize > MAX_UNEVEN_BYTES:
        raise MismatchError(
            f"{name}: the sizes the ranks reported add up to {rows * row * itemsize} bytes on "
            f"this rank, over fastcoll.collectives.uneven.MAX_UNEVEN_BYTES ({MAX_UNEVEN_BYTES})")
